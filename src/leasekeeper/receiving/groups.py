"""Message groups kept in order: which of the messages a worker holds may start now.

On an ordered queue - a FIFO queue (``is_ordered``) - the service hands a message
group out in order, several of it in one receive, and holds the rest of the group
back while any of it is in flight. The worker keeps the other half of the promise:
one message of a group handled at a time, in the order received. ``Groups`` is that
bookkeeping and nothing else: pure data, no lock (its user serialises the calls), no
clock, no threads, so ``Worker``, ``AsyncWorker`` and ``leasekeeper.spark.drain``
share it and a test drives it with plain values.

A *job* is whatever its user hands along (a worker's ``(message, lease)``); its *key*
names its group apart per queue - ``(queue name, group id)``, so the same group id
on two queues is two groups - or is None for a job of no ordered group (a standard
queue's, or a message without a group), which may always start at once.

- ``add(key, job)``: True when the job may start now (nothing of its group is
  started), else it waits behind its group's started job.
- ``done(key)``: the group's started job ended well (its message deleted, or moved to
  the dead-letter queue): returns the group's next job, started now, or None - the
  group is then forgotten.
- ``drop(key)``: the group's started job did not end well (it failed, its lease was
  lost, it was rolled over, its delete failed): returns the jobs that waited behind
  it, in order, for their messages to be released with it; the group is forgotten.

A group is forgotten as soon as nothing of it is held, so nothing about a group - a
failure included - outlives the messages a worker holds of it: when the service
hands the group out again, it is a new group here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

__all__ = ["GroupKey", "Groups", "in_waves", "is_ordered"]

#: A group, apart per queue: (the queue's name in its worker, the message's group id).
GroupKey = tuple[str, str]

Job = TypeVar("Job")


def is_ordered(backend: object) -> bool:
    """Does ``backend``'s queue keep each message group in order? Its ``fifo``
    attribute says so: ``SQSBackend`` on a queue whose URL ends in ``.fifo``,
    ``MemoryQueue(fifo=True)`` (or one named ``*.fifo``), a backend of your own that
    sets ``fifo = True`` (and hands out groups as SQS does: see docs/guide.md,
    "Ordered queues"); wrappers (``ForwardingBackend``) copy it. Read through
    wrappers that do not."""
    for _ in range(16):
        fifo = getattr(backend, "fifo", None)
        if fifo is not None:
            return fifo is True  # a flag: anything else named fifo says nothing
        inner = getattr(backend, "inner", None)
        if inner is None:
            return False
        backend = inner
    return False


def in_waves(jobs: Sequence[Job], group: Callable[[Job], str | None]) -> list[list[Job]]:
    """``jobs`` in waves, to act on one wave after another (a FIFO group's deletes, in
    order): each group's first job in the first wave, its second in the second...;
    jobs of no group (``group(job)`` None) in the first."""
    waves: list[list[Job]] = []
    depth: dict[str, int] = {}
    for job in jobs:
        name = group(job)
        position = 0 if name is None else depth.get(name, 0)
        if name is not None:
            depth[name] = position + 1
        if position == len(waves):
            waves.append([])
        waves[position].append(job)
    return waves


class Groups(Generic[Job]):
    """The groups of the jobs one worker holds (see the module docstring)."""

    def __init__(self) -> None:
        # Every group with a job started, to the jobs waiting behind it, in order.
        self._behind: dict[GroupKey, deque[Job]] = {}
        #: Jobs waiting behind an earlier job of their group.
        self.waiting = 0
        # Per queue: the groups with at least one job waiting.
        self._stalled: dict[str, int] = {}
        # Per queue: the groups held.
        self._held: dict[str, int] = {}
        #: Groups forgotten so far (``done`` with none left, or ``drop``): each one a
        #: group the service may hand out again.
        self.let_go = 0

    def add(self, key: GroupKey | None, job: Job) -> bool:
        """Hold ``job`` of group ``key``: True when it may start now, False when it
        waits behind an earlier job of its group."""
        if key is None:
            return True
        behind = self._behind.get(key)
        if behind is None:
            self._behind[key] = deque()
            self._held[key[0]] = self._held.get(key[0], 0) + 1
            return True
        if not behind:
            self._stalled[key[0]] = self._stalled.get(key[0], 0) + 1
        behind.append(job)
        self.waiting += 1
        return False

    def done(self, key: GroupKey | None) -> Job | None:
        """The started job of group ``key`` ended well: the group's next job, started
        now, or None (the group is forgotten)."""
        if key is None:
            return None
        behind = self._behind.get(key)
        if not behind:
            if behind is not None:
                self._forget(key)
            return None
        job = behind.popleft()
        self.waiting -= 1
        if not behind:
            self._unstall(key)
        return job

    def drop(self, key: GroupKey | None) -> list[Job]:
        """The started job of group ``key`` did not end well: the jobs that waited
        behind it, in order (to be released with it); the group is forgotten."""
        if key is None:
            return []
        behind = self._behind.get(key)
        if behind is None:
            return []
        self._forget(key)
        if not behind:
            return []
        self.waiting -= len(behind)
        self._unstall(key)
        return list(behind)

    def waiting_jobs(self) -> list[Job]:
        """Every job waiting behind an earlier one of its group."""
        return [job for behind in self._behind.values() for job in behind]

    def started(self, key: GroupKey | None) -> bool:
        """Has group ``key`` a job started (and so is held here)?"""
        return key is not None and key in self._behind

    def held(self, queue: str) -> int:
        """The groups of ``queue`` held (with a job started)."""
        return self._held.get(queue, 0)

    def stalled(self, queue: str | None = None) -> int:
        """Groups waiting on an earlier message: with at least one job behind their
        started one - of ``queue``, or of every queue."""
        if queue is None:
            return sum(self._stalled.values())
        return self._stalled.get(queue, 0)

    def __len__(self) -> int:
        """The groups held (with a job started)."""
        return len(self._behind)

    def _forget(self, key: GroupKey) -> None:
        del self._behind[key]
        self.let_go += 1
        left = self._held[key[0]] - 1
        if left > 0:
            self._held[key[0]] = left
        else:
            del self._held[key[0]]

    def _unstall(self, key: GroupKey) -> None:
        left = self._stalled.get(key[0], 0) - 1
        if left > 0:
            self._stalled[key[0]] = left
        else:
            self._stalled.pop(key[0], None)
