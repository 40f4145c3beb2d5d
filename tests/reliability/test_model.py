"""Model-based test: random interleavings of everything a LeaseManager meets.

A hypothesis ``RuleBasedStateMachine`` drives a LeaseManager over a MemoryQueue on
a ManualClock: send, receive (ours and a competing consumer's), register,
complete, release, scripted faults on any call, clock advances and close, in any
order. A reference model of the queue (which messages exist, when each becomes
visible, how often each was received) is kept from what the test did and what
the queue accepted (the spy's log); it must agree with the queue at every step.
Each handler operation's result (return value, exception, resulting lease state)
is predicted from the lease's state, the model and the scripted fault; what the
scheduler does on its own is checked by the invariants (see ``invariants.py``):
an active lease's message is invisible, every loss has a cause and is reported
once, stats add up.

CI runs 2,000 examples; ``LEASEKEEPER_SOAK=1`` (``make soak``) runs 50,000.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from leasekeeper import (
    BackendError,
    Lease,
    LeaseError,
    LeaseLost,
    LeaseManager,
    LeaseState,
    LeaseTooShort,
    LostReason,
    ManagerClosed,
    Message,
)
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import FaultyBackend, ManualClock
from tests.reliability.invariants import EPS, InvariantChecker, QueueSpy

VIS = 30.0
TICK = 1.0
MIN_LIFE = 2.0
SHAPES = ("short", "long", "empty", "none", "tuple", "strings", "dicts")  # all "transient"

settings.register_profile(
    "leasekeeper-ci",
    max_examples=2000,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.register_profile(
    "leasekeeper-soak",
    # About an hour on 2 cores; LEASEKEEPER_SOAK_EXAMPLES sets another count.
    max_examples=int(os.environ.get("LEASEKEEPER_SOAK_EXAMPLES", "50000")),
    stateful_step_count=60,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
PROFILE = "leasekeeper-soak" if os.environ.get("LEASEKEEPER_SOAK") == "1" else "leasekeeper-ci"

# A handler operation's scripted fault: the plans its backend calls get, in order.
OP_PLANS = {
    "pass": [],
    "lost": ["lost"],
    "fatal": ["fatal"],
    "stale": ["stale"],
    "retry-then-ok": ["retry"],
    "throttled-out": ["throttle"] * 4,
    "exceptions-out": ["exception"] * 4,
    "malformed-then-ok": ["malformed"],
}
EXTEND_PLANS = (
    "pass",
    "lost",
    "fatal",
    "capped",
    "stale",
    "retry",
    "throttle",
    "exception",
    "malformed",
)
TRANSIENT = ("retry", "throttle", "exception", "malformed")


@dataclass
class Stored:
    visible_at: float
    received: int = 0


class QueueModel:
    """The reference: which messages exist and when each becomes visible."""

    def __init__(self) -> None:
        self.messages: dict[str, Stored] = {}
        self.deleted: set[str] = set()

    def visible(self, now: float) -> set[str]:
        return {i for i, m in self.messages.items() if m.visible_at <= now}

    def received(self, ids: list[str], now: float, visibility: float) -> None:
        for message_id in ids:
            stored = self.messages[message_id]
            stored.visible_at = now + visibility
            stored.received += 1

    def apply(self, operation: str, message_id: str, arg: float, at: float) -> None:
        if operation == "delete":
            del self.messages[message_id]
            self.deleted.add(message_id)
        else:  # extend: arg is the timeout; release: the delay
            self.messages[message_id].visible_at = at + arg


class LeaseMachine(RuleBasedStateMachine):
    # What the examples of a run got to exercise (so a run cannot pass vacuously).
    seen: ClassVar[Counter[str]] = Counter()

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        self.model = QueueModel()
        self.unregistered: list[Message] = []  # received by us, not registered yet
        self.leases: list[Lease] = []
        self.thief_holds: list[Message] = []
        self.applied_seen = 0
        self.closed_with: bool | None = None
        self.steps = 0

    @initialize(
        rotate=st.booleans(),
        batch=st.sampled_from((1, 3, 10)),
        max_lease=st.sampled_from((None, None, 300.0)),
    )
    def setup(self, rotate: bool, batch: int, max_lease: float | None) -> None:
        self.queue = MemoryQueue(VIS, clock=self.clock, rotate_receipts=rotate, max_batch=batch)
        self.spy = QueueSpy(self.queue)
        self.faulty = FaultyBackend(self.spy, seed=0, clock=self.clock, malformed_forms=SHAPES)
        self.checker = InvariantChecker(self.spy, tick=TICK, faulty=self.faulty)
        self.manager = self.checker.attach(
            LeaseManager(
                self.faulty,
                clock=self.clock,
                on_lost=self.checker.on_lost,
                visibility_timeout=VIS,
                timer_interval=TICK,
                minimal_life=MIN_LIFE,
                max_lease_duration=max_lease,
                jitter_seed=0,
            )
        )

    # ------------------------------------------------------------------ helpers

    def sync(self) -> None:
        """Feed the model what the queue accepted from leasekeeper since last time."""
        applied = self.spy.applied
        while self.applied_seen < len(applied):
            entry = applied[self.applied_seen]
            self.applied_seen += 1
            self.model.apply(entry.operation, entry.message_id, entry.arg, entry.at)

    def current(self, lease: Lease) -> bool:
        """Would the queue accept this lease's receipt now?"""
        record = self.spy.record(lease.id)
        return record is not None and record.receipt == lease.receipt

    def visible_in_queue(self) -> set[str]:
        # Not queue.visible_count(): it also counts messages that left the ready
        # state without being received (see the core bug test below).
        queue = self.queue
        with queue._lock:
            queue._promote(self.clock.now())
            return {r.id for r in queue._order.ready if r.in_ready and r.id in queue._records}

    def check_queue(self) -> None:
        now = self.clock.now()
        assert len(self.queue) == len(self.model.messages)
        assert self.visible_in_queue() == self.model.visible(now)
        assert set(self.queue.deleted_ids) == self.model.deleted
        for message_id, stored in self.model.messages.items():
            assert self.queue.receive_counts.get(message_id, 0) == stored.received

    def lease_at(self, index: int) -> Lease:
        return self.leases[index % len(self.leases)]

    # ------------------------------------------------------------------ rules

    @rule(count=st.integers(1, 4))
    def fetch(self, count: int) -> None:
        """The common path: messages arrive, we receive and lease them at once."""
        self.send(count)
        self.receive(count)
        for message in list(self.unregistered[-count:]):
            self.register(self.unregistered.index(message))

    @rule(count=st.integers(1, 3))
    def send(self, count: int) -> None:
        for _ in range(count):
            message_id = self.queue.send("job")
            self.model.messages[message_id] = Stored(visible_at=self.clock.now())

    @rule(count=st.integers(1, 10))
    def receive(self, count: int) -> None:
        now = self.clock.now()
        visible = self.model.visible(now)
        got = self.faulty.receive(max_messages=count, visibility_timeout=VIS)
        ids = [m.id for m in got]
        assert set(ids) <= visible and len(ids) == min(count, len(visible))
        self.checker.stolen(got)  # none of them may be under an active lease
        self.model.received(ids, now, VIS)
        self.unregistered.extend(got)

    @rule(count=st.integers(1, 5))
    def thief_receives(self, count: int) -> None:
        now = self.clock.now()
        visible = self.model.visible(now)
        got = self.queue.receive(max_messages=count, visibility_timeout=VIS)
        ids = [m.id for m in got]
        assert set(ids) <= visible and len(ids) == min(count, len(visible))
        self.checker.stolen(got)
        self.model.received(ids, now, VIS)
        self.thief_holds.extend(got)

    @precondition(lambda self: self.thief_holds)
    @rule(index=st.integers(0, 100), delete=st.booleans())
    def thief_finishes(self, index: int, delete: bool) -> None:
        message = self.thief_holds.pop(index % len(self.thief_holds))
        record = self.spy.record(message.id)
        valid = record is not None and record.receipt == message.receipt
        if delete:
            outcome = self.queue.delete([message.handle])[0]
            if valid:
                self.checker.succeeded(message.id)
                self.model.apply("delete", message.id, 0.0, self.clock.now())
        else:
            outcome = self.queue.release([message.handle], 0.0)[0]
            if valid:
                self.model.apply("release", message.id, 0.0, self.clock.now())
        assert outcome.kind == ("ok" if valid else "lost")

    @precondition(lambda self: self.unregistered)
    @rule(index=st.integers(0, 100))
    def register(self, index: int) -> None:
        message = self.unregistered[index % len(self.unregistered)]
        remaining = message.visible_until - self.clock.now()
        before = self.manager.stats()
        if self.manager.closed:
            with pytest.raises(ManagerClosed):
                self.manager.register(message)
        elif remaining < MIN_LIFE:
            with pytest.raises(LeaseTooShort):
                self.manager.register(message)
            self.seen["register:too short"] += 1
            self.unregistered.remove(message)
        else:
            lease = self.checker.track(self.manager.register(message))
            assert lease.state is LeaseState.ACTIVE and lease.message is message
            assert self.manager.register(message) is lease  # twice: the same lease
            self.unregistered.remove(message)
            self.leases.append(lease)
            assert self.manager.stats().registered == before.registered + 1
            return
        assert self.manager.stats().registered == before.registered

    @precondition(lambda self: self.leases)
    @rule(index=st.integers(0, 100))
    def register_again(self, index: int) -> None:
        lease = self.lease_at(index)
        if lease.state is not LeaseState.ACTIVE or self.manager.closed:
            return  # registering a finished lease's message again: see test_bad_input
        assert self.manager.register(lease.message) is lease

    @precondition(lambda self: self.leases)
    @rule(index=st.integers(0, 100), plan=st.sampled_from(sorted(OP_PLANS)))
    def complete(self, index: int, plan: str) -> None:
        lease = self.lease_at(index)
        state = lease.state
        sends = (state is LeaseState.ACTIVE and not self.lapsed_unprovable(lease)) or (
            state is LeaseState.ABANDONED and self.clock.now() < lease.visible_until
        )
        calls = self.spy.calls["delete"]
        raises, after = self._expect_complete(lease, plan)
        self.faulty.script("delete", *OP_PLANS[plan])
        self.checker.succeeded(lease.id)
        try:
            if raises is None:
                lease.complete()
            else:
                with pytest.raises(raises):
                    lease.complete()
        finally:
            self.faulty.clear_script("delete")
        assert lease.state is after, (plan, state, lease.state)
        self.seen[f"complete:{state.value}->{after.value}:{getattr(raises, '__name__', 'ok')}"] += 1
        if not sends:
            assert self.spy.calls["delete"] == calls, "a finished lease called the queue"
        self.sync()

    def lapsed_unprovable(self, lease: Lease) -> bool:
        """An active lease whose deadline passed on a queue whose receipts do not
        rotate: a delete or release would prove nothing (rule 5), so it ends lost."""
        return (
            lease.state is LeaseState.ACTIVE
            and self.clock.now() >= lease.visible_until
            and not self.queue.rotates_receipts
        )

    def abandoned_but_invisible(self) -> list[int]:
        now = self.clock.now()
        return [
            i
            for i, lease in enumerate(self.leases)
            if lease.state is LeaseState.ABANDONED and now < lease.visible_until
        ]

    @precondition(lambda self: self.abandoned_but_invisible())
    @rule(plan=st.sampled_from(sorted(OP_PLANS)))
    def complete_abandoned(self, plan: str) -> None:
        """A handler finishing after renewal stopped, while the message is still hidden."""
        self.complete(self.abandoned_but_invisible()[0], plan)

    @precondition(lambda self: not self.manager.closed and self.active())
    @rule(index=st.integers(0, 100), plan=st.sampled_from(sorted(OP_PLANS)))
    def capped_then_complete(self, index: int, plan: str) -> None:
        """The service caps one lease; its handler finishes right after."""
        active = self.active()
        lease = active[index % len(active)]
        self.faulty.script("extend", "capped", message_id=lease.id)
        for _ in range(5):  # a whole-call fault may take the first extend instead
            due = self.manager.next_wakeup()
            if lease.state is not LeaseState.ACTIVE or due is None:
                break
            self.advance(max(0.0, due - self.clock.now()))
        if lease.state is LeaseState.ABANDONED and self.clock.now() < lease.visible_until:
            self.complete(self.leases.index(lease), plan)

    def active(self) -> list[Lease]:
        return [lease for lease in self.leases if lease.state is LeaseState.ACTIVE]

    def _expect_complete(
        self, lease: Lease, plan: str
    ) -> tuple[type[Exception] | None, LeaseState]:
        """What complete() raises (None: returns) and the lease's state afterwards."""
        state, now = lease.state, self.clock.now()
        if state is LeaseState.COMPLETED:
            return None, state  # a second complete does nothing
        if state is LeaseState.RELEASED:
            return (LeaseLost if lease.is_lost else LeaseError), state
        if state is LeaseState.LOST or (
            state is LeaseState.ABANDONED and now >= lease.visible_until
        ):
            return LeaseLost, state
        if self.lapsed_unprovable(lease):
            return LeaseLost, LeaseState.LOST  # rule 5: nothing is sent
        # Active, or abandoned while still invisible: the delete is sent.
        lost = LeaseState.LOST if state is LeaseState.ACTIVE else state
        if plan in ("lost", "stale"):
            return LeaseLost, lost
        if plan == "fatal":
            return BackendError, lost
        if plan in ("throttled-out", "exceptions-out"):
            return BackendError, state
        if plan != "pass" and now >= lease.visible_until:
            return BackendError, state  # no retry once the deadline has passed
        if not self.current(lease):
            return LeaseLost, lost  # the queue itself rejects the receipt
        return None, LeaseState.COMPLETED

    @precondition(lambda self: self.leases)
    @rule(
        index=st.integers(0, 100),
        plan=st.sampled_from(("pass", "lost", "fatal", "stale", "retry-then-ok", "throttled-out")),
        delay=st.sampled_from((0.0, 5.0, 60.0)),
    )
    def release(self, index: int, plan: str, delay: float) -> None:
        lease = self.lease_at(index)
        state, now = lease.state, self.clock.now()
        calls = self.spy.calls["release"]
        applied = len(self.spy.applied)
        current = self.current(lease)
        lapsed = self.lapsed_unprovable(lease)
        self.faulty.script("release", *OP_PLANS[plan])
        try:
            if state is LeaseState.COMPLETED:
                with pytest.raises(LeaseError, match="completed"):
                    lease.release(delay)
            elif lapsed:
                with pytest.raises(LeaseLost, match="lapsed"):
                    lease.release(delay)
            else:
                lease.release(delay)
        finally:
            self.faulty.clear_script("release")
        accepted = [(a.operation, a.arg) for a in self.spy.applied[applied:]]
        self.sync()
        if state is not LeaseState.ACTIVE or lapsed:
            assert lease.state is (LeaseState.LOST if lapsed else state)
            assert self.spy.calls["release"] == calls, "a finished lease called the queue"
            return
        if plan in ("lost", "stale"):
            expected, released = LeaseState.LOST, False
        elif plan in ("fatal", "throttled-out") or (plan != "pass" and now >= lease.visible_until):
            expected, released = LeaseState.RELEASED, False  # failed: left to lapse
        elif not current:
            expected, released = LeaseState.LOST, False  # the queue rejects the receipt
        else:
            expected, released = LeaseState.RELEASED, True
        assert lease.state is expected, (plan, lease.state)
        self.seen[f"release:{expected.value}:{'accepted' if released else 'not accepted'}"] += 1
        assert accepted == ([("release", delay)] if released else [])
        if expected is LeaseState.RELEASED:
            assert not lease.is_lost  # the handler released it itself: not a loss

    @rule(plan=st.sampled_from(EXTEND_PLANS), count=st.integers(1, 3))
    def script_extend(self, plan: str, count: int) -> None:
        self.faulty.script("extend", *[plan] * count)

    @rule(kind=st.sampled_from(TRANSIENT))
    def outage(self, kind: str) -> None:
        """Transient errors for longer than any lease has left (beyond the budget)."""
        self.faulty.script("extend", *[kind] * 40)

    @rule()
    def outage_ends(self) -> None:
        self.faulty.clear_script("extend")

    @rule(extra=st.sampled_from((0.0, 0.001, 1.0, 9.5)))
    def advance_to_next_due(self, extra: float) -> None:
        """Right after the scheduler acts: where handler operations race it."""
        due = self.manager.next_wakeup()
        if due is not None:
            self.advance(max(0.0, due - self.clock.now()) + extra)

    @rule(seconds=st.sampled_from((60.0, 600.0, 3600.0)))
    def advance_long(self, seconds: float) -> None:
        self.advance(seconds)

    @rule(seconds=st.sampled_from((0.0, 0.5, 5.0, 9.0, 19.0, 21.0, 60.0, 600.0)))
    def advance(self, seconds: float) -> None:
        calls = sum(self.spy.calls.values())
        self.clock.advance(seconds)
        self.sync()
        if self.manager.closed:
            assert sum(self.spy.calls.values()) == calls, "a closed manager called the queue"

    @precondition(lambda self: self.closed_with is None and self.steps >= 12)
    @rule(release=st.booleans())
    def close(self, release: bool) -> None:
        active = [lease for lease in self.leases if lease.state is LeaseState.ACTIVE]
        self.manager.close(release=release)
        self.closed_with = release
        self.seen[f"close:release={release}:active={len(active)}"] += 1
        self.sync()
        for lease in active:
            if release:
                assert lease.state is LeaseState.RELEASED and lease.is_lost
            else:
                assert lease.state is LeaseState.ACTIVE and not lease.is_lost
        assert {id(lease) for lease in self.manager.leases()} == (
            set() if release else {id(lease) for lease in active}
        )
        self.manager.close()  # twice: nothing more happens

    # ------------------------------------------------------------------ checks

    @invariant()
    def consistent(self) -> None:
        if not hasattr(self, "manager"):
            return
        self.steps += 1
        self.sync()
        self.check_queue()
        now = self.clock.now()
        # An outage longer than a lease's time is beyond the budget of invariant 2.
        transient = Counter(
            i for e in self.faulty.events if e.kind in TRANSIENT for i in e.message_ids
        )
        self.checker.exempt |= {i for i, n in transient.items() if n >= 5}
        if not self.manager.closed:
            for lease in self.leases:
                if lease.state is not LeaseState.ACTIVE or lease.id in self.checker.exempt:
                    continue
                stored = self.model.messages.get(lease.id)
                assert stored is not None, f"{lease.id} active but deleted"
                assert stored.visible_at > now, f"{lease.id} active but visible"
                assert lease.visible_until <= stored.visible_at + EPS
        self.checker.check()
        self.checker.assert_ok()
        for lease in self.leases:
            if lease.state in (LeaseState.LOST, LeaseState.ABANDONED):
                assert self._justified(lease), (lease, lease.reason)
        self.seen["stolen while active (timing)"] += len(self.checker.stolen_while_active)

    def _justified(self, lease: Lease) -> bool:
        """Every loss has a cause the test can see."""
        reason = lease.lost_reason
        detail = lease.reason or ""
        events = [e for e in self.faulty.events if lease.id in e.message_ids]
        answers = [a for a in self.spy.answers if a.message_id == lease.id]
        if reason is LostReason.REJECTED:
            return any(e.kind in ("lost", "stale") for e in events) or any(
                a.kind == "lost" for a in answers
            )
        if reason is LostReason.FATAL:
            return any(e.kind == "fatal" for e in events)
        if reason is LostReason.CAPPED:
            return any(e.kind == "capped" for e in events)
        if reason is LostReason.LAPSED and detail.startswith("lapsed: no successful extend"):
            return any(e.kind in TRANSIENT for e in events) and math.isfinite(lease.visible_until)
        if reason is LostReason.LAPSED:
            # Rule 5: the deadline passed with no extend sent in time, on a queue whose
            # receipts do not rotate. On a ManualClock only a stopped scheduler, a
            # call's latency or a hang makes an extend late.
            return not self.queue.rotates_receipts and self.clock.now() >= lease.visible_until
        if reason is LostReason.ABANDONED:
            limit = self.manager.config.max_lease_duration
            return limit is not None and self.clock.now() >= lease.registered_at + limit
        return False

    def teardown(self) -> None:
        if hasattr(self, "manager"):
            for lease in self.leases:
                detail = lease.reason or ""
                why = lease.lost_reason or detail.split(":")[0].split(" (")[0]
                self.seen[f"ended:{lease.state.value}:{why}"] += 1
                if detail.startswith("lapsed: no successful extend"):
                    self.seen["ended:lost:lapsed after transient errors"] += 1
            self.seen["extensions"] += sum(lease.extensions for lease in self.leases)
            self.manager.close(release=False)
            self.faulty.close()


@pytest.fixture(autouse=True)
def quiet_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.CRITICAL, logger="leasekeeper")


# The hang guard of the model test, in CPU seconds (see cpu_budget): it needs about
# one CPU-minute; the suite's guard is 300 s.
CPU_BUDGET = 300.0


class CpuBudgetExceeded(BaseException):
    """Not an Exception, so that hypothesis stops at once rather than take it for a
    failing example and shrink it (the guard does not fire again on a replay)."""


@contextmanager
def cpu_budget(seconds: float) -> Iterator[None]:
    """Fail the test if the process spends ``seconds`` of CPU time in it.

    pytest-timeout's limit is in wall-clock seconds, a guard against a real-time
    wait that never ends. The model test has none to guard against: on a
    ManualClock it never reads the real time, waits or starts a thread. It is
    CPU-bound, so its wall time is its CPU time divided by the share a loaded
    machine gives it: under other test runs and a CPU hog it got ~12 % of a core,
    and was cut off at 300 s, mid-run or mid-shrink (FlakyStrategyDefinition).
    A limit in CPU seconds (``ITIMER_PROF``) still ends a loop that never
    returns, and does not depend on the machine's load."""
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("cpu_budget() arms a signal: it runs on the main thread")

    def exceeded(signum: int, frame: FrameType | None) -> None:
        raise CpuBudgetExceeded(f"the test used more than {seconds:g} s of CPU")

    previous = signal.signal(signal.SIGPROF, exceeded)
    signal.setitimer(signal.ITIMER_PROF, seconds)
    try:
        yield
    except BaseException as exc:
        # Hypothesis reports an example cut short as FlakyStrategyDefinition, the
        # guard's exception only as its context: say first what happened.
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, CpuBudgetExceeded):
            cause = cause.__context__
        if cause is None or cause is exc:
            raise
        raise CpuBudgetExceeded(f"{cause} (hypothesis reported: {exc!r:.200})") from exc
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


@pytest.mark.timeout(0)  # the CPU budget below is its hang guard
def test_lease_manager_against_the_model() -> None:
    LeaseMachine.seen.clear()
    with cpu_budget(CPU_BUDGET):
        run_state_machine_as_test(LeaseMachine, settings=settings.get_profile(PROFILE))
    seen = LeaseMachine.seen
    # The examples reached every kind of ending and every handler-operation outcome.
    for needed in (
        "ended:completed:completed",
        "ended:released:released",
        "ended:released:released by close()",
        "ended:lost:rejected",
        "ended:lost:fatal",
        "ended:lost:lapsed after transient errors",
        "ended:abandoned:capped",
        "ended:abandoned:abandoned",
        "register:too short",
        "complete:active->completed:ok",
        "complete:active->lost:LeaseLost",
        "complete:active->active:BackendError",
        "complete:abandoned->completed:ok",
        "complete:released->released:LeaseError",
        "complete:released->released:LeaseLost",
        "release:lost:not accepted",
        "release:released:accepted",
        "release:released:not accepted",
    ):
        assert seen[needed] > 0, (needed, sorted(seen.items()))
    assert seen["extensions"] > 10_000


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_lease_manager_against_the_model_soak() -> None:
    run_state_machine_as_test(LeaseMachine, settings=settings.get_profile("leasekeeper-soak"))


@pytest.mark.parametrize("operation", ["delete", "extend", "release with delay"])
def test_regression_memory_queue_counts_messages_no_longer_visible(operation: str) -> None:
    """A message whose invisibility ran out sits in MemoryQueue._ready. A delete, an
    extend or a delayed release with its (still valid) receipt removes it from
    _records or hides it again, but leaves the entry in _ready: visible_count() is
    len(_ready), so it still counts it, and in_flight_count() can go negative."""
    clock = ManualClock()
    queue = MemoryQueue(30, clock=clock)
    queue.send("job")
    message = queue.receive()[0]
    clock.advance(31)  # lapsed: visible again, nobody received it yet
    assert queue.visible_count() == 1  # (looking moves it to the ready list)
    if operation == "delete":
        assert queue.delete([message.handle])[0].kind == "ok"
    elif operation == "extend":
        assert queue.extend([message.handle], 30)[0].kind == "ok"
    else:
        assert queue.release([message.handle], 60)[0].kind == "ok"
    counts = (queue.visible_count(), queue.in_flight_count())
    assert queue.receive() == []  # receive() knows it is not visible (and drops the entry)
    assert counts == (0, len(queue))
