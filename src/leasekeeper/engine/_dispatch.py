"""Where and when renewal work runs: one scheduler thread and a bounded dispatch pool.

The scheduler thread sleeps until the earliest due lease or watched deadline
(never longer than ``timer_interval``), asks the engine for what is due, chunks
it by the backend's ``max_batch`` and hands the chunks to a pool of
``max_concurrency`` threads, because MNS and Azure have no batch extend and a
sequential loop over 10,000 leases at 50 ms a call takes 8 minutes.

On a driven clock (``leasekeeper.testing.ManualClock``) there is no thread at all:
the clock calls ``next_wakeup``/``run_due`` and the batches run inline in the
test's thread, so tests are deterministic and fast.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any, Protocol

from leasekeeper.backends.shared import chunked
from leasekeeper.clock import Clock, DrivenClock
from leasekeeper.engine._schedule import Lane
from leasekeeper.record import LeaseRecord

log = logging.getLogger("leasekeeper.manager")

Work = list[tuple[Lane, list[LeaseRecord]]]


class DueWork(Protocol):
    """What the dispatcher needs of the engine it runs."""

    @property
    def clock(self) -> Clock: ...

    def has_pending(self) -> bool:
        """Ended leases whose handlers are still to be told (``drain``)."""
        ...

    def collect_locked(self, now: float) -> Work: ...

    def next_due_locked(self) -> float | None: ...

    def extend_batch(self, lane: Lane, records: Sequence[LeaseRecord]) -> None: ...

    def drain(self) -> None: ...

    def count_scheduler_error(self) -> None: ...


class Dispatcher:
    """Runs an engine's due work. ``lock`` is the engine's registry lock: the
    scheduler sleeps on a condition of it, so registering an earlier lease can wake it.
    """

    def __init__(
        self,
        engine: DueWork,
        lock: threading.Lock,
        *,
        tick: float,
        workers: int,
        executor: Executor | None = None,
    ) -> None:
        self._engine = engine
        self._clock = engine.clock
        self._tick = tick
        self._workers = workers
        self._wakeup = threading.Condition(lock)
        # When the scheduler will wake; -inf while it is awake (or there is none).
        self.next_wake = -math.inf
        self.started = False
        self.closed = False
        self._driven = isinstance(self._clock, DrivenClock)
        self._thread: threading.Thread | None = None
        # Where extend batches run: our own pool, started with the scheduler, unless
        # the owner supplied an executor (a simulation's, say).
        self._pool: Executor | None = executor
        self._own_pool = executor is None
        self._inflight: set[Future[object]] = set()

    # ------------------------------------------------------------------ lifecycle

    def start_locked(self) -> None:
        """Start the scheduler (under the engine's lock). Idempotent."""
        if self.started:
            return
        self.started = True
        if self._driven:
            self._clock.attach(self)  # type: ignore[attr-defined]
            return
        if self._own_pool:
            workers = self._workers
            self._pool = ThreadPoolExecutor(
                max_workers=workers, thread_name_prefix="leasekeeper-dispatch"
            )
            # ThreadPoolExecutor starts a thread inside submit() when none is idle, and
            # a thread start waits for the new thread to run: under GIL pressure that
            # blocks the scheduler for tens of milliseconds per thread. Start them all
            # now: each task waits at the barrier, so every submit finds no idle thread.
            gate = threading.Barrier(workers)
            for _ in range(workers):
                self._pool.submit(gate.wait, 10.0)
        self._thread = threading.Thread(target=self._run, name="leasekeeper-scheduler", daemon=True)
        self._thread.start()

    def wake_locked(self) -> None:
        """Wake the scheduler for work due before it planned to wake (under the lock)."""
        self._wakeup.notify()

    @property
    def running(self) -> bool:
        """Started, not stopped, and (on a real clock) the scheduler thread alive."""
        if not self.started or self.closed:
            return False
        return self._thread is None or self._thread.is_alive()

    def pool_threads(self) -> list[threading.Thread]:
        # ThreadPoolExecutor has no public list of its threads; close() must join
        # them and must know whether it runs on one of them.
        return list(getattr(self._pool, "_threads", ()))

    def on_own_thread(self) -> bool:
        """Is the caller one of our dispatch threads (an on_lost callback, say)?"""
        return threading.current_thread() in self.pool_threads()

    def stop(self, deadline: float | None) -> bool:
        """Stop scheduling and wait (until ``deadline``) for the calls in flight.
        Returns False, doing nothing, when it was stopped already."""
        with self._wakeup:
            if self.closed:
                return False
            self.closed = True
            self._wakeup.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._remaining(deadline))
        if self._inflight and not self.on_own_thread():
            wait_futures(list(self._inflight), timeout=self._remaining(deadline))
        if self._driven and self.started:
            self._clock.detach(self)  # type: ignore[attr-defined]
        return True

    def shutdown(self, deadline: float | None) -> None:
        """Shut the pool down and join its threads (within ``deadline``): leave no
        leasekeeper thread behind, and say so when a hung backend call keeps one."""
        if self._pool is None or not self._own_pool:
            return
        self._pool.shutdown(wait=False, cancel_futures=True)
        me = threading.current_thread()
        for thread in self.pool_threads():
            if thread is me:
                continue
            thread.join(self._remaining(deadline))
            if thread.is_alive():
                log.warning("close(): %s is still in a backend call", thread.name)

    def _remaining(self, deadline: float | None) -> float | None:
        return None if deadline is None else max(0.0, deadline - self._clock.now())

    # ------------------------------------------------------------------ running work

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the pool, or inline when there is none (a driven
        clock) or it is shut down. Exceptions are the caller's to contain."""
        pool = self._pool
        if pool is None or self.closed:
            fn(*args)
            return
        try:
            future = pool.submit(fn, *args)
        except RuntimeError:  # the pool shut down under us: close() is running
            return
        self._inflight.add(future)
        future.add_done_callback(self._inflight.discard)

    def run_all(
        self, tasks: Sequence[tuple[Callable[..., object], tuple[Any, ...]]], deadline: float | None
    ) -> list[bool]:
        """Run ``tasks`` in parallel on the pool (inline if there is no pool, only one
        task, or the caller is a pool thread) and wait until ``deadline``. Returns,
        per task, False if it was still queued at the deadline and never ran."""
        if self._pool is None or len(tasks) < 2 or self.on_own_thread():
            for fn, args in tasks:
                fn(*args)
            return [True] * len(tasks)
        futures = [self._pool.submit(fn, *args) for fn, args in tasks]
        wait_futures(futures, timeout=self._remaining(deadline))
        return [not future.cancel() for future in futures]

    def dispatch(self, work: Work) -> None:
        for lane, records in work:
            for chunk in chunked(records, lane.batch):
                self.submit(self._engine.extend_batch, lane, chunk)

    def _run(self) -> None:
        """The scheduler thread: sleep until the earliest due lease, dispatch, repeat."""
        engine, clock, tick = self._engine, self._clock, self._tick
        while True:
            try:
                with self._wakeup:
                    if self.closed:
                        return
                    now = clock.now()
                    work = engine.collect_locked(now)
                    if not work and not engine.has_pending():
                        next_due = engine.next_due_locked()
                        wait = tick if next_due is None else min(max(0.0, next_due - now), tick)
                        self.next_wake = now + wait
                        clock.wait(self._wakeup, wait)
                        self.next_wake = -math.inf
                        continue
                engine.drain()  # leases a watch ended, told outside the lock
                self.dispatch(work)
            except Exception:
                # Rule 6: the scheduler never dies. Count, log, carry on after a tick.
                engine.count_scheduler_error()
                log.exception("leasekeeper scheduler error (continuing)")
                with self._wakeup:
                    if not self.closed:
                        clock.wait(self._wakeup, tick)

    # ------------------------------------------------------------------ driven clock

    def next_wakeup(self) -> float | None:
        with self._wakeup:
            return None if self.closed else self._engine.next_due_locked()

    def run_due(self) -> None:
        with self._wakeup:
            if self.closed:
                return
            work = self._engine.collect_locked(self._clock.now())
        self._engine.drain()
        self.dispatch(work)
