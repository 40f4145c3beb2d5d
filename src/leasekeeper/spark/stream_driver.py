"""The driver-side half of ``read_stream``: receive, lease, plan, commit, release.

PySpark runs a streaming reader's driver-side methods (``initialOffset``,
``latestOffset``, ``partitions``, ``commit``, ``stop``) in one long-lived Python
process per query. A ``StreamDriver`` lives there: it builds the backend and one
``LeaseManager`` on first use, and

0. a **prefetcher** thread keeps receiving and leasing into a buffer of up to
   ``prefetch`` messages (by default ``max_messages_per_batch``) while Spark runs,
   plans and commits batches, so the receives never wait for Spark: one long poll
   of ``poll_seconds`` while the queue is empty, rounds of up to
   ``receive_concurrency`` receives at a time while pages keep coming. Buffered
   messages are leased (renewed like the others) and belong to no batch yet;
   nothing is deleted before the sink commits it.

and for each micro-batch

1. ``latest_offset(start)`` takes up to ``max_messages_per_batch`` messages from
   the buffer: at once when it holds that many, else it waits while the
   prefetcher keeps bringing more, for at most ``fill_seconds`` (or until a
   receive finds the queue empty), and names them batch ``start + 1``;
2. ``plan(start, end)`` turns the batches in ``(start, end]`` into rows, split
   into ``partitions`` lists (executors only emit them); a lease already lost
   gives no row (its message comes back and is read again);
3. the messages of every batch up to ``start`` that Spark planned are deleted with
   ``LeaseManager.complete_many`` (batch calls, up to ``receive_concurrency``
   of them in parallel) as soon as Spark asks for the batch after them, at the
   start of ``latest_offset(start)``: Spark's micro-batch loop asks for the
   next batch only after it ran the one ending at ``start`` through the sink
   and wrote its commit log. ``commit(end)``, which Spark sends later (after
   the next batch is named and its offsets logged), deletes what is left up to
   ``end`` (nothing, or deletes that failed). Deleting at ``commit`` would keep
   a finished batch's messages hidden while the next batch fills, and the last
   batch of a burst would need an empty batch after it to be committed at all.
4. ``stop()`` releases every lease not committed, buffered ones included
   (visibility 0), and closes the manager.

Offsets are ``{"batch": n}`` and always built from ``start``: after a restart
Spark hands back its checkpoint's offset, so they keep growing; an offset this
process never issued (a replayed batch, or a batch of a crashed driver) plans
no rows and commits nothing.

Every operation runs on one worker thread while the calling (main) thread only
waits, so a SIGTERM handler (``install_sigterm_handler``: Spark ends the reader's
process with SIGTERM when a query stops) can wait for a receive or a commit that
is half done, release what is held, and then let the signal end the process.
The main thread never takes a lock the handler needs.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from types import FrameType
from typing import Any, TypeVar

from leasekeeper.backends.contract import Backend
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.errors import LeaseError, LeaseLost
from leasekeeper.lease import Lease, LeaseState
from leasekeeper.manager import LeaseManager
from leasekeeper.spark.sources import build_backend
from leasekeeper.spark.stream_options import StreamOptions
from leasekeeper.spark.stream_prefetch import Prefetcher
from leasekeeper.spark.stream_rows import Row, message_row

log = logging.getLogger("leasekeeper.spark.stream")

T = TypeVar("T")

# The longest stop() waits for a receive or commit under way before releasing anyway.
STOP_WAIT = 60.0


class StreamStopped(LeaseError):
    """The reader is stopping; it takes no more work."""


def batch_of(offset: object) -> int:
    """The batch number of a leasekeeper offset (``{"batch": n}``)."""
    value = offset.get("batch") if isinstance(offset, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a leasekeeper stream offset: {offset!r}")
    return value


def offset_of(batch: int) -> dict[str, int]:
    return {"batch": batch}


@dataclass
class StreamCounts:
    """What one reader did, for logs and tests."""

    received: int = 0  # messages received and leased
    too_short: int = 0  # received with too little invisibility left to lease
    emitted: int = 0  # rows planned into micro-batches
    dropped: int = 0  # leases lost before their batch was planned: no row
    deleted: int = 0  # messages deleted by commit
    lost: int = 0  # leases lost or abandoned (the manager's on_lost)
    lost_at_commit: int = 0  # rows emitted whose lease was lost before the commit
    delete_failed: int = 0  # deletes that failed (retried at the next commit, and at stop)
    released: int = 0  # leases released by stop


class StreamDriver:
    """One query's receiving, leasing and committing; see the module docstring."""

    def __init__(self, options: StreamOptions, backend: Backend | None = None) -> None:
        self.options = options
        self.counts = StreamCounts()
        self._backend = backend
        self._manager: LeaseManager | None = None
        self._prefetcher: Prefetcher | None = None
        self._clock: Clock = SYSTEM_CLOCK
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="leasekeeper-stream")
        self._committers: ThreadPoolExecutor | None = None
        # Guards the batches, the retry list and the counts. Never taken on the main
        # thread outside stop(): a signal handler there may need it.
        self._lock = threading.Lock()
        self._batches: dict[int, list[Lease]] = {}
        self._planned: set[int] = set()  # batches held whose rows Spark has asked for
        self._retry: list[Lease] = []  # committed by the sink, delete failed
        self._idle = threading.Event()  # set while no operation is under way
        self._idle.set()
        self._stopping = False  # plain flag: set without a lock (by a signal handler too)
        self._stop_begun = False
        self._cutoff: float | None = None  # Trigger.AvailableNow: sent after this, not "now"

    # ------------------------------------------------------------------ operations

    def _run(self, op: Callable[[], T]) -> T:
        """Run ``op`` on the worker thread; the caller only waits for its result."""
        if self._stopping:
            raise StreamStopped("the leasekeeper stream reader is stopping")

        def task() -> T:
            self._idle.clear()
            try:
                if self._stopping:  # checked after clearing: stop() waits for us or sees it
                    raise StreamStopped("the leasekeeper stream reader is stopping")
                return op()
            finally:
                self._idle.set()

        return self._worker.submit(task).result()

    def initial_offset(self) -> dict[str, int]:
        return offset_of(0)

    def prepare_available_now(self) -> None:
        """Trigger.AvailableNow: take what was sent until now, then end (see
        ``leasekeeper.spark.stream_prefetch``)."""
        self._cutoff = time.time()
        if self._prefetcher is not None:
            self._prefetcher.available_now(self._cutoff)

    def latest_offset(self, start: Mapping[str, Any], max_rows: int | None = None) -> Any:
        """The next batch: ``start + 1`` with its messages leased, or ``start`` itself
        when there is nothing new. The batches up to ``start`` are deleted first:
        Spark asks for the next batch only after the sink has them."""
        first = batch_of(start)
        want = self.options.max_messages_per_batch
        if max_rows is not None:
            want = max(1, min(want, max_rows))
        end = self._run(lambda: self._latest(first, want))
        return start if end == first else offset_of(end)

    def plan(self, start: Mapping[str, Any], end: Mapping[str, Any]) -> list[list[Row]]:
        """The rows of the batches in ``(start, end]``, split into partitions."""
        first, last = batch_of(start), batch_of(end)
        return self._run(lambda: self._plan(first, last))

    def commit(self, end: Mapping[str, Any]) -> None:
        """Delete the messages of every batch up to ``end`` still held: the sink has
        them (usually ``latest_offset`` deleted them already)."""
        last = batch_of(end)
        self._run(lambda: self._delete_through(last))

    def held(self) -> int:
        """Leases held for batches not committed yet (for tests and tools: it takes the
        lock, so not from the thread a SIGTERM handler may interrupt)."""
        with self._lock:
            return sum(len(leases) for leases in self._batches.values())

    # ------------------------------------------------------------------ worker side

    def _start(self) -> tuple[Backend, LeaseManager, Prefetcher]:
        if self._manager is None:
            if self._backend is None:
                self._backend = build_backend(self.options.source)
            self._clock = getattr(self._backend, "clock", SYSTEM_CLOCK)
            self._manager = LeaseManager(
                self._backend,
                self.options.config,
                on_lost=self._on_lost,
                renewer=self.options.renewer,
            ).start()
            self._committers = ThreadPoolExecutor(
                self.options.receive_concurrency, thread_name_prefix="leasekeeper-stream-commit"
            )
            self._prefetcher = Prefetcher(
                self._backend, self._manager, self.options, self._add, self._clock
            )
            if self._cutoff is not None:
                self._prefetcher.available_now(self._cutoff)
            log.info("stream reader started on %r", self._backend)
        assert self._backend is not None and self._prefetcher is not None
        return self._backend, self._manager, self._prefetcher

    def _add(self, count: str, value: int) -> None:
        if value:
            with self._lock:
                setattr(self.counts, count, getattr(self.counts, count) + value)

    def _on_lost(self, lease: Lease, reason: str) -> None:
        self._add("lost", 1)

    def _latest(self, first: int, want: int) -> int:
        with self._lock:
            if self._batches.get(first + 1):
                return first + 1  # asked again for the same start: the same batch
        _, _, prefetcher = self._start()
        # Spark asks for the batch after `first` only once the batch ending there has
        # run through the sink and its commit log is written: its messages go now,
        # not held through this batch's fill wait until Spark's commit(first). Only
        # batches Spark planned: one it never asked rows of waits for its commit.
        self._delete_through(first, planned_only=True)
        leases = prefetcher.take(want)
        with self._lock:
            if leases:
                self._batches[first + 1] = leases
                return first + 1
        return first

    def _plan(self, first: int, last: int) -> list[list[Row]]:
        with self._lock:
            chosen = [
                (n, list(self._batches[n])) for n in sorted(self._batches) if first < n <= last
            ]
        if not chosen and last > first:
            log.info(
                "batches %d..%d are not held here (a replay or a restart): planned empty",
                first + 1,
                last,
            )
        clock = self._clock
        rows: list[Row] = []
        dropped = 0
        kept: dict[int, list[Lease]] = {}
        for batch, leases in chosen:
            kept[batch] = []
            for lease in leases:
                if lease.state is not LeaseState.ACTIVE:
                    dropped += 1  # lost: the message comes back and is read again
                    continue
                kept[batch].append(lease)
                message = lease.message
                received_wall = clock.wall() - (clock.now() - message.received_at)
                rows.append(message_row(message, batch, received_wall))
        with self._lock:
            for batch, leases in kept.items():
                if batch in self._batches:  # only what gave a row is deleted at commit
                    self._batches[batch] = leases
                    self._planned.add(batch)
            self.counts.emitted += len(rows)
            self.counts.dropped += dropped
        if dropped:
            log.warning(
                "%d lease(s) of batch(es) up to %d were lost before planning: no rows for "
                "them; their messages come back and are read again",
                dropped,
                last,
            )
        parts = min(self.options.partitions, len(rows))
        if parts == 0:
            return []
        size, extra = divmod(len(rows), parts)
        out: list[list[Row]] = []
        at = 0
        for i in range(parts):
            step = size + (1 if i < extra else 0)
            out.append(rows[at : at + step])
            at += step
        return out

    def _delete_through(self, last: int, planned_only: bool = False) -> None:
        """Delete the messages of the batches up to ``last`` (only those planned, with
        ``planned_only``), and those whose delete failed before: the sink has them."""
        with self._lock:
            done = sorted(
                batch
                for batch in self._batches
                if batch <= last and (batch in self._planned or not planned_only)
            )
            leases = [lease for batch in done for lease in self._batches.pop(batch)]
            self._planned.difference_update(done)
            leases += self._retry
            self._retry = []
        if not leases or self._manager is None:
            return
        results = self._complete(leases)
        deleted = lost = failed = 0
        retry: list[Lease] = []
        for lease, result in zip(leases, results, strict=True):
            if result is None:
                deleted += 1
            elif isinstance(result, LeaseLost):
                lost += 1
            else:
                failed += 1
                retry.append(lease)
                log.warning("delete of message %r failed (%s); retried later", lease.id, result)
        with self._lock:
            self.counts.deleted += deleted
            self.counts.lost_at_commit += lost
            self.counts.delete_failed += failed
            self._retry += retry
        if lost:
            log.warning(
                "%d message(s) of batch(es) up to %d were in the sink but their leases were "
                "lost before the commit: they may be read again (de-duplicate on id)",
                lost,
                last,
            )
        if log.isEnabledFor(logging.INFO):
            with self._lock:
                totals = asdict(self.counts)
            log.info("deleted batch(es) up to %d: %d messages; totals %s", last, deleted, totals)

    def _complete(self, leases: list[Lease]) -> list[BaseException | None]:
        """``complete_many`` in up to ``receive_concurrency`` parallel parts, each a
        whole number of the backend's batches: where a delete takes one message a
        call (MNS and Azure through complete_many), a commit of 1,000 would
        otherwise be 1,000 calls in a row."""
        backend, manager, _ = self._start()
        pool = self._committers
        per_call = max(1, backend.max_batch)
        calls = math.ceil(len(leases) / per_call)
        parts = min(self.options.receive_concurrency, calls)
        if parts <= 1 or pool is None:
            return manager.complete_many(leases)
        size = math.ceil(calls / parts) * per_call
        futures = [
            pool.submit(manager.complete_many, leases[at : at + size])
            for at in range(0, len(leases), size)
        ]
        return [result for future in futures for result in future.result()]

    # ------------------------------------------------------------------ stopping

    def stop(self, timeout: float = STOP_WAIT) -> bool:
        """Release every lease not committed (visibility 0) and close the manager,
        after waiting up to ``timeout`` for a receive or commit under way. Returns
        False when a stop had already begun (it does nothing then)."""
        if self._stop_begun:
            return False
        self._stop_begun = True
        self._stopping = True
        deadline = time.monotonic() + timeout
        prefetcher = self._prefetcher
        quiet = prefetcher.stop(timeout) if prefetcher is not None else True
        if not self._idle.wait(max(0.0, deadline - time.monotonic())) or not quiet:
            log.warning("stopping while a receive or commit is still under way")
        manager = self._manager
        if manager is not None:
            with self._lock:
                retry, self._retry = self._retry, []
            if retry:
                results = manager.complete_many(retry)
                done = sum(result is None for result in results)
                with self._lock:
                    self.counts.deleted += done
            held = len(manager.leases())
            manager.close(release=True, timeout=timeout)
            with self._lock:
                self.counts.released += held
                self._batches.clear()
                self._planned.clear()
        counts = self.counts
        troubled = counts.lost or counts.dropped or counts.lost_at_commit or counts.delete_failed
        log.log(
            logging.WARNING if troubled else logging.INFO,
            "stream reader stopped: %s",
            asdict(counts),
        )
        return True

    def shutdown_threads(self) -> None:
        """Let the worker threads go (after ``stop``; not from a signal handler)."""
        self._worker.shutdown(wait=False)
        if self._committers is not None:
            self._committers.shutdown(wait=False)
        if self._prefetcher is not None:
            self._prefetcher.shutdown()


def install_sigterm_handler(driver: Callable[[], StreamDriver | None]) -> bool:
    """On the main thread: on SIGTERM, stop the driver ``driver()`` returns (release
    what it holds, after a receive or commit under way), then die of the signal as
    before. Returns False off the main thread (nothing installed)."""
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        found = driver()
        if found is not None and not found.stop():
            return  # a stop is under way on this very thread: let it finish
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
        if callable(previous):
            previous(signum, frame)
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_sigterm)
    return True
