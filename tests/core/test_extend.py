"""The extend pipeline on its own: an ``Extender`` with a recording ``Ledger``, the
``Calls`` it makes and a ManualClock - no engine, no scheduler, no threads."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from leasekeeper import LeaseConfig, LeaseState, LostReason, Outcome
from leasekeeper.backends.base import cap_margin
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.engine._calls import Calls
from leasekeeper.engine._extend import Extender
from leasekeeper.engine._gate import OpGate
from leasekeeper.engine._schedule import Lane
from leasekeeper.reasons import Ending
from leasekeeper.record import LeaseRecord
from leasekeeper.testing import ManualClock
from tests.helpers import ScriptedBackend

CONFIG = LeaseConfig(visibility_timeout=30, timer_interval=1, minimal_life=2)


class RecordingLedger:
    """A ``Ledger`` that applies endings and records everything asked of it."""

    def __init__(self) -> None:
        self.ended: list[tuple[str, LeaseState, Ending]] = []
        self.rescheduled: list[tuple[str, float | None]] = []
        self.counters: dict[str, int] = {}
        self.lapses: list[str] = []
        self.watched: list[str] = []
        self.submitted: list[tuple[Callable[..., object], tuple[Any, ...]]] = []
        self.margin_due = False

    @property
    def threshold(self) -> float:
        return CONFIG.threshold

    def end(
        self, record: LeaseRecord, state: LeaseState, ending: Ending, *, stop_handler: bool = False
    ) -> None:
        if record.state is LeaseState.ACTIVE:
            record.state, record.ending = state, ending
            self.ended.append((record.message.id, state, ending))

    def end_completed(self, record: LeaseRecord) -> None:
        raise AssertionError("the extender never completes a lease")

    def reschedule(self, record: LeaseRecord, due: float | None = None) -> None:
        self.rescheduled.append((record.message.id, due))

    def watch_deadlines(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        self.watched += [r.message.id for r in records]

    def bump(self, counter: str, n: int = 1) -> None:
        self.counters[counter] = self.counters.get(counter, 0) + n

    def count_lapses(self, records: Sequence[LeaseRecord], now: float) -> None:
        self.lapses += [r.message.id for r in records]

    def timed(self, send_lag: float, latency: float) -> bool:
        return self.margin_due

    def adapt_threshold(self, now: float) -> None:
        pass

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        self.submitted.append((fn, args))

    def drain(self) -> None:
        pass


class Rig:
    def __init__(self, backend: Any, clock: ManualClock, config: LeaseConfig = CONFIG) -> None:
        self.backend = backend
        self.clock = clock
        self.ledger = RecordingLedger()
        self.gate = OpGate(threading.Lock(), clock.now)
        self.extender = Extender(
            Calls(on_error=lambda: None),
            self.ledger,  # type: ignore[arg-type]
            self.gate,
            config=config,
            clock=clock,
            rng=random.Random(7),
        )
        self.lane = Lane(backend)

    def lease(self, body: str = "job") -> LeaseRecord:
        queue = self.backend.inner if isinstance(self.backend, ScriptedBackend) else self.backend
        queue.send(body)
        (message,) = self.backend.receive(visibility_timeout=30)
        return LeaseRecord(None, message, self.clock.now())

    def extend(self, *records: LeaseRecord) -> None:
        self.extender.extend_batch(self.lane, list(records))


@pytest.fixture
def sqs_like(clock: ManualClock) -> Rig:
    return Rig(ScriptedBackend(MemoryQueue(30, clock=clock)), clock)


@pytest.fixture
def rotating_rig(clock: ManualClock) -> Rig:
    return Rig(ScriptedBackend(MemoryQueue(30, clock=clock, rotate_receipts=True)), clock)


def test_a_due_lease_is_extended_from_just_before_the_send(sqs_like: Rig) -> None:
    record = sqs_like.lease()
    sqs_like.clock.advance(21)
    sent_at = sqs_like.clock.now()
    sqs_like.extend(record)
    assert record.visible_until == sent_at + 30  # rule 1
    assert record.extensions == 1 and record.state is LeaseState.ACTIVE
    assert sqs_like.ledger.rescheduled == [(record.message.id, None)]
    assert sqs_like.ledger.watched == [record.message.id]  # watched while the call was out
    assert sqs_like.ledger.counters == {"extend_calls": 1, "extended": 1}
    assert not record.busy  # given back


def test_a_lease_whose_deadline_passed_is_lost_unsent_where_receipts_do_not_rotate(
    sqs_like: Rig,
) -> None:
    record = sqs_like.lease()
    sqs_like.clock.advance(31)
    sqs_like.extend(record)
    assert sqs_like.backend.calls_of("extend") == []  # its answer would prove nothing
    ((mid, state, ending),) = sqs_like.ledger.ended
    assert (mid, state, ending.lost_reason) == (
        record.message.id,
        LeaseState.LOST,
        LostReason.LAPSED,
    )
    assert sqs_like.ledger.lapses == [record.message.id]


def test_where_receipts_rotate_a_late_extend_is_sent_and_believed(rotating_rig: Rig) -> None:
    record = rotating_rig.lease()
    rotating_rig.clock.advance(31)
    rotating_rig.extend(record)
    assert len(rotating_rig.backend.calls_of("extend")) == 1
    assert record.state is LeaseState.ACTIVE and record.extensions == 1
    assert rotating_rig.ledger.lapses == [record.message.id]  # still counted


@pytest.mark.parametrize(
    ("answer", "state", "reason"),
    [
        (Outcome("lost", detail="ReceiptHandleIsInvalid"), LeaseState.LOST, LostReason.REJECTED),
        (Outcome("fatal", detail="AccessDenied"), LeaseState.LOST, LostReason.FATAL),
        (Outcome("capped", detail="TooLong"), LeaseState.ABANDONED, LostReason.CAPPED),
    ],
)
def test_definitive_answers_end_the_lease_with_their_reason(
    sqs_like: Rig, answer: Outcome, state: LeaseState, reason: LostReason
) -> None:
    record = sqs_like.lease()
    sqs_like.clock.advance(21)
    sqs_like.backend.script("extend", answer)
    sqs_like.extend(record)
    ((_, ended_state, ending),) = sqs_like.ledger.ended
    assert (ended_state, ending.lost_reason) == (state, reason)
    assert answer.detail in ending.detail


def test_a_transient_answer_is_retried_before_the_deadline_then_lapses(sqs_like: Rig) -> None:
    record = sqs_like.lease()
    sqs_like.clock.advance(21)
    sqs_like.backend.script("extend", Outcome("retry", detail="Throttling"))
    sqs_like.extend(record)
    ((_, due),) = sqs_like.ledger.rescheduled
    assert due is not None and sqs_like.clock.now() < due <= record.visible_until
    assert (record.retries, record.last_error) == (1, "Throttling")
    # Still failing at the deadline: lapsed, with the last error in its words.
    sqs_like.clock.advance(record.visible_until - sqs_like.clock.now())
    sqs_like.backend.script("extend", Outcome("retry", detail="Throttling"))
    sqs_like.extend(record)
    ((_, state, ending),) = sqs_like.ledger.ended
    assert (state, ending.lost_reason) == (LeaseState.LOST, LostReason.LAPSED)
    assert "Throttling" in ending.detail


def test_the_services_cap_ends_the_lease_capped_without_a_call(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock, visibility_cap=50)
    rig = Rig(ScriptedBackend(queue), clock)
    record = rig.lease()
    clock.advance(21)
    rig.extend(record)  # asks only up to the cap: 50 s after the receive, less its margin
    cap = record.registered_at + 50 - cap_margin(50)  # min(60 s, 2 %), as SQS's
    assert record.visible_until == pytest.approx(cap, abs=1e-6)
    clock.advance(25)
    rig.extend(record)
    ((_, state, ending),) = rig.ledger.ended
    assert (state, ending.lost_reason) == (LeaseState.ABANDONED, LostReason.CAPPED)
    assert len(rig.backend.calls_of("extend")) == 1


def test_max_lease_duration_abandons_the_lease(clock: ManualClock) -> None:
    config = LeaseConfig(
        visibility_timeout=30, timer_interval=1, minimal_life=2, max_lease_duration=60
    )
    rig = Rig(ScriptedBackend(MemoryQueue(30, clock=clock)), clock, config)
    record = rig.lease()
    clock.advance(61)
    record.visible_until = clock.now() + 10  # still hidden: only the duration is up
    rig.extend(record)
    ((_, state, ending),) = rig.ledger.ended
    assert (state, ending.lost_reason) == (LeaseState.ABANDONED, LostReason.ABANDONED)


def test_a_busy_lease_is_skipped_and_left_to_its_operation(sqs_like: Rig) -> None:
    record = sqs_like.lease()
    sqs_like.clock.advance(21)
    assert sqs_like.gate.try_take([record]) == [record]  # a handler's delete is out
    sqs_like.extend(record)
    assert sqs_like.backend.calls_of("extend") == [] and record.extensions == 0
    assert record.busy  # still the handler's


def test_a_late_success_on_a_lease_that_ended_meanwhile_is_handed_back(rotating_rig: Rig) -> None:
    record = rotating_rig.lease()
    rotating_rig.clock.advance(21)
    rotating_rig.backend.hold("extend")
    worker = threading.Thread(target=rotating_rig.extend, args=(record,))
    worker.start()
    assert rotating_rig.backend.entered["extend"].wait(10)
    rotating_rig.ledger.end(record, LeaseState.LOST, Ending(LostReason.LAPSED, "watch fired"))
    rotating_rig.backend.let_go("extend")
    worker.join(10)
    ((hand_back, args),) = rotating_rig.ledger.submitted
    hand_back(*args)  # the message is hidden with nobody on it: released at once
    assert rotating_rig.backend.inner.visible_count() == 1


@pytest.mark.parametrize(
    ("lag", "latency", "advice"),
    [(6.0, 0.1, "renewer='process'"), (0.1, 6.0, "raise extend_threshold")],
)
def test_the_margin_warning_advises_what_fits_the_cause(
    lag: float, latency: float, advice: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("WARNING", logger="leasekeeper.manager")
    Extender._warn_margin(lag, latency, 10.0)
    (line,) = [r.getMessage() for r in caplog.records]
    assert advice in line
