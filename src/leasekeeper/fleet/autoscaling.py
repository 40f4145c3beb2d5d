"""What an autoscaler reads of a worker: the queue's backlog and how busy it is.

- ``BacklogSampler``: each queue's ``queue_counts()`` (``backends.contract``:
  GetQueueAttributes on SQS and MNS, Azure's approximate count, Redis XLEN and
  XPENDING), asked every ``every`` seconds by one thread of its own
  (``leasekeeper-backlog``) and kept. A scrape reads what was kept: it never waits
  for the service, and a hundred scrapes make no more calls than one. A count that
  fails keeps the last one (an autoscaler that read "no data" as an empty queue
  would scale in on a network blip) and costs one WARNING, and a line when it
  works again.
- ``busy_ratio(worker)``: the handlers running over ``concurrency`` (messages
  prefetched beyond it wait for a handler: they do not count), 0 to 1.

``leasekeeper.prometheus`` exposes them as leasekeeper_queue_backlog_messages{queue}
and leasekeeper_worker_busy_ratio, ``leasekeeper.otel`` as leasekeeper.queue.backlog
and leasekeeper.worker.busy_ratio; docs/scaling.md says what to scale on.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any, Protocol

from leasekeeper.backends.contract import Backend, QueueCounts
from leasekeeper.clock import SYSTEM_CLOCK, Clock, wait_until

__all__ = ["BacklogSampler", "busy_ratio"]

log = logging.getLogger("leasekeeper.fleet")


class Busy(Protocol):
    """What ``busy_ratio`` reads of a ``Worker`` or ``AsyncWorker``."""

    concurrency: int

    @property
    def running(self) -> int: ...


def busy_ratio(worker: Busy) -> float:
    """Running handlers over ``worker.concurrency``: 0 (idle) to 1 (every handler busy)."""
    concurrency = worker.concurrency
    return min(worker.running, concurrency) / concurrency if concurrency > 0 else 0.0


class BacklogSampler:
    """Counts each of ``queues`` (``(name, backend)`` pairs) every ``every`` seconds,
    from a thread of its own, once ``start()``ed; ``counts()`` is what was counted
    last. ``close()`` stops it. See the module docstring."""

    def __init__(
        self,
        queues: Sequence[tuple[str, Backend]],
        *,
        every: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        if not every > 0:
            raise ValueError(f"every must be > 0 seconds, got {every!r}")
        self.queues = list(queues)
        self.every = float(every)
        self.clock: Clock = SYSTEM_CLOCK if clock is None else clock
        #: Count calls made, and calls that failed.
        self.samples = self.failures = 0
        self._counts: dict[str, QueueCounts] = {}
        self._failing: set[str] = set()
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        for _, backend in self.queues:
            if not callable(getattr(backend, "queue_counts", None)):
                log.warning("backlog: %r cannot count its messages (no queue_counts)", backend)

    @classmethod
    def of(cls, worker: Any, *, every: float = 30.0) -> BacklogSampler:
        """A sampler of ``worker``'s queues (a ``Worker``'s or an ``AsyncWorker``'s),
        by the names its stats use, on its clock."""
        sources = worker.intake.sources.all
        return cls(
            [(source.name, source.backend) for source in sources],
            every=every,
            clock=getattr(worker, "clock", None),
        )

    def counts(self) -> dict[str, QueueCounts]:
        """The last counts, by queue name (a queue never counted yet is missing)."""
        with self._cond:
            return dict(self._counts)

    def backlog(self) -> dict[str, int]:
        """The messages waiting for a worker, by queue name (``QueueCounts.backlog``)."""
        return {
            name: counts.backlog
            for name, counts in self.counts().items()
            if counts.backlog is not None
        }

    def start(self) -> BacklogSampler:
        """Count now, then every ``every`` seconds, from a daemon thread."""
        with self._cond:
            if self._thread is None:
                self._closing = False
                self._thread = threading.Thread(
                    target=self._run, name="leasekeeper-backlog", daemon=True
                )
                self._thread.start()
        return self

    def close(self) -> None:
        """Stop counting (a count under way finishes on its own)."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def sample(self) -> None:
        """Count every queue once, now (the thread does it every ``every`` seconds)."""
        for name, backend in self.queues:
            count = getattr(backend, "queue_counts", None)
            if not callable(count):
                continue
            self.samples += 1
            try:
                counts = count()
            except Exception as exc:  # a ReceiveError, or a backend of one's own
                self.failures += 1
                if name not in self._failing:
                    self._failing.add(name)
                    log.warning(
                        "backlog: counting %s failed (%s); the last count stands and it is "
                        "asked again every %gs",
                        name,
                        exc,
                        self.every,
                    )
                continue
            if not isinstance(counts, QueueCounts):
                continue
            if name in self._failing:
                self._failing.discard(name)
                log.info("backlog: counting %s works again", name)
            with self._cond:
                self._counts[name] = counts

    def _run(self) -> None:
        clock, cond = self.clock, self._cond
        with cond:
            while not self._closing:
                cond.release()
                try:
                    self.sample()
                finally:
                    cond.acquire()
                due = clock.now() + self.every
                while not self._closing and clock.now() < due:  # (a driven clock rings early)
                    wait_until(clock, cond, due)

    def __repr__(self) -> str:
        names = ", ".join(name for name, _ in self.queues)
        return f"<BacklogSampler {names} every={self.every:g}s>"
