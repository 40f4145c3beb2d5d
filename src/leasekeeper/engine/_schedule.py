"""The scheduling state: which leases exist, when each is due, which deadlines are watched.

Pure data, no threads and no I/O: the renewal engine calls it under its registry
lock, and the tests drive it with plain numbers.

Each backend gets a ``Lane``: its leases by message id, a min-heap of
``(due, generation, message id)`` and a min-heap of deadline watches. Heap
entries are never removed in place: a lease that ends or is rescheduled gets a
new generation (or none) and its old entry is skipped when it surfaces. An entry
names the message id, not the lease, so an ended lease (and its message body) is
freed at once rather than when its stale entry surfaces. A lane's heap is rebuilt
when stale entries outnumber live ones, so memory stays proportional to the
leases in flight.

``collect(now)`` pops the due leases of every lane - O(k log n), never a scan of
all n - and tops up a partial batch with leases due within ``fill_window`` (a
batch call costs the same for 1 entry as for 10).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import NamedTuple

from leasekeeper.backends.contract import Backend
from leasekeeper.record import LeaseRecord

_heappush = heapq.heappush
_heappop = heapq.heappop
_new_tuple = tuple.__new__
_REBUILD_MIN = 64  # stale entries a heap may carry before a rebuild is considered


class Lane:
    """One backend's leases, renewal heap and deadline watches."""

    __slots__ = ("backend", "batch", "heap", "leases", "stale", "watches")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.batch: int = backend.max_batch
        self.leases: dict[str, LeaseRecord] = {}
        self.heap: list[tuple[float, int, str]] = []  # (due, generation, message id)
        self.stale = 0  # heap entries whose lease has moved on
        # (deadline, watch generation, message id) of leases whose extend call is out.
        self.watches: list[tuple[float, int, str]] = []

    def live(self, gen: int, message_id: str) -> LeaseRecord | None:
        """The lease a heap entry stands for, or None if the entry is stale."""
        record = self.leases.get(message_id)
        return record if record is not None and record.gen == gen else None

    def head_due(self) -> float | None:
        """The earliest live due time, dropping stale entries off the top."""
        heap = self.heap
        while heap:
            due, gen, message_id = heap[0]
            if self.live(gen, message_id) is not None:
                return due
            _heappop(heap)
            self.stale -= 1
        return None

    def head_watch(self) -> float | None:
        """The earliest deadline still watched. Entries whose extend call has come
        back are dropped off the top, so they wake nobody."""
        watches = self.watches
        while watches:
            deadline, gen, message_id = watches[0]
            record = self.leases.get(message_id)
            if record is not None and record.watch == gen:
                return deadline
            _heappop(watches)
        return None


class Due(NamedTuple):
    """What ``Schedule.collect`` found at one moment."""

    work: list[tuple[Lane, list[LeaseRecord]]]  # due leases per lane, popped
    expired: list[tuple[Lane, LeaseRecord]]  # deadline passed with the extend still out
    worst_lag: float  # how late the most overdue lease is; -1 when none was due


class Schedule:
    """Lanes of leases and when each is due. See the module docstring."""

    __slots__ = ("_gen", "fill_window", "lanes")

    def __init__(self, fill_window: float) -> None:
        self.lanes: dict[int, Lane] = {}
        self.fill_window = fill_window
        self._gen = 0

    # ------------------------------------------------------------------ registry

    def lane(self, backend: Backend) -> Lane | None:
        return self.lanes.get(id(backend))

    def add_lane(self, backend: Backend) -> Lane:
        lane = self.lanes[id(backend)] = Lane(backend)
        return lane

    def add(self, lane: Lane, message_id: str, record: LeaseRecord, due: float) -> None:
        """Register a new ``record`` (of message ``message_id``) in ``lane``, due at ``due``."""
        lane.leases[message_id] = record
        # push(), inlined for the register hot path: a new record has no entry yet.
        self._gen = gen = self._gen + 1
        record.gen = gen
        record.due = due
        # No rebuild check here: adding an entry never makes stale ones a larger share.
        _heappush(lane.heap, (due, gen, message_id))

    def remove(self, lane: Lane, record: LeaseRecord) -> None:
        """Forget an ended lease; its heap entry, if any, is now stale."""
        gen = record.gen
        if gen:
            record.gen = 0
            heap = lane.heap
            # The newest entry sits at the end of the heap's list (a lease registered
            # last is due last), and dropping the last element keeps a heap a heap:
            # a short job completed right after it was registered leaves no stale
            # entry behind.
            if heap[-1][1] == gen:
                heap.pop()
            else:
                lane.stale += 1
                if lane.stale > _REBUILD_MIN and lane.stale * 2 > len(heap):
                    self._rebuild(lane)
        leases = lane.leases
        message_id = record.message.id
        if leases.get(message_id) is record:
            del leases[message_id]

    def count(self) -> int:
        """Leases registered (in flight)."""
        return sum(len(lane.leases) for lane in self.lanes.values())

    def records(self) -> Iterator[LeaseRecord]:
        for lane in self.lanes.values():
            yield from lane.leases.values()

    # ------------------------------------------------------------------ timing

    def push(self, lane: Lane, record: LeaseRecord, due: float) -> None:
        """(Re)schedule ``record`` at ``due``; any earlier entry of it goes stale."""
        if record.gen:
            lane.stale += 1
        self._gen = gen = self._gen + 1
        record.gen = gen
        record.due = due
        heap = lane.heap
        _heappush(heap, _new_tuple(tuple, (due, gen, record.message.id)))
        if lane.stale > _REBUILD_MIN and lane.stale * 2 > len(heap):
            self._rebuild(lane)

    @staticmethod
    def _rebuild(lane: Lane) -> None:
        """Drop the stale entries: memory stays proportional to the leases in flight."""
        live = lane.live
        lane.heap = [e for e in lane.heap if live(e[1], e[2]) is not None]
        heapq.heapify(lane.heap)
        lane.stale = 0

    def watch(self, lane: Lane, record: LeaseRecord) -> None:
        """Watch ``record``'s deadline while its extend call is out. The caller
        clears ``record.watch`` when the call comes back."""
        self._gen = gen = self._gen + 1
        record.watch = gen
        _heappush(lane.watches, (record.visible_until, gen, record.message.id))

    def collect(self, now: float) -> Due:
        """Pop every due lease (plus early ones that top up a partial batch) and every
        watch whose deadline has passed. Popped leases are left unscheduled
        (``gen == 0``) for the caller to extend and reschedule."""
        work: list[tuple[Lane, list[LeaseRecord]]] = []
        expired: list[tuple[Lane, LeaseRecord]] = []
        worst_lag = -1.0
        for lane in self.lanes.values():
            watches = lane.watches
            while watches and watches[0][0] <= now:
                _, gen, message_id = _heappop(watches)
                record = lane.leases.get(message_id)
                if record is not None and record.watch == gen:
                    expired.append((lane, record))
            heap = lane.heap
            due_records: list[LeaseRecord] = []
            batch = lane.batch
            horizon = now
            while heap:
                due, gen, message_id = heap[0]
                record = lane.live(gen, message_id)
                if record is None:
                    _heappop(heap)
                    lane.stale -= 1
                    continue
                if due > horizon:
                    if batch > 1 and due_records and len(due_records) % batch:
                        horizon = now + self.fill_window  # top up the last batch
                        if due <= horizon:
                            continue
                    break
                _heappop(heap)
                record.gen = 0
                if due <= now and now - due > worst_lag:
                    worst_lag = now - due
                due_records.append(record)
                if horizon > now and len(due_records) % batch == 0:
                    break
            if due_records:
                work.append((lane, due_records))
        return Due(work, expired, worst_lag)

    def next_due(self) -> float | None:
        """The earliest moment with work: a due lease or a watched deadline."""
        best: float | None = None
        for lane in self.lanes.values():
            due = lane.head_due()
            watched = lane.head_watch()
            if watched is not None and (due is None or watched < due):
                due = watched
            if due is not None and (best is None or due < best):
                best = due
        return best
