"""The handler's operations on their own: ``HandlerOps`` over a renewal engine (its
``Ledger``), the ``Calls`` and the ``OpGate``, on a ManualClock."""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

from leasekeeper import (
    BackendError,
    Lease,
    LeaseConfig,
    LeaseError,
    LeaseLost,
    LeaseState,
    LostReason,
    Outcome,
)
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.engine._calls import Calls
from leasekeeper.engine._engine import RenewalEngine
from leasekeeper.engine._handler_ops import HandlerOps
from leasekeeper.testing import ManualClock
from tests.helpers import ScriptedBackend

CONFIG = LeaseConfig(
    visibility_timeout=30, timer_interval=1, minimal_life=2, release_delay=5, release_backoff=2
)


class Rig:
    def __init__(self, backend: Any, clock: ManualClock) -> None:
        calls = Calls(on_error=lambda: None)
        self.engine = RenewalEngine(CONFIG, clock, calls)
        self.ops = HandlerOps(
            self.engine,
            self.engine.gate,
            calls,
            config=CONFIG,
            clock=clock,
            rng=random.Random(3),
            lock=self.engine.lock,
        )
        self.make = Lease.maker(self.ops)
        self.backend = backend
        self.clock = clock

    def lease(self, body: str = "job") -> Lease:
        self.backend.inner.send(body)
        (message,) = self.backend.receive(visibility_timeout=30)
        lease = self.engine.register(message, self.make)
        assert isinstance(lease, Lease)
        return lease


@pytest.fixture
def rig(clock: ManualClock) -> Rig:
    return Rig(ScriptedBackend(MemoryQueue(30, clock=clock)), clock)


@pytest.fixture
def rotating_rig(clock: ManualClock) -> Rig:
    return Rig(ScriptedBackend(MemoryQueue(30, clock=clock, rotate_receipts=True)), clock)


def test_complete_deletes_once(rig: Rig) -> None:
    lease = rig.lease()
    rig.ops.complete(lease)
    rig.ops.complete(lease)  # a second time: nothing sent
    assert lease.state is LeaseState.COMPLETED and not lease.busy
    assert len(rig.backend.calls_of("delete")) == 1
    assert rig.backend.inner.deleted_ids == [lease.id]


def test_complete_after_the_deadline_sends_nothing_where_receipts_do_not_rotate(
    rig: Rig, rotating_rig: Rig
) -> None:
    lease = rig.lease()
    rig.clock.skip(31)  # unrenewed past its deadline
    with pytest.raises(LeaseLost) as lost:
        rig.ops.complete(lease)
    assert lost.value.lost_reason is LostReason.LAPSED
    assert rig.backend.calls_of("delete") == [] and lease.state is LeaseState.LOST
    # Where receipts rotate the service itself vouches for the receipt: sent, deleted.
    other = rotating_rig.lease()
    rotating_rig.clock.skip(31)
    rotating_rig.ops.complete(other)
    assert other.state is LeaseState.COMPLETED


@pytest.mark.parametrize(
    ("answer", "raised", "reason"),
    [
        (Outcome("lost", detail="ReceiptHandleIsInvalid"), LeaseLost, LostReason.REJECTED),
        (Outcome("fatal", detail="AccessDenied"), BackendError, LostReason.FATAL),
    ],
)
def test_a_refused_delete_raises_and_ends_the_lease(
    rig: Rig, answer: Outcome, raised: type[Exception], reason: LostReason
) -> None:
    lease = rig.lease()
    rig.backend.script("delete", answer)
    with pytest.raises(raised):
        rig.ops.complete(lease)
    assert lease.lost_reason is reason and not lease.busy


def test_a_transient_delete_is_retried_then_succeeds(rig: Rig) -> None:
    lease = rig.lease()
    rig.backend.script("delete", Outcome("retry", detail="Throttling"))
    rig.ops.complete(lease)
    assert lease.state is LeaseState.COMPLETED
    assert len(rig.backend.calls_of("delete")) == 2


def test_a_delete_that_keeps_failing_reaches_the_handler_and_the_lease_goes_on(rig: Rig) -> None:
    lease = rig.lease()
    rig.backend.script("delete", *[Outcome("retry", detail="Throttling")] * 4)
    with pytest.raises(BackendError):
        rig.ops.complete(lease)
    assert lease.state is LeaseState.ACTIVE and not lease.busy and lease.gen  # rescheduled
    rig.ops.abandon(lease, "delete failed: left to lapse")
    assert lease.lost_reason is LostReason.DELETE_FAILED and lease.signalled


def test_release_waits_out_its_delay_and_grows_it_per_receive(rig: Rig) -> None:
    first = rig.lease()
    rig.ops.release(first, None)
    assert 4 <= rig.backend.calls_of("release")[-1][2] <= 6  # release_delay, jittered
    rig.clock.advance(5.1)
    (message,) = rig.backend.receive(visibility_timeout=30)
    second = rig.engine.register(message, rig.make)
    assert isinstance(second, Lease) and second.receive_count == 2
    rig.ops.release(second, None)
    assert 8 <= rig.backend.calls_of("release")[-1][2] <= 12  # x2 on the second receive
    with pytest.raises(LeaseError, match="completed"):
        third = rig.lease("other")
        rig.ops.complete(third)
        rig.ops.release(third, None)


def test_forget_waits_for_the_lease_to_be_free(rig: Rig) -> None:
    lease = rig.lease()
    assert rig.engine.gate.try_take([lease]) == [lease]  # an extend is out
    done = threading.Event()
    forgetter = threading.Thread(target=lambda: (rig.ops.forget(lease), done.set()))
    forgetter.start()
    assert not done.wait(0.2)
    rig.engine.gate.give_all([lease])  # the extend came back
    assert done.wait(30)
    assert lease.state is LeaseState.FORGOTTEN and not lease.busy
