"""Observers hear of every backend call, extension, lapse and ended lease."""

from __future__ import annotations

from typing import Any

import pytest

from leasekeeper import LeaseManager, LeaseState, Outcome
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.observers import CallEvent, Observer
from leasekeeper.testing import Faults, FaultyBackend, ManualClock
from tests.helpers import ScriptedBackend


class Recorder(Observer):
    def __init__(self) -> None:
        self.calls: list[CallEvent] = []
        self.extended: list[tuple[str, float]] = []
        self.lapses: list[tuple[str, float]] = []
        self.ended: list[tuple[str, str, str]] = []

    def on_call(self, event: CallEvent) -> None:
        self.calls.append(event)

    def on_extended(self, lease: Any, headroom: float) -> None:
        self.extended.append((lease.message.id, headroom))

    def on_lapse(self, lease: Any, late: float) -> None:
        self.lapses.append((lease.message.id, late))

    def on_ended(self, lease: Any, state: LeaseState, reason: str) -> None:
        self.ended.append((lease.message.id, state.value, reason))


def test_calls_extensions_and_endings_are_told(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    for i in range(3):
        scripted.inner.send(f"job {i}")
    manager = make_manager(scripted)
    recorder = Recorder()
    manager.add_observer(recorder)
    a, b, c = (manager.register(m) for m in scripted.receive(max_messages=3))
    clock.advance(21)  # one batch extend of all three, 10 s before their deadline
    assert [(e.operation, e.entries, e.outcomes) for e in recorder.calls] == [
        ("extend", 3, ("ok", "ok", "ok"))
    ]
    assert sorted(h for _, h in recorder.extended) == [pytest.approx(10.0)] * 3
    a.complete()
    b.release(5)
    scripted.script("extend", Outcome("lost", detail="MessageNotExist"))
    clock.advance(20)
    operations = [(e.operation, e.outcomes) for e in recorder.calls[1:]]
    assert operations == [("delete", ("ok",)), ("release", ("ok",)), ("extend", ("lost",))]
    assert all(e.seconds >= 0 and e.error is None for e in recorder.calls)
    assert recorder.ended == [
        (a.id, "completed", "completed"),
        (b.id, "released", "released (delay 5s)"),
        (c.id, "lost", "rejected: MessageNotExist"),
    ]


def test_a_call_that_raises_is_told_with_its_error_type(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    recorder = Recorder()
    manager.add_observer(recorder)
    manager.register(scripted.receive()[0])
    scripted.script("extend", ConnectionResetError("reset"), "malformed")
    clock.advance(21)
    errors = [(e.operation, e.error, e.outcomes) for e in recorder.calls[:2]]
    assert errors == [
        ("extend", "ConnectionResetError", ("retry",)),
        ("extend", "malformed", ("retry",)),
    ]


def test_lapses_are_told_with_how_late(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    manager = LeaseManager(queue, clock=clock, visibility_timeout=30)
    recorder = Recorder()
    manager.add_observer(recorder)
    queue.send("job")
    lease = manager.register(queue.receive()[0])
    manager.close(release=False)
    clock.advance(35)
    with pytest.raises(Exception, match="lapsed"):
        lease.complete()
    assert recorder.lapses == [(lease.id, pytest.approx(5.0))]
    assert recorder.ended[-1][1] == "lost"


def test_an_observer_that_raises_is_counted_and_harms_nothing(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    class Broken(Observer):
        def on_call(self, event: CallEvent) -> None:
            raise RuntimeError("observer bug")

    manager = make_manager(queue)
    manager.add_observer(Broken())
    queue.send("job")
    lease = manager.register(queue.receive()[0])
    clock.advance(21)
    lease.complete()
    assert lease.state is LeaseState.COMPLETED
    assert lease.extensions == 1
    assert manager.stats().callback_errors == 2  # the extend call, the delete call


def test_a_removed_observer_hears_nothing_more(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    manager = make_manager(queue)
    recorder = Recorder()
    manager.add_observer(recorder)
    manager.remove_observer(recorder)
    manager.remove_observer(recorder)  # twice: nothing happens
    queue.send("job")
    manager.register(queue.receive()[0]).complete()
    assert recorder.calls == [] and recorder.ended == []
    with pytest.raises(TypeError):
        manager.add_observer(object())  # type: ignore[arg-type]


def test_latency_is_measured_per_call(clock: ManualClock) -> None:
    queue = MemoryQueue(30, clock=clock)
    faulty = FaultyBackend(queue, seed=1, clock=clock, extend=Faults())
    manager = LeaseManager(faulty, clock=clock, visibility_timeout=30)
    recorder = Recorder()
    manager.add_observer(recorder)
    queue.send("job")
    manager.register(faulty.receive()[0])
    clock.advance(21)
    (event,) = recorder.calls
    assert event.backend is faulty and event.entries == 1
