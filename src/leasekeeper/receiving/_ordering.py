"""A worker's ordered queues: their message groups, one message of a group at a time.

``Worker`` and ``AsyncWorker`` hold what they receive; on an ordered (FIFO) queue a
message whose group has one started waits, leased and renewed, behind it
(``groups.Groups``). What each end of a started message does to its group, decided
here for both workers (they only differ in how they start a handler):

- it ended well - deleted (the delete was *answered*: a group's deletes happen in
  order, and nothing later of the group starts before its predecessor is gone), or
  moved to the dead-letter queue (out of the group's way, as SQS's redrive does): the
  group's next message starts;
- it did not - its handler failed, its lease was lost, it was rolled over, or its
  delete failed: every later message of the group the worker holds goes back with it,
  unhandled (``held_back``), in one release call after the failed message's delay, so
  that the service hands the group out again from the failed message. Nothing of the
  group is kept: its released messages are never renewed again, and when they come
  back they are a new group.

Standard queues, and messages without a group, take none of this: they start at once.

The messages waiting behind their group count against the worker's limit of messages
in hand only beyond an allowance (a batch a handler: ``concurrency x batch_size``), so
that groups run in parallel up to ``concurrency`` even though one receive of a FIFO
queue brings a run of one group - and a backlog of one group, which leaves one message
at a time to handle, neither stalls the receive loop nor lets it receive without end.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager

from leasekeeper.backends.contract import Message
from leasekeeper.errors import LeaseLost, ManagerClosed
from leasekeeper.lease import Lease
from leasekeeper.manager import LeaseManager
from leasekeeper.receiving._sources import Source, Sources
from leasekeeper.receiving.groups import GroupKey, Groups
from leasekeeper.receiving.stats import WorkerStats

__all__ = ["Job", "Ordering"]

log = logging.getLogger("leasekeeper.worker")

#: What a worker holds of a message: the message and its lease.
Job = tuple[Message, Lease]


class Ordering:
    """The message groups of one worker's ordered queues (see the module docstring).
    Holds no lock: its worker serialises the calls, as it does ``Intake``'s - under
    the lock it lends at ``start`` (``Worker``'s slot lock; ``AsyncWorker`` needs none,
    everything happens on its event loop)."""

    def __init__(
        self,
        sources: Sources,
        stats: WorkerStats,
        manager: LeaseManager,
        allowance: int,
        count: Callable[[str, Lease], None],
    ) -> None:
        self.groups: Groups[Job] = Groups()
        self._sources = sources
        self._stats = stats
        self._manager = manager
        self._count = count
        #: Messages that may wait behind their group without counting against the
        #: worker's limit of messages in hand.
        self.allowance = allowance
        #: Has the worker an ordered queue at all? (Else every call below is a no-op.)
        self.any = any(source.ordered for source in sources.all)
        self._only: Source | None = None if sources.several else sources.all[0]
        self._lock: AbstractContextManager[object] = contextlib.nullcontext()
        self._stopping: Callable[[], bool] = lambda: True
        self._resume: Callable[[Job], None] = lambda job: None
        self._wake: Callable[[], None] = lambda: None
        self._answered: Callable[[], None] = lambda: None
        # Held-back messages' releases queued and not answered yet (any thread ends one).
        self._releasing = 0
        self._releasing_lock = threading.Lock()

    def start(
        self,
        lock: AbstractContextManager[object],
        stopping: Callable[[], bool],
        resume: Callable[[Job], None],
        wake: Callable[[], None],
        answered: Callable[[], None],
    ) -> None:
        """A worker's run starts, holding no group (what its last run held was released
        when it ended). ``lock``: held while the groups and the worker's counts change
        together. ``stopping()``: nothing more of a group starts. ``resume(job)`` (lock
        held): a group's next message starts - hand it to a handler. ``wake()`` (lock
        held): a group was let go, and fewer messages may wait - a receive loop waiting
        for either wakes. ``answered()`` (from any thread, no lock held): a held-back
        message's release was answered - ``releasing`` is one less."""
        self._lock, self._stopping, self._resume = lock, stopping, resume
        self._wake, self._answered = wake, answered
        self.groups = Groups()
        self._recount()

    @property
    def releasing(self) -> int:
        """Held-back messages whose release is queued and not answered yet: the worker
        counts them unsettled (it is not idle, and its shutdown waits for them)."""
        return self._releasing

    def key(self, message: Message) -> GroupKey | None:
        """The group ``message`` waits its turn in: None when its queue is not ordered
        or it has no group."""
        group = message.group
        if group is None or not self.any:
            return None
        source = self._only
        if source is None or message.backend is not source.backend:
            source = self._sources.of(message.backend)
        if source is None or not source.ordered:
            return None
        return (source.name, group)

    def waiting(self) -> list[Lease]:
        """The leases of the messages held behind an earlier message of their group
        (they are in the worker's hands: a shutdown releases them)."""
        return [lease for _, lease in self.groups.waiting_jobs()]

    def excess(self) -> int:
        """Waiting messages beyond the allowance: they count against the limit."""
        return max(0, self.groups.waiting - self.allowance)

    def admit(self, leased: Sequence[Job]) -> list[Job]:
        """Hold a received batch's leased messages: the ones that may start now, in
        order; the others wait behind their group."""
        if not self.any:
            return list(leased)
        groups = self.groups
        ready = [job for job in leased if groups.add(self.key(job[0]), job)]
        self._recount()
        return ready

    def went_well(self, lease: Lease) -> None:
        """``lease``'s message ended well (its delete was answered, or it was
        dead-lettered): its group's next message starts - unless the worker is
        stopping (its close releases what waits)."""
        if not self.any:
            return
        with self._lock:
            if self._stopping():
                return
            key = self.key(lease.message)
            job = self.groups.done(key)
            if job is not None:
                self._recount()
                self._resume(job)
            elif key is not None:  # the group's last: the service may hand it out again
                self._let_go(key)

    def deleted(self, lease: Lease, done: bool) -> None:
        """The delete of ``lease``'s message was answered: ``done``, its group goes on
        (``went_well``); else (lost, or it failed) it goes back (``hold_back``)."""
        if done:
            self.went_well(lease)
        else:
            self.hold_back(lease)

    def take_rest(self, lease: Lease) -> list[Lease]:
        """``lease``'s message did not end well: the later messages of its group, out
        of the worker's hands and counted ``held_back`` (release them with it:
        ``release_together``)."""
        if not self.any:
            return []
        with self._lock:
            key = self.key(lease.message)
            rest = [held for _, held in self.groups.drop(key)]
            for held in rest:
                self._count("held_back", held)
            if rest:
                self._recount()
            if key is not None:
                self._let_go(key)
        return rest

    def holds(self, source: Source) -> bool:
        """Are groups of ``source`` held? Then an empty answer from it may be of its
        groups the worker itself holds (the service hands none of them out), and a
        receive should not long-poll: it would not see them let go."""
        return source.ordered and self.groups.held(source.name) > 0

    def _let_go(self, key: GroupKey) -> None:
        """(Lock held.) Group ``key`` is let go: its queue is worth asking again at once
        (a multi-queue worker's resting queue wakes; a receive that raced this may
        set it resting again: then it is asked a rest later, at most ``MAX_REST``)."""
        source = self._only or next(s for s in self._sources.all if s.name == key[0])
        source.rest_until = float("-inf")
        source.empty = 0
        self._wake()

    def hold_back(self, lease: Lease) -> None:
        """``lease``'s message ended unhandled, lost or rolled over (or its delete
        failed): the later messages of its group go back at once, unhandled."""
        rest = self.take_rest(lease)
        if rest:
            self.release_together(lease, rest, None, failed=False)

    def release_together(
        self, lease: Lease, rest: Sequence[Lease], delay: float | None, failed: bool
    ) -> list[Future[None]] | None:
        """Send ``rest`` back with ``lease`` (``failed``: in the same call, after the
        failed message's ``delay``; else, its lease gone, ``rest`` alone at once), through
        the manager's coalescer. One future a lease released, in order; None when the
        manager is closed (its close released them)."""
        leases = [lease, *rest] if failed else list(rest)
        if not leases:
            return []
        if rest:
            log.info(
                "message %r of an ordered queue ended unhandled or failed: %d later "
                "message(s) of its group go back with it",
                lease.id,
                len(rest),
            )
        try:
            futures = self._manager.release_many_soon(leases, delay if failed else 0.0)
        except ManagerClosed:
            return None
        with self._releasing_lock:
            self._releasing += len(rest)
        for held, future in zip(rest, futures[-len(rest) :] if rest else (), strict=True):
            future.add_done_callback(functools.partial(self._release_answered, held))
        return futures

    def _release_answered(self, lease: Lease, future: Future[None]) -> None:
        """A held-back message's release was answered (it was counted when it went)."""
        error = future.exception()
        if error is not None and not isinstance(error, LeaseLost):
            log.warning("release of message %r failed: %s", lease.id, error)
        with self._releasing_lock:
            self._releasing -= 1
        self._answered()

    def _recount(self) -> None:
        """Keep ``stats.groups_waiting`` (in total and per queue) current."""
        stats = self._stats
        groups = self.groups
        stats.groups_waiting = groups.stalled()
        if self._only is not None:
            self._only.stats.groups_waiting = stats.groups_waiting
            return
        for source in self._sources.all:
            if source.ordered:
                source.stats.groups_waiting = groups.stalled(source.name)
