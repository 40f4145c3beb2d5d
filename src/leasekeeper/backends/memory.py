"""MemoryQueue: an in-process queue with real visibility semantics.

It behaves like the services leasekeeper talks to, on an injectable clock: a
received message is hidden for its visibility timeout and comes back when that
runs out; every receive issues a new receipt and makes the previous one stale;
with ``rotate_receipts=True`` every extend does too (as MNS and Azure do), so a
stale receipt is rejected exactly where the real service would reject it.

It is the demo's backend and a tool for your own tests: ``send`` messages, run
your worker, then look at ``deleted_ids``, ``visible_count()``, ``receive_counts``
and the per-operation call counters.

``MemoryQueue(fifo=True)`` (or a queue named ``*.fifo``: ``memory://jobs.fifo``)
is a FIFO queue as SQS keeps one: every message is sent with a ``group_id``, a
receive hands each message group out in the order it was sent - as many of a
group as it can, then other groups - and hands out nothing more of a group while
any of its messages is in flight (received, not yet deleted, not yet visible
again). On any queue a message sent with a ``group_id`` has it as ``message.group``
(on a standard queue it orders nothing, as SQS's "fair" queues' groups do not).

For a long run, ``history=False`` keeps only ``deleted_count``, so the queue's
memory follows its backlog rather than every message it ever held.

``leasekeeper.connect("memory://jobs")`` is the process-wide queue named "jobs"
(``named_queue``). A MemoryQueue lives in this process's memory: it cannot be
rebuilt in another process, so it has no ``spec()`` (the process renewer and Spark
need a queue service).
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, NoReturn

from leasekeeper.backends.contract import OK, Handle, Message, Outcome, QueueCounts
from leasekeeper.backends.shared import (
    cap_margin,
    check_attributes,
    check_body,
    check_count,
    check_lease_age,
    check_seconds,
    is_seconds,
)
from leasekeeper.clock import SYSTEM_CLOCK, Clock, DrivenClock
from leasekeeper.errors import ConfigError

_OPERATIONS = ("receive", "extend", "delete", "release")
_NOT_EXIST = Outcome("lost", detail="MessageNotExist")
_STALE = Outcome("lost", detail="ReceiptHandleError")
_NO_LIMIT = 2**31  # messages one receive may return: as many as there are


class MemoryRecord(NamedTuple):
    """What ``MemoryQueue.receive`` puts in ``Message.raw``: the queue's "native"
    message, as an SDK would return it. ``adopt`` turns one back into a Message."""

    id: str
    body: str | bytes
    receipt: str
    receive_count: int
    received_at: float
    visibility_timeout: float
    attributes: Mapping[str, str] | None = None
    group: str | None = None

    def __repr__(self) -> str:
        return (
            f"MemoryRecord(id={self.id!r}, receive_count={self.receive_count}, receipt=<redacted>)"
        )


class _Stored:
    __slots__ = (
        "attributes",
        "body",
        "cap_at",
        "group",
        "id",
        "in_ready",
        "receipt",
        "receive_count",
        "version",
        "visible_at",
    )

    def __init__(
        self,
        id: str,
        body: str | bytes,
        visible_at: float,
        attributes: dict[str, str],
        group: str | None = None,
    ) -> None:
        self.id = id
        self.body = body
        self.attributes = attributes
        self.group = group
        self.receipt = ""  # none until first received
        self.visible_at = visible_at
        self.receive_count = 0
        self.version = 0  # bumped whenever visible_at changes; stale heap entries skip
        self.in_ready = False
        self.cap_at: float | None = None

    def received(self, receipt: str, now: float, visibility: float) -> MemoryRecord:
        """What a receive hands out of it now (``Message.raw``)."""
        return MemoryRecord(
            self.id,
            self.body,
            receipt,
            self.receive_count,
            now,
            visibility,
            self.attributes,
            self.group,
        )


def _refusal(found: _Stored | None) -> Outcome:
    """Why a delete of a message that is gone (None) or whose receipt is stale is refused."""
    return _NOT_EXIST if found is None else _STALE


class MemoryQueue:
    """An in-memory queue. Thread-safe.

    ``visibility_timeout`` is the queue's default for receives; ``max_visibility``
    caps one extend; ``max_lease_age`` (``visibility_cap``: its older name) caps the
    total invisibility after each receive, like SQS's 12 hours ("capped").
    ``max_batch`` entries a call (more: ValueError, as a service's "too many
    entries"). ``history=False`` keeps only ``deleted_count``, not ``deleted_ids``
    and ``receive_counts``. Arguments are checked as the cloud backends check
    theirs, without rounding to whole seconds; messages carry attributes.
    ``fifo``: a FIFO queue (module docstring); None (the default): if ``name`` ends in .fifo.
    """

    #: Lives in this process: ``leasekeeper.connect`` leaves ``spec()`` refusing.
    process_local: ClassVar[bool] = True
    carries_attributes: ClassVar[bool] = True

    def __init__(
        self,
        visibility_timeout: float = 30.0,
        *,
        clock: Clock | None = None,
        rotate_receipts: bool = False,
        max_visibility: float = 43200.0,
        max_batch: int = 10,
        visibility_cap: float | None = None,
        max_lease_age: float | None = None,
        name: str = "memory",
        history: bool = True,
        fifo: bool | None = None,
    ) -> None:
        self.max_visibility = check_seconds("max_visibility", max_visibility, low=1e-9)
        self.visibility_timeout = check_seconds(
            "visibility_timeout", visibility_timeout, low=1e-9, high=self.max_visibility
        )
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be an int >= 1, got {max_batch!r}")
        if visibility_cap is not None and max_lease_age not in (None, visibility_cap):
            raise ValueError("give max_lease_age or visibility_cap (its older name), not both")
        self.max_lease_age = check_lease_age(
            visibility_cap if max_lease_age is None else max_lease_age, math.inf
        )
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.rotates_receipts = rotate_receipts
        self.max_batch = max_batch
        self.name = name
        self.fifo = name.endswith(".fifo") if fifo is None else bool(fifo)
        self._driven = isinstance(self.clock, DrivenClock)
        # Guards every record and index below; receivers long-poll on the condition.
        self._mutex = threading.RLock()
        self._lock = threading.Condition(self._mutex)
        self._records: dict[str, _Stored] = {}
        # What a receive hands out first: the oldest visible, or each group's (FIFO).
        self._order: _Arrival | _GroupOrder = _GroupOrder() if self.fifo else _Arrival()
        self._hidden: list[tuple[float, int, int, _Stored]] = []  # (visible_at, seq, version, rec)
        self._seq = itertools.count()
        self._ids = itertools.count(1)
        self.history = history
        self.deleted_ids: list[str] = []
        self.receive_counts: dict[str, int] = {}
        # Successful deletes. A deleted record is gone, so no message counts twice.
        self.deleted_count = 0
        # Backend calls per operation, and entries across those calls. Plain dicts,
        # not Counters: an exact dict is what the interpreter indexes fastest, and
        # delete() counts on every handler's hot path.
        self._calls: dict[str, int] = dict.fromkeys(_OPERATIONS, 0)
        self._entries: dict[str, int] = dict.fromkeys(_OPERATIONS, 0)
        # One-handle delete calls are not counted in _calls/_entries (that is the
        # register/complete hot path): a successful one is counted by deleted_count
        # alone, a refused one here; batch deletes' successes are counted apart, so
        # single calls = deleted_count - _batch_deleted + _single_refused.
        self._single_refused = 0
        self._batch_deleted = 0

    @property
    def visibility_cap(self) -> float | None:
        """``max_lease_age``, None when there is none (its older name)."""
        return None if self.max_lease_age == math.inf else self.max_lease_age

    def sibling(self, name: str, *, create: bool = True) -> MemoryQueue:
        """The process-wide queue ``name`` (``named_queue``), made like this one."""
        with _named_lock:
            found = _named.get(name)
        return found or named_queue(
            name,
            visibility_timeout=self.visibility_timeout,
            clock=self.clock,
            rotate_receipts=self.rotates_receipts,
            max_visibility=self.max_visibility,
            max_batch=self.max_batch,
            max_lease_age=self.max_lease_age,
        )

    def spec(self) -> NoReturn:
        """A MemoryQueue lives in this process's memory: no other process can reach it."""
        raise ConfigError(
            f"{self!r} lives in this process's memory and cannot be rebuilt in another "
            "process: renewer='process' and Spark need a queue service (renewer='thread' works)"
        )

    def __repr__(self) -> str:
        return f"MemoryQueue(name={self.name!r}, visibility_timeout={self.visibility_timeout:g})"

    # ------------------------------------------------------------------ producing

    def send(
        self,
        body: str | bytes,
        attributes: Mapping[str, str] | None = None,
        *,
        delay: float = 0.0,
        group_id: str | None = None,
    ) -> str:
        """Add a message with these attributes, visible after ``delay`` seconds; returns
        its id. ``group_id``: its group, required on a FIFO queue (which takes no delay)."""
        check_body(body)
        attrs = check_attributes(attributes, carried=True, service="MemoryQueue")
        delay = check_seconds("delay", delay)
        _check_group(group_id, delay, self.fifo)
        with self._lock:
            message_id = f"m-{next(self._ids):06d}"
            record = _Stored(message_id, body, self.clock.now() + delay, attrs, group_id)
            self._records[message_id] = record
            self._order.sent(record)
            if delay > 0:
                self._hide(record, record.visible_at)
            else:
                self._order.visible(record)
            self._lock.notify()
        return message_id

    def send_many(self, bodies: Sequence[str | bytes]) -> list[str]:
        return [self.send(body) for body in bodies]

    @property
    def calls(self) -> dict[str, int]:
        """Backend calls so far, per operation (a snapshot)."""
        with self._mutex:
            calls = dict(self._calls)
            calls["delete"] += self._single_delete_calls()
        return calls

    @property
    def entries(self) -> dict[str, int]:
        """Entries across those calls, per operation (a snapshot)."""
        with self._mutex:
            entries = dict(self._entries)
            entries["delete"] += self._single_delete_calls()
        return entries

    def _single_delete_calls(self) -> int:
        return self.deleted_count - self._batch_deleted + self._single_refused

    # ------------------------------------------------------------------ inspecting

    def visible_count(self) -> int:
        """Messages a receive could return now."""
        return self._counts()[0]

    def in_flight_count(self) -> int:
        """Messages received and still hidden (or delayed)."""
        return sum(self._counts()[1:])

    def queue_counts(self) -> QueueCounts:
        """Visible, in flight and delayed (sent with a delay, never received): exact."""
        return QueueCounts(*self._counts())

    def _counts(self) -> tuple[int, int, int]:
        with self._lock:
            self._promote(self.clock.now())
            visible = self._order.count(self._records)
            delayed = sum(1 for r in self._records.values() if not (r.in_ready or r.receive_count))
            return visible, len(self._records) - visible - delayed, delayed

    def __len__(self) -> int:
        """Messages not yet deleted."""
        with self._lock:
            return len(self._records)

    # ------------------------------------------------------------------ internals

    def _hide(self, record: _Stored, until: float) -> None:
        record.visible_at = until
        record.version += 1
        record.in_ready = False
        heapq.heappush(self._hidden, (until, next(self._seq), record.version, record))

    def _promote(self, now: float) -> None:
        hidden = self._hidden
        while hidden and hidden[0][0] <= now:
            _, _, version, record = heapq.heappop(hidden)
            if record.version == version and not record.in_ready and record.id in self._records:
                self._order.visible(record)

    def _new_receipt(self, record: _Stored) -> str:
        record.receipt = f"rcpt-{os.urandom(8).hex()}"
        return record.receipt

    def rotate_receipt(self, message_id: str) -> bool:
        """Give a received message a new receipt behind its holder's back, as a
        service does when someone else receives it; the old receipt is refused from
        now on. False when the message is gone or was never received. (For tests:
        ``FaultyBackend`` uses it to make receipts stale.)"""
        with self._mutex:
            record = self._records.get(message_id)
            if record is None or not record.receipt:
                return False
            self._new_receipt(record)
            return True

    def _check(self, handle: Handle) -> _Stored | Outcome:
        record = self._records.get(handle.message_id)
        if record is None:
            return _NOT_EXIST
        if handle.receipt != record.receipt:
            return _STALE
        return record

    # ------------------------------------------------------------------ Backend API

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        max_messages = check_count("max_messages", max_messages, _NO_LIMIT)
        wait_seconds = check_seconds("wait_seconds", wait_seconds)
        vis = self.visibility_timeout
        if visibility_timeout is not None:
            vis = check_seconds(
                "visibility_timeout", visibility_timeout, low=1e-9, high=self.max_visibility
            )
        with self._lock:
            self._calls["receive"] += 1
            now = self.clock.now()
            deadline = now + wait_seconds
            while True:
                self._promote(now)
                chosen = self._order.take(max_messages, self._records)
                if chosen or self._driven or now >= deadline:
                    break
                wait = deadline - now
                if self._hidden:
                    wait = min(wait, max(0.0, self._hidden[0][0] - now))
                self.clock.wait(self._lock, wait)
                now = self.clock.now()
            out: list[Message] = []
            for record in chosen:
                record.receive_count += 1
                if self.history:
                    self.receive_counts[record.id] = record.receive_count
                receipt = self._new_receipt(record)
                self._hide(record, now + vis)
                age = self.max_lease_age
                record.cap_at = None if age == math.inf else now + age
                out.append(self._message(record.received(receipt, now, vis), record.cap_at))
            self._entries["receive"] += len(out)
            return out

    def _message(self, raw: MemoryRecord, cap_at: float | None) -> Message:
        # The manager stops extending cap_margin before the queue's own cap, as on SQS.
        hard = None if cap_at is None else cap_at - cap_margin(self.max_lease_age)
        return Message(
            id=raw.id,
            body=raw.body,
            receipt=raw.receipt,
            backend=self,
            received_at=raw.received_at,
            visibility_timeout=raw.visibility_timeout,
            receive_count=raw.receive_count,
            raw=raw,
            hard_deadline=hard,
            attributes=raw.attributes,
            group=raw.group,
        )

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        """Turn a ``MemoryRecord`` (``message.raw``) back into a Message."""
        if not isinstance(raw, MemoryRecord):
            raise TypeError(f"MemoryQueue.adopt() takes a MemoryRecord, got {type(raw).__name__}")
        if visibility_timeout is not None:
            seconds = check_seconds("visibility_timeout", visibility_timeout)
            raw = raw._replace(visibility_timeout=seconds)
        with self._lock:
            record = self._records.get(raw.id)
            cap_at = None if record is None else record.cap_at
        return self._message(raw, cap_at)

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        if not handles:
            return []
        if not (is_seconds(timeout) and 0 < timeout <= self.max_visibility):
            why = f"extend by {timeout!r}s is outside (0, {self.max_visibility:g}]s (not sent)"
            return [Outcome("fatal", detail=f"InvalidArgument: {why}")] * len(handles)
        with self._lock:
            self._check_batch("extend", handles)
            now = self.clock.now()
            out: list[Outcome] = []
            for handle in handles:
                found = self._check(handle)
                if isinstance(found, Outcome):
                    out.append(found)
                    continue
                if found.cap_at is not None and now + timeout > found.cap_at:
                    out.append(Outcome("capped", detail="total visibility beyond the cap"))
                    continue
                self._hide(found, now + timeout)
                if self.rotates_receipts:
                    out.append(Outcome("ok", receipt=self._new_receipt(found)))
                else:
                    out.append(OK)
            return out

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        # One handle - the register + complete hot path's case - is done inline,
        # without the Condition wrapper (a delete never waits).
        if len(handles) == 1:
            message_id, receipt = handles[0]
            mutex = self._mutex
            mutex.acquire()  # not ``with``: half the cost in CPython 3.11
            try:
                found = self._records.get(message_id)
                if found is None or receipt != found.receipt:
                    self._single_refused += 1
                    return [_refusal(found)]
                # Gone from _records is gone: receive and _promote skip what is not
                # there, so its heap entries and version need no update.
                del self._records[message_id]
                self._order.deleted(found, self._lock)
                self.deleted_count += 1
                if self.history:
                    self.deleted_ids.append(message_id)
                return [OK]
            finally:
                mutex.release()
        if not handles:
            return []
        with self._mutex:
            self._check_batch("delete", handles)
            return [self._delete_one(message_id, receipt) for message_id, receipt in handles]

    def _delete_one(self, message_id: str, receipt: str) -> Outcome:
        found = self._records.get(message_id)
        if found is None or receipt != found.receipt:
            return _refusal(found)
        del self._records[message_id]
        found.version += 1
        found.in_ready = False
        self._order.deleted(found, self._lock)
        self.deleted_count += 1
        self._batch_deleted += 1
        if self.history:
            self.deleted_ids.append(message_id)
        return OK

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        if not handles:
            return []
        if not (is_seconds(delay) and delay >= 0):
            why = f"release delay {delay!r}s is not a number >= 0 (not sent)"
            return [Outcome("fatal", detail=f"InvalidArgument: {why}")] * len(handles)
        delay = min(delay, self.max_visibility)
        with self._lock:
            self._check_batch("release", handles)
            now = self.clock.now()
            out: list[Outcome] = []
            for handle in handles:
                found = self._check(handle)
                if isinstance(found, Outcome):
                    out.append(found)
                    continue
                if delay > 0:
                    self._hide(found, now + delay)
                else:
                    found.version += 1
                    found.visible_at = now
                    if not found.in_ready:
                        self._order.visible(found)
                if self.rotates_receipts:
                    self._new_receipt(found)  # the old receipt dies with the release
                out.append(OK)
            self._lock.notify_all()
            return out

    def _check_batch(self, operation: str, handles: Sequence[Handle]) -> None:
        # Called with the lock held. Whole-call errors are caller bugs, as SQS's
        # TooManyEntriesInBatchRequest is.
        if len(handles) > self.max_batch:
            raise ValueError(
                f"{operation}: {len(handles)} entries exceed max_batch ({self.max_batch})"
            )
        self._calls[operation] += 1
        self._entries[operation] += len(handles)


def _check_group(group_id: object, delay: float, fifo: bool) -> None:
    """``send``'s ``group_id``: a non-empty str or None; required on a FIFO queue, which
    takes no delay."""
    if group_id is not None and (not isinstance(group_id, str) or not group_id):
        raise ValueError(f"group_id must be a non-empty str, got {group_id!r}")
    if fifo:
        if group_id is None:
            raise ValueError("a FIFO queue needs group_id (its message group) for send")
        if delay:
            raise ValueError("a FIFO queue takes no per-message delay: send with delay=0")


class _Arrival:
    """A standard MemoryQueue's visible records, in the order they became visible.
    Its queue's lock guards it (as ``_GroupOrder``, whose methods these are too)."""

    def __init__(self) -> None:
        # May still hold a record deleted or hidden again since it was made visible
        # (``take`` and ``count`` skip those).
        self.ready: deque[_Stored] = deque()

    def sent(self, record: _Stored) -> None:
        """``record`` was sent (it is visible now, or later)."""

    def visible(self, record: _Stored) -> None:
        """``record`` is visible: a receive may hand it out."""
        record.in_ready = True
        self.ready.append(record)

    def deleted(self, record: _Stored, waiters: threading.Condition) -> None:
        """``record`` was deleted (``waiters``: the long polls of its queue)."""

    def count(self, records: Mapping[str, _Stored]) -> int:
        """How many records are visible (each once)."""
        return len({id(r) for r in self.ready if r.in_ready and r.id in records})

    def take(self, most: int, records: Mapping[str, _Stored]) -> list[_Stored]:
        """Up to ``most`` visible records to hand out, the oldest first."""
        chosen: list[_Stored] = []
        ready = self.ready
        while ready and len(chosen) < most:
            record = ready.popleft()
            if record.id in records and record.in_ready:
                chosen.append(record)
        return chosen


class _GroupOrder:
    """A FIFO MemoryQueue's messages by group, each group in the order sent (a dict
    keeps the groups' order). A group is here while it has a message not deleted.
    Its queue's lock guards it."""

    def __init__(self) -> None:
        self.groups: dict[str, deque[_Stored]] = {}
        self.ready: deque[_Stored] = deque()  # (none: a group's are in the group)

    def sent(self, record: _Stored) -> None:
        assert record.group is not None
        self.groups.setdefault(record.group, deque()).append(record)

    def visible(self, record: _Stored) -> None:
        record.in_ready = True  # (found in its group)

    def deleted(self, record: _Stored, waiters: threading.Condition) -> None:
        """``record`` was deleted: its group may be handed out again, so a long poll
        waiting on ``waiters`` wakes."""
        assert record.group is not None
        records = self.groups.get(record.group)
        if records is not None:
            records.remove(record)
            if not records:
                del self.groups[record.group]
        waiters.notify_all()

    def count(self, records: Mapping[str, _Stored]) -> int:
        return sum(record.in_ready for record in records.values())

    def take(self, most: int, records: Mapping[str, _Stored]) -> list[_Stored]:
        """Up to ``most`` visible records: each group's in order, from groups with
        nothing in flight, as many of a group as there are before the next group's."""
        chosen: list[_Stored] = []
        for group in self.groups.values():
            if len(chosen) >= most:
                break
            # In flight: received and hidden. The received records lead their group
            # (it is handed out in order): the look stops at the first never received.
            locked = False
            for record in group:
                if not record.receive_count:
                    break
                if not record.in_ready:
                    locked = True
                    break
            if locked:
                continue
            for record in group:
                if len(chosen) >= most or not record.in_ready:
                    break
                chosen.append(record)
        return chosen


_named: dict[str, MemoryQueue] = {}
_named_lock = threading.Lock()


def named_queue(name: str, **options: Any) -> MemoryQueue:
    """The process-wide MemoryQueue ``name`` (``memory://name``), made with
    ``options`` on first use; options for a queue that exists already are a
    ValueError (they would be silently ignored)."""
    with _named_lock:
        queue = _named.get(name)
        if queue is not None and options:
            raise ValueError(f"memory://{name} exists already: options apply when it is first made")
        if queue is None:
            queue = _named[name] = MemoryQueue(name=name, **options)
        return queue
