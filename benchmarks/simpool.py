"""SimPool: a thread pool of N workers, simulated on a driven clock.

A LeaseManager on a ``ManualClock`` runs its extend batches inline, as if every
call were instant and the pool infinite. For capacity runs the queueing matters:
with 32 dispatch threads and 50 ms calls, work waits for a free thread. SimPool
stands in for the manager's ``ThreadPoolExecutor``: ``submit`` gives the job the
earliest free worker (FIFO, like the executor's queue), the job runs at that
moment of clock time - so the design's own ``clock.now()`` before the call is
the moment the call really starts - and the worker stays busy for ``latency``.
It attaches to the clock like a manager does, and ``advance`` runs the jobs.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from leasekeeper.testing import ManualClock


class SimPool:
    def __init__(self, clock: ManualClock, workers: int, latency: float) -> None:
        self.clock = clock
        self.latency = latency
        now = clock.now()
        self._free: list[float] = [now] * workers  # min-heap: when each worker is free
        self._jobs: list[tuple[float, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._seq = itertools.count()
        self.max_wait = 0.0  # the longest a job waited for a worker
        self.jobs_run = 0
        clock.attach(self)

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        now = self.clock.now()
        start = max(now, heapq.heappop(self._free))
        heapq.heappush(self._free, start + self.latency)
        self.max_wait = max(self.max_wait, start - now)
        future: Future[Any] = Future()
        heapq.heappush(self._jobs, (start, next(self._seq), future, fn, args))
        return future

    def next_wakeup(self) -> float | None:
        return self._jobs[0][0] if self._jobs else None

    def run_due(self) -> None:
        now = self.clock.now()
        while self._jobs and self._jobs[0][0] <= now:
            _, _, future, fn, args = heapq.heappop(self._jobs)
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as exc:
                future.set_exception(exc)
            self.jobs_run += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        for _, _, future, _, _ in self._jobs:
            future.cancel()
        self._jobs.clear()
        self.clock.detach(self)
