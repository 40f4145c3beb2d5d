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

``complete_then(lease, then)`` is ``complete`` for a caller that only wants to hear
the answer (a ``Worker``): ``then(error)`` is called on the flusher's thread, with
no Future made, waited on or resolved per message.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import NamedTuple

from leasekeeper.backends.contract import Backend
from leasekeeper.errors import ManagerClosed
from leasekeeper.lease import Lease

log = logging.getLogger("leasekeeper.manager")

Results = list[BaseException | None]
BatchCall = Callable[[Sequence[Lease]], Results]
#: Told a queued complete's or release's answer: None (done) or what the single
#: form would have raised. Called on the flusher's thread; it must not raise.
Then = Callable[[BaseException | None], object]
ReleaseCall = Callable[[Sequence[Lease], "float | None"], Results]

_RECENT = 32  # arrival times kept to estimate the rate


class _Item(NamedTuple):
    operation: str  # "complete" or "release"
    lease: Lease
    delay: float | None
    then: Then  # told the answer: a Future's setter, or a caller's own callback
    arrived: float


class Coalescer:
    """See the module docstring. One per LeaseManager, started on first use."""

    def __init__(self, complete_many: BatchCall, release_many: ReleaseCall, window: float) -> None:
        self._complete_many = complete_many
        self._release_many = release_many
        self.window = window
        # Guards _pending, _arrivals, _per_backend, _full, _flush_now, _closed,
        # _sending and _thread.
        self._lock = threading.Lock()
        # The flusher waits on _wakeup, flush() on _answered: a wake-up meant for
        # one never goes to the other.
        self._wakeup = threading.Condition(self._lock)
        self._answered = threading.Condition(self._lock)
        self._pending: list[_Item] = []
        self._arrivals: deque[float] = deque(maxlen=_RECENT)
        self._per_backend: dict[int, int] = {}  # pending entries by id(backend)
        self._full = False  # some backend's pending entries fill a batch call
        self._flush_now = False
        self._sending = 0  # batches taken but not yet answered
        self._closed = False
        self._thread: threading.Thread | None = None

    def complete(self, lease: Lease, *, at_once: bool = False) -> Future[None]:
        """Complete ``lease`` soon; the future's result is None or what
        ``lease.complete()`` would have raised. ``at_once``: send what waits now,
        without waiting for company (``complete_then``)."""
        future: Future[None] = Future()
        self._submit("complete", lease, None, functools.partial(_resolve, future), at_once)
        return future

    def release(self, lease: Lease, delay: float | None = None) -> Future[None]:
        """Release ``lease`` soon (after ``delay``, or the manager's release delay)."""
        future: Future[None] = Future()
        self._submit("release", lease, delay, functools.partial(_resolve, future))
        return future

    def release_all(self, leases: Sequence[Lease], delay: float | None) -> list[Future[None]]:
        """Release ``leases`` soon, together: queued at once, so they go out in the
        same batch call (one per ``max_batch`` of a backend), after the same
        ``delay``. One future a lease, in order."""
        futures: list[Future[None]] = [Future() for _ in leases]
        self._submit_all(
            [
                ("release", lease, delay, functools.partial(_resolve, future))
                for lease, future in zip(leases, futures, strict=True)
            ]
        )
        return futures

    def complete_then(self, lease: Lease, then: Then, *, at_once: bool = False) -> None:
        """Complete ``lease`` soon and call ``then(error)`` with the answer (see the
        module docstring). ``at_once``: something waits on this answer (the next
        message of a FIFO group): send what waits now, without waiting for company -
        completes that come while that call is out still go out together."""
        self._submit("complete", lease, None, then, at_once)

    def _submit(
        self, operation: str, lease: Lease, delay: float | None, then: Then, at_once: bool = False
    ) -> None:
        now = time.monotonic()
        backend = lease.message.backend
        with self._lock:
            if self._closed:
                raise ManagerClosed("this LeaseManager is closed")
            if at_once and not self._flush_now:
                self._flush_now = True
                self._wakeup.notify()
            self._pending.append(_Item(operation, lease, delay, then, now))
            self._arrivals.append(now)
            per_backend = self._per_backend
            per_backend[id(backend)] = count = per_backend.get(id(backend), 0) + 1
            self._wake_locked(backend, count)

    def _submit_all(self, items: Sequence[tuple[str, Lease, float | None, Then]]) -> None:
        """``_submit`` of several, under one hold of the lock: the flusher takes them
        all in one batch."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                raise ManagerClosed("this LeaseManager is closed")
            per_backend = self._per_backend
            for operation, lease, delay, then in items:
                self._pending.append(_Item(operation, lease, delay, then, now))
                self._arrivals.append(now)
                backend = lease.message.backend
                per_backend[id(backend)] = count = per_backend.get(id(backend), 0) + 1
                self._wake_locked(backend, count)

    def _wake_locked(self, backend: Backend, count: int) -> None:
        """An entry was added (``count``: ``backend``'s pending entries): start the
        flusher, or wake it if it wants to hear of this one - the first entry (it
        sleeps while there is none) or a full batch (it waits for company until
        then); of the entries between, it hears when its window ends."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="leasekeeper-coalescer", daemon=True
            )
            self._thread.start()
        if count >= backend.max_batch and not self._full:
            self._full = True
            self._wakeup.notify()
        elif len(self._pending) == 1:
            self._wakeup.notify()

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
                self._answered.wait(left)

    def close(self, timeout: float | None = None) -> None:
        """Flush, then stop taking new work."""
        self.flush(timeout)
        with self._lock:
            self._closed = True
            self._wakeup.notify_all()
            self._answered.notify_all()
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
                self._per_backend = {}
                self._full = self._flush_now = False
                self._sending += 1
            try:
                self._send(batch)
            finally:
                with self._lock:
                    self._sending -= 1
                    self._answered.notify_all()

    def _wait_for_company(self) -> None:
        """Wait (lock held) until the batch fills, the window ends, a flush is
        asked for - or, at once, when nobody else is expected before the window ends."""
        deadline = self._pending[0].arrived + self.window
        while not (self._flush_now or self._closed or self._full):
            now = time.monotonic()
            left = deadline - now
            if left <= 0 or self._expected(now, left) < 1.0:
                return
            self._wakeup.wait(left)

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
                try:
                    item.then(result)
                except Exception:  # a caller's bug: not the others'
                    log.exception("the answer to a coalesced %s could not be told", operation)


def _resolve(future: Future[None], error: BaseException | None) -> None:
    """Settle a ``complete``/``release`` caller's Future with the answer (unless the
    caller cancelled it)."""
    with contextlib.suppress(InvalidStateError):
        if error is None:
            future.set_result(None)
        else:
            future.set_exception(error)
