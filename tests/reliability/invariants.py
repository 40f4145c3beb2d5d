"""The five reliability invariants, checked against what really reached the queue.

``QueueSpy`` sits between a ``FaultyBackend`` and its ``MemoryQueue`` and records
what the queue itself saw: every delete (when, from which thread), every call
that arrived while the message was already visible (an *exposure*: another
consumer could have received it), every non-ok answer, every receipt issued.
``InvariantChecker`` is the manager's ``on_lost`` and is told when a handler
succeeded; ``check()`` then verifies, at any point of a run:

1. a message is deleted only after its handler returned successfully (and never
   from the scheduler or its dispatch pool);
2. while the backend answers within the retry budget, no leased message becomes
   visible to another consumer: an active lease's message is invisible in the
   queue, its local deadline is never later than the queue's, no call arrives
   after the message became visible, and a competing consumer never receives it;
3. every lease that ends lost or abandoned is reported - ``lease.lost`` set,
   ``on_lost`` called exactly once, counted in stats - within one timer interval
   of leasekeeper learning it (the answer that said so, or the deadline passing);
4. the scheduler thread survives (``scheduler_alive``);
5. after ``close()`` no leasekeeper thread is left, no lease is left active unless
   ``release=False`` was asked, and nothing calls the queue any more
   (``check_closed``).

The crash tests with real processes can reuse ``QueueSpy`` (its delete log,
exposures, accepted-operation log and receipt list), ``CompetingConsumer`` and
``leasekeeper_threads``/``wait_gone``/``scheduler_alive``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from leasekeeper import Handle, Lease, LeaseManager, LeaseState, LostReason, Message, Outcome
from leasekeeper.backends.base import ForwardingBackend, Operation
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import FaultyBackend

EPS = 1e-6


@dataclass(frozen=True)
class Delete:
    message_id: str
    at: float
    thread: str


@dataclass(frozen=True)
class Exposure:
    """A call with the message's current receipt arrived after it had become visible."""

    message_id: str
    operation: str
    visible_since: float
    arrived_at: float


@dataclass(frozen=True)
class Applied:
    """An entry the queue accepted (answered ok): what it changed, and when."""

    operation: str
    message_id: str
    arg: float  # extend: the timeout; release: the delay
    at: float


@dataclass(frozen=True)
class Answer:
    operation: str
    kind: str
    message_id: str
    at: float


class QueueSpy(ForwardingBackend):
    """A Backend over a MemoryQueue that records what the queue saw (see module doc)."""

    def __init__(self, queue: MemoryQueue) -> None:
        super().__init__(queue)
        self.queue = queue
        self.clock = queue.clock
        self.deletes: list[Delete] = []
        self.exposures: list[Exposure] = []
        self.answers: list[Answer] = []  # non-ok answers only
        self.applied: list[Applied] = []  # ok answers
        self.receipts: set[str] = set()  # every receipt the queue ever issued
        self.calls: Counter[str] = Counter()
        self._lock = threading.Lock()
        issue = queue._new_receipt

        def recording(record: Any) -> str:
            receipt = issue(record)
            with self._lock:
                self.receipts.add(receipt)
            return receipt

        queue._new_receipt = recording  # type: ignore[method-assign]

    # Backend API -------------------------------------------------------------
    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        return self._observe("extend", handles, timeout)

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        return self._observe("delete", handles, 0.0)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        return self._observe("release", handles, delay)

    def rotate_receipt(self, message_id: str) -> bool:
        """Used by FaultyBackend's "stale" fault: the current receipt dies now."""
        queue = self.queue
        with queue._lock:
            record = queue._records.get(message_id)
            if record is None or not record.receipt:
                return False
            queue._new_receipt(record)
            return True

    def _observe(
        self, operation: Operation, handles: Sequence[Handle], arg: float
    ) -> list[Outcome]:
        queue = self.queue
        thread = threading.current_thread().name
        with queue._lock:  # an RLock: the queue's own call re-enters it
            now = self.clock.now()
            for handle in handles:
                record = queue._records.get(handle.message_id)
                if (
                    record is not None
                    and record.receipt == handle.receipt
                    and record.visible_at <= now
                ):
                    exposure = Exposure(handle.message_id, operation, record.visible_at, now)
                    with self._lock:
                        self.exposures.append(exposure)
            outcomes = self.forward(operation, handles, arg)
        with self._lock:
            self.calls[operation] += 1
            for handle, outcome in zip(handles, outcomes, strict=True):
                if outcome.kind != "ok":
                    self.answers.append(Answer(operation, outcome.kind, handle.message_id, now))
                    continue
                self.applied.append(Applied(operation, handle.message_id, arg, now))
                if operation == "delete":
                    self.deletes.append(Delete(handle.message_id, now, thread))
        return outcomes

    def inner_lost(self) -> int:
        with self._lock:
            return sum(1 for a in self.answers if a.kind == "lost")

    def record(self, message_id: str) -> Any:
        """The queue's stored record (None once deleted)."""
        with self.queue._lock:
            return self.queue._records.get(message_id)

    def __repr__(self) -> str:
        return f"QueueSpy({self.queue!r})"


@dataclass(frozen=True)
class Report:
    lease: Lease
    reason: LostReason
    at: float
    thread: str


@dataclass
class InvariantChecker:
    """Checks invariants 1-3 and 5 during and after a run. See the module docstring.

    ``timing_faults=True`` (latency beyond the budget, hangs) turns exposures,
    competing receives and late reports into figures instead of violations.
    """

    spy: QueueSpy
    tick: float
    faulty: FaultyBackend | None = None
    slack: float = EPS  # real-thread runs pass a tolerance for a loaded machine
    timing_faults: bool = False
    manager: LeaseManager | None = None
    max_lease_duration: float | None = None
    reports: list[Report] = field(default_factory=list)
    successes: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    leases: list[Lease] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    stolen_while_active: list[str] = field(default_factory=list)
    late_reports: list[str] = field(default_factory=list)
    exempt: set[str] = field(default_factory=set)  # message ids hit by an out-of-budget fault
    _seen: set[int] = field(default_factory=set)
    _deletes_checked: int = 0
    _reports_checked: int = 0
    _exposures_checked: int = 0
    _reported: Counter[int] = field(default_factory=Counter)
    _verified: set[int] = field(default_factory=set)
    _ended_seen: dict[int, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    # hooks ---------------------------------------------------------------
    def attach(self, manager: LeaseManager) -> LeaseManager:
        self.manager = manager
        self.max_lease_duration = manager.config.max_lease_duration
        return manager

    def on_lost(self, lease: Lease, reason: LostReason) -> None:
        report = Report(lease, reason, self.spy.clock.now(), threading.current_thread().name)
        with self._lock:
            self.reports.append(report)

    def succeeded(self, message_id: str) -> None:
        """A handler returned successfully for this message (before it is completed)."""
        with self._lock:
            self.successes[message_id].append(self.spy.clock.now())

    def track(self, lease: Lease) -> Lease:
        with self._lock:
            if id(lease) not in self._seen:
                self._seen.add(id(lease))
                self.leases.append(lease)
        return lease

    def stolen(self, messages: Iterable[Message]) -> None:
        """Another consumer received these: none may be under an active lease."""
        with self._lock:
            active = {lease.id for lease in self.leases if lease.state is LeaseState.ACTIVE}
        for message in messages:
            if message.id in active and not self._closed():
                text = f"(2) {message.id} received by another consumer while its lease was active"
                if self.timing_faults or message.id in self.exempt:
                    self.stolen_while_active.append(message.id)
                else:
                    self.violations.append(text)

    def _closed(self) -> bool:
        return self.manager is not None and self.manager.closed

    def _fail(self, text: str) -> None:
        if text not in self.violations:
            self.violations.append(text)

    # checks ----------------------------------------------------------------
    def check(self, *, full: bool = True, final: bool = False) -> None:
        """Check everything; ``full=False`` leaves out the stats snapshot (costly).
        ``final``: the run is over, nothing may still be on its way."""
        now = self.spy.clock.now()
        with self._lock:
            leases = list(self.leases)
            reports = list(self.reports)
        self._check_deletes()
        if not self._closed():
            self._check_active(leases, now)
        self._check_reports(leases, reports, final=final)
        if full:
            self._check_stats(leases, reports)

    def _check_deletes(self) -> None:
        deletes = self.spy.deletes
        while self._deletes_checked < len(deletes):
            delete = deletes[self._deletes_checked]
            self._deletes_checked += 1
            with self._lock:
                times = list(self.successes.get(delete.message_id, ()))
            if not any(t <= delete.at + EPS for t in times):
                self._fail(f"(1) {delete.message_id} deleted before any handler succeeded")
            if delete.thread.startswith(("leasekeeper-scheduler", "leasekeeper-dispatch")):
                self._fail(f"(1) {delete.message_id} deleted from {delete.thread}")

    def _check_active(self, leases: list[Lease], now: float) -> None:
        for lease in leases:
            if lease.state is not LeaseState.ACTIVE or lease.id in self.exempt:
                continue
            record = self.spy.record(lease.id)
            if record is None:
                self._fail(f"(2) {lease.id} is active but the message was deleted")
                continue
            if lease.visible_until > record.visible_at + EPS:
                self._fail(
                    f"(2) {lease.id}: local deadline {lease.visible_until:.3f} is later than "
                    f"the queue's {record.visible_at:.3f} (rule 1)"
                )
            if record.visible_at <= now and not self.timing_faults:
                self._fail(f"(2) {lease.id} is active but visible in the queue at {now:.3f}")
        exposures = self.spy.exposures
        while self._exposures_checked < len(exposures):
            exposure = exposures[self._exposures_checked]
            self._exposures_checked += 1
            if not self.timing_faults and exposure.message_id not in self.exempt:
                late = exposure.arrived_at - exposure.visible_since
                self._fail(
                    f"(2) {exposure.operation} of {exposure.message_id} arrived "
                    f"{late:.3f}s after it became visible"
                )

    def _learned_at(self, report: Report) -> float | None:
        """When leasekeeper could first know what the report says, or None if unknown."""
        lease, reason = report.lease, report.reason
        detail = lease.reason or ""
        if reason == LostReason.LAPSED and detail.startswith("lapsed: no successful extend"):
            return lease.visible_until
        if reason == LostReason.ABANDONED and self.max_lease_duration is not None:
            return lease.registered_at + self.max_lease_duration
        if reason in (LostReason.REJECTED, LostReason.FATAL, LostReason.CAPPED) and not (
            detail.startswith("capped: the service's limit")
        ):
            times = [
                a.at
                for a in self.spy.answers
                if a.message_id == lease.id and a.at <= report.at + EPS
            ]
            if self.faulty is not None:
                times += [
                    e.at
                    for e in list(self.faulty.events)
                    if lease.id in e.message_ids and e.at <= report.at + EPS
                ]
            return max(times) if times else None
        return None  # superseded at register, or the cap computed by the scheduler

    def _check_reports(
        self, leases: list[Lease], reports: list[Report], *, final: bool = False
    ) -> None:
        # Each report is checked once, when first seen; ended leases once they are
        # verified (an ended lease never becomes active again).
        while self._reports_checked < len(reports):
            report = reports[self._reports_checked]
            self._reports_checked += 1
            lease = report.lease
            self._reported[id(lease)] += 1
            if self._reported[id(lease)] > 1:
                self._fail(f"(3) {lease.id} reported {self._reported[id(lease)]} times")
            if lease.state not in (LeaseState.LOST, LeaseState.ABANDONED, LeaseState.COMPLETED):
                self._fail(f"(3) {lease.id} reported lost but is {lease.state}")
            learned = self._learned_at(report)
            if learned is not None and report.at - learned > self.tick + self.slack:
                text = (
                    f"(3) {lease.id} reported {report.at - learned:.3f}s after leasekeeper "
                    f"could know ({report.reason})"
                )
                if self.timing_faults or lease.id in self.exempt:
                    self.late_reports.append(text)
                else:
                    self._fail(text)
        now = self.spy.clock.now()
        for lease in leases:
            if id(lease) in self._verified or lease.state not in (
                LeaseState.LOST,
                LeaseState.ABANDONED,
            ):
                continue
            told = lease.lost.is_set() and self._reported[id(lease)] == 1
            if not told and not final and self.slack > EPS:
                # Real threads: the state changes a moment before the report is sent
                # (outside the manager's locks); give it one timer interval.
                first = self._ended_seen.setdefault(id(lease), now)
                if now - first <= self.tick + self.slack:
                    continue
            self._verified.add(id(lease))
            if not lease.lost.is_set():
                self._fail(f"(3) {lease.id} is {lease.state} but lease.lost is not set")
            if self._reported[id(lease)] != 1:
                self._fail(
                    f"(3) {lease.id} is {lease.state} but was reported "
                    f"{self._reported[id(lease)]} times"
                )

    def _check_stats(self, leases: list[Lease], reports: list[Report]) -> None:
        manager = self.manager
        if manager is None:
            return
        stats = manager.stats()
        states = Counter(lease.state for lease in leases)
        if len(reports) != stats.lost + stats.abandoned:
            self._fail(
                f"(3) {len(reports)} on_lost reports but stats say lost={stats.lost} "
                f"abandoned={stats.abandoned}"
            )
        expected = {
            "registered": len(leases),
            "in_flight": states[LeaseState.ACTIVE],
            "completed": states[LeaseState.COMPLETED],
            "lost": states[LeaseState.LOST],
            "released": states[LeaseState.RELEASED],
        }
        for name, value in expected.items():
            if getattr(stats, name) != value:
                self._fail(f"stats.{name}={getattr(stats, name)} but the leases say {value}")
        # An abandoned lease may still complete while its message is invisible.
        late_completed = stats.abandoned - states[LeaseState.ABANDONED]
        if not 0 <= late_completed <= states[LeaseState.COMPLETED]:
            self._fail(f"stats.abandoned={stats.abandoned} inconsistent with the leases")

    def check_closed(
        self,
        *,
        release: bool,
        threads_before: set[threading.Thread],
        grace: float = 0.0,
        allow_active: Iterable[str] = (),
    ) -> None:
        """Invariant 5, right after ``manager.close(release=...)``."""
        leftover = wait_gone(leasekeeper_threads() - threads_before, grace)
        if leftover:
            self._fail(f"(5) leasekeeper threads alive after close(): {sorted(leftover)}")
        allowed = set(allow_active)
        if release:
            for lease in list(self.leases):
                if lease.state is LeaseState.ACTIVE and lease.id not in allowed:
                    self._fail(f"(5) {lease.id} still active after close(release=True)")
        self.check(final=True)

    def assert_ok(self) -> None:
        assert not self.violations, "\n".join(self.violations[:20])


class CompetingConsumer:
    """Another consumer polling the queue directly (real threads), as ``with`` block.

    Whatever it receives goes through ``checker.stolen`` (invariant 2); it keeps the
    ids and never deletes or releases (the messages come back after 30 s)."""

    def __init__(self, queue: MemoryQueue, checker: InvariantChecker, poll: float = 0.02) -> None:
        self.queue = queue
        self.checker = checker
        self.poll = poll
        self.got: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="competing-consumer", daemon=True)

    def __enter__(self) -> CompetingConsumer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self.queue.receive(max_messages=10, visibility_timeout=30.0)
            if got:
                self.checker.stolen(got)
                self.got.extend(m.id for m in got)
            self._stop.wait(self.poll)


def leasekeeper_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("leasekeeper-")}


def wait_gone(threads: Iterable[threading.Thread], timeout: float) -> list[str]:
    """Join ``threads`` for up to ``timeout`` seconds in all; the names still alive."""
    deadline = time.monotonic() + timeout
    alive = []
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
        if thread.is_alive():
            alive.append(thread.name)
    return alive


def scheduler_alive(manager: LeaseManager) -> bool:
    """Invariant 4: a running manager on a real clock still has its scheduler thread."""
    never_started = manager.stats().registered == 0
    return manager.closed or never_started or manager.running
