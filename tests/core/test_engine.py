"""The renewal engine on its own, on a ManualClock: registry, schedule, endings, the
report of losses - through its named methods, as its collaborators use it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from leasekeeper import Lease, LeaseConfig, LeaseState, LeaseTooShort, LostReason, ManagerClosed
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.engine._calls import Calls
from leasekeeper.engine._engine import RenewalEngine
from leasekeeper.reasons import Ending
from leasekeeper.record import LeaseRecord
from leasekeeper.testing import ManualClock

CONFIG = LeaseConfig(visibility_timeout=30, timer_interval=1, minimal_life=2)


def make_engine(clock: ManualClock, **kwargs: Any) -> tuple[RenewalEngine, list[Any]]:
    told: list[Any] = []
    engine = RenewalEngine(
        CONFIG,
        clock,
        Calls(on_error=lambda: None),
        on_lost=lambda record, reason: told.append((record.message.id, reason)),
        **kwargs,
    )
    return engine, told


make = Lease.maker(None)  # the records a manager's engine makes (weakly referenced)


def test_a_registered_lease_is_due_a_threshold_before_its_deadline(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.send("job")
    engine, _ = make_engine(clock)
    (message,) = queue.receive()
    record = engine.register(message, make)
    assert engine.get(message) is record and engine.count() == 1
    assert record.due == pytest.approx(message.visible_until - CONFIG.threshold)
    assert engine.next_wakeup() == pytest.approx(record.due)
    clock.advance(30 - CONFIG.threshold + 0.5)  # its due time passes: it is extended
    assert record.extensions == 1 and queue.calls["extend"] == 1
    engine.stop(None)


def test_registering_the_same_message_twice_returns_the_same_lease(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.send("job")
    engine, _ = make_engine(clock)
    (message,) = queue.receive()
    assert engine.register(message, make) is engine.register(message, make)
    assert engine.stats().registered == 1


def test_a_message_received_again_supersedes_the_old_lease(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.send("job")
    engine, told = make_engine(clock)
    (first,) = queue.receive()
    old = engine.register(first, make)
    clock.skip(31)  # it came back without a renewal (the engine did not run)
    (again,) = queue.receive()
    new = engine.register(again, make)
    assert new is not old and old.state is LeaseState.LOST
    assert old.lost_reason is LostReason.SUPERSEDED and old.signalled
    assert told == [(first.id, LostReason.SUPERSEDED)]


def test_too_short_and_closed_are_refused(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.send_many(["a", "b"])
    engine, _ = make_engine(clock)
    a, b = queue.receive(max_messages=2)
    clock.skip(29)
    with pytest.raises(LeaseTooShort):
        engine.register(a, make)
    engine.stop(None)
    with pytest.raises(ManagerClosed):
        engine.register(b, make)


def test_an_ending_is_counted_by_reason_and_told_outside_the_lock(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.send_many(["a", "b", "c"])
    engine, told = make_engine(clock)
    a, b, c = (engine.register(m, make) for m in queue.receive(max_messages=3))
    engine.end(a, LeaseState.LOST, Ending(LostReason.REJECTED, "rejected: gone"))
    engine.end(b, LeaseState.ABANDONED, Ending(LostReason.CAPPED, "capped: 12 h"))
    engine.end(c, LeaseState.RELEASED, Ending(None, "released"))
    engine.end(a, LeaseState.COMPLETED, Ending(None, "completed"))  # ended: nothing
    assert told == []  # queued, not told under the lock
    assert engine.has_pending()
    engine.drain()
    assert told == [(a.message.id, LostReason.REJECTED), (b.message.id, LostReason.CAPPED)]
    assert a.signalled and b.signalled and not c.signalled  # its own release: no signal
    stats = engine.stats()
    assert (stats.lost, stats.abandoned, stats.capped, stats.released) == (1, 1, 1, 1)
    assert stats.lost_reasons == {"rejected": 1, "capped": 1}
    assert stats.in_flight == 0


def test_an_on_lost_that_raises_is_counted_and_the_engine_goes_on(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.send("a")

    def broken(record: LeaseRecord, reason: LostReason) -> None:
        raise RuntimeError("a bug in the callback")

    engine = RenewalEngine(CONFIG, clock, Calls(on_error=lambda: None), on_lost=broken)
    record = engine.register(queue.receive()[0], make)
    engine.end(record, LeaseState.LOST, Ending(LostReason.REJECTED, "rejected"))
    engine.drain()
    assert engine.stats().callback_errors == 1


def test_a_message_that_arrives_shorter_than_the_threshold_is_due_at_once_and_said_once(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    # A queue whose own timeout (5 s) is below extend_threshold (10 s): not a lag.
    queue = MemoryQueue(5, clock=clock)
    queue.send_many(["a", "b"])
    engine, _ = make_engine(clock)
    caplog.set_level(logging.WARNING, logger="leasekeeper.manager")
    records = [engine.register(m, make) for m in queue.receive(max_messages=2)]
    assert all(record.due < clock.now() for record in records)  # due already
    clock.run_due()
    assert all(record.extensions == 1 for record in records)  # extended at once
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "less than extend_threshold" in warnings[0]
    # What to do, in what the docs show: receive through the manager, or the queue's own.
    assert "manager.receive(), a Worker: they ask for visibility_timeout, 30s" in warnings[0]
    assert "set the queue's own visibility timeout to 30s" in warnings[0]
    assert engine.stats().send_lag_p99 == 0.0  # late only from its registration: not late
    assert engine.stats().margin_warnings == 0


def test_a_deadline_that_passes_while_the_extend_is_out_ends_the_lease(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.send("a")
    engine, told = make_engine(clock)
    record = engine.register(queue.receive()[0], make)
    with engine.lock:
        work = engine.collect_locked(record.due)  # popped for an extend...
    ((lane, records),) = work
    engine.watch_deadlines(lane, records)  # ...whose call is out...
    clock.skip(31)
    with engine.lock:
        assert engine.collect_locked(clock.now()) == []  # ...past the deadline
    engine.drain()
    assert record.lost_reason is LostReason.LAPSED
    assert told == [(record.message.id, LostReason.LAPSED)]
