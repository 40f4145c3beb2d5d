"""Completes and releases gathered into batch calls (group commit).

A worker that deletes each message as its handler finishes makes one delete call
per message; SQS bills per request. ``Coalescer`` takes completes and releases as
they come (``complete(lease)`` / ``release(lease, delay)`` return a
``concurrent.futures.Future`` at once), and one flusher thread sends them with
``complete_many``/``release_many``: the calls that arrive within ``window`` of
the first one waiting go out together, in batches of up to the backend's
``max_batch``, and each future gets its own lease's result - a failed entry fails
only its own caller.

How long the first one waits: no longer than ``window``, less when the batch
fills, and not at all when the recent arrival rate says nobody else is coming
before the window ends - a lone caller does not wait out the window. So the
added latency is at most ``window`` (LeaseConfig.coalesce_window, 20 ms by
default), and at low traffic none.

``flush()`` sends what is waiting now; ``close()`` flushes and stops. A
``LeaseManager`` flushes its coalescer before it releases anything at close().
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import NamedTuple

from leasekeeper.errors import ManagerClosed
from leasekeeper.lease import Lease

log = logging.getLogger("leasekeeper.manager")

Results = list[BaseException | None]
BatchCall = Callable[[Sequence[Lease]], Results]
ReleaseCall = Callable[[Sequence[Lease], "float | None"], Results]

_RECENT = 32  # arrival times kept to estimate the rate


class _Item(NamedTuple):
    operation: str  # "complete" or "release"
    lease: Lease
    delay: float | None
    future: Future[None]
    arrived: float


class Coalescer:
    """See the module docstring. One per LeaseManager, started on first use."""

    def __init__(self, complete_many: BatchCall, release_many: ReleaseCall, window: float) -> None:
        self._complete_many = complete_many
        self._release_many = release_many
        self.window = window
        # Guards _pending, _arrivals, _flush_now, _closed, _sending and _thread.
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._pending: list[_Item] = []
        self._arrivals: deque[float] = deque(maxlen=_RECENT)
        self._flush_now = False
        self._sending = 0  # batches taken but not yet answered
        self._closed = False
        self._thread: threading.Thread | None = None

    def complete(self, lease: Lease) -> Future[None]:
        """Complete ``lease`` soon; the future's result is None or what
        ``lease.complete()`` would have raised."""
        return self._submit("complete", lease, None)

    def release(self, lease: Lease, delay: float | None = None) -> Future[None]:
        """Release ``lease`` soon (after ``delay``, or the manager's release delay)."""
        return self._submit("release", lease, delay)

    def _submit(self, operation: str, lease: Lease, delay: float | None) -> Future[None]:
        future: Future[None] = Future()
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise ManagerClosed("this LeaseManager is closed")
            self._pending.append(_Item(operation, lease, delay, future, now))
            self._arrivals.append(now)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="leasekeeper-coalescer", daemon=True
                )
                self._thread.start()
            self._wakeup.notify()
        return future

    def flush(self, timeout: float | None = None) -> None:
        """Send what is waiting now, and wait (up to ``timeout``) until it is answered."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._flush_now = True
            self._wakeup.notify()
            while self._pending or self._sending:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._wakeup.wait(left)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop taking new work."""
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._wakeup.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    # ------------------------------------------------------------------ the flusher

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._wakeup.wait()
                if not self._pending:
                    return
                self._wait_for_company()
                batch, self._pending = self._pending, []
                self._flush_now = False
                self._sending += 1
            try:
                self._send(batch)
            finally:
                with self._lock:
                    self._sending -= 1
                    self._wakeup.notify_all()

    def _wait_for_company(self) -> None:
        """Wait (lock held) until the batch fills, the window ends, a flush is
        asked for - or, at once, when nobody else is expected before the window ends."""
        deadline = self._pending[0].arrived + self.window
        while not (self._flush_now or self._closed or self._full()):
            now = time.monotonic()
            left = deadline - now
            if left <= 0 or self._expected(now, left) < 1.0:
                return
            self._wakeup.wait(left)

    def _full(self) -> bool:
        counts: dict[int, int] = {}
        for item in self._pending:
            backend = item.lease.message.backend
            counts[id(backend)] = n = counts.get(id(backend), 0) + 1
            if n >= backend.max_batch:
                return True
        return False

    def _expected(self, now: float, left: float) -> float:
        """How many more arrivals the recent rate predicts within ``left`` seconds."""
        arrivals = self._arrivals
        if len(arrivals) < 2:
            return 0.0
        span = now - arrivals[0]
        if span <= 0:
            return float(len(arrivals))
        return (len(arrivals) - 1) / span * left

    def _send(self, batch: list[_Item]) -> None:
        groups: dict[tuple[str, float | None], list[_Item]] = {}
        for item in batch:
            groups.setdefault((item.operation, item.delay), []).append(item)
        for (operation, delay), items in groups.items():
            leases = [item.lease for item in items]
            try:
                if operation == "complete":
                    results = self._complete_many(leases)
                else:
                    results = self._release_many(leases, delay)
            except Exception as exc:  # a bug: every caller of this group hears it
                log.exception("coalesced %s of %d lease(s) failed", operation, len(items))
                results = [exc] * len(items)
            for item, result in zip(items, results, strict=True):
                if result is None:
                    item.future.set_result(None)
                else:
                    item.future.set_exception(result)
