"""What a worker's receive loop tells its listeners - once a busy spell, never once a
message - and the drain an interruption notice starts (``drain(deadline)``), on
``Worker`` and ``AsyncWorker``."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest

from leasekeeper import Message, Worker
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.contract import Backend
from leasekeeper.backends.forwarding import ForwardingBackend
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.receiving import WorkerListener
from leasekeeper.testing import ManualClock
from tests.core.test_worker import drive


class Heard(WorkerListener):
    """Every moment told, with the thread that told it."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.threads: set[str] = set()
        self.changed = threading.Condition()

    def _hear(self, event: str) -> None:
        with self.changed:
            self.events.append(event)
            self.threads.add(threading.current_thread().name)
            self.changed.notify_all()

    def started(self) -> None:
        self._hear("started")

    def busy(self) -> None:
        self._hear("busy")

    def idle(self) -> None:
        self._hear("idle")

    def draining(self) -> None:
        self._hear("draining")

    def stopped(self) -> None:
        self._hear("stopped")

    def wait_for(self, count: int) -> list[str]:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.events) >= count, 30), self.events
            return list(self.events)


@pytest.mark.realtime
def test_one_busy_spell_is_one_busy_and_one_idle_whatever_the_messages() -> None:
    queue = MemoryQueue(30.0)
    queue.send_many([f"job-{i}" for i in range(30)])
    heard = Heard()
    worker = Worker(queue, lambda m: None, concurrency=2, wait_seconds=0.05, renewer="thread")
    worker.listeners.add(heard)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert heard.wait_for(3) == ["started", "busy", "idle"]
        assert worker.stats.completed == 30
        queue.send_many(["later-1", "later-2"])  # a second spell
        assert heard.wait_for(5)[3:] == ["busy", "idle"]
    finally:
        worker.stop(30)
    assert heard.events == ["started", "busy", "idle", "busy", "idle", "draining", "stopped"]


@pytest.mark.realtime
def test_an_async_worker_tells_them_off_its_event_loop() -> None:
    queue = MemoryQueue(30.0)
    queue.send_many(["a", "b", "c"])
    heard = Heard()

    async def handler(message: Message) -> None:
        await asyncio.sleep(0)

    worker = AsyncWorker(queue, handler, wait_seconds=0.05, renewer="thread")
    worker.listeners.add(heard)

    async def main() -> None:
        await worker.run(until_idle=0.5)

    asyncio.run(asyncio.wait_for(main(), 60))
    assert heard.events == ["started", "busy", "idle", "draining", "stopped"]
    assert heard.threads and all(name.startswith("leasekeeper-aio") for name in heard.threads)


@pytest.mark.realtime
def test_a_listener_that_raises_is_logged_and_the_worker_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    class Broken(WorkerListener):
        def busy(self) -> None:
            raise RuntimeError("listener bug")

    queue = MemoryQueue(30.0)
    queue.send_many(["a", "b"])
    heard = Heard()
    worker = Worker(queue, lambda m: None, wait_seconds=0.05, renewer="thread")
    worker.listeners.add(Broken())
    worker.listeners.add(heard)
    worker.run(until_idle=0.5)
    assert worker.stats.completed == 2
    assert heard.events == ["started", "busy", "idle", "draining", "stopped"]
    assert "worker listener" in caplog.text and "listener bug" in caplog.text
    with pytest.raises(TypeError, match="WorkerListener"):
        worker.listeners.add(object())  # type: ignore[arg-type]


class HeldReceive(ForwardingBackend):
    """A queue whose next receive waits until the test lets it answer."""

    def __init__(self, inner: Backend) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.answer = threading.Event()

    def receive(self, *args: Any, **kwargs: Any) -> list[Message]:
        self.entered.set()
        assert self.answer.wait(30)
        return super().receive(*args, **kwargs)


@pytest.mark.realtime
def test_what_a_receive_brings_after_stop_was_asked_is_given_back_unhandled(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="leasekeeper.worker")
    inner = MemoryQueue(30.0)
    queue = HeldReceive(inner)
    handled: list[str] = []
    worker = Worker(queue, lambda m: handled.append(m.body), wait_seconds=0.05, renewer="thread")
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert queue.entered.wait(30)  # the long poll is out
        inner.send_many(["late-1", "late-2"])
        worker.drain()
        queue.answer.set()  # it brings both
        thread.join(30)
    finally:
        queue.answer.set()
        worker.stop(30)
    assert handled == [] and worker.stats.received == 0
    assert inner.visible_count() == 2  # visible again at once
    assert "2 message(s) came in as the worker stopped: given back" in caplog.text


def test_drain_gives_handlers_until_its_deadline_then_releases(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    queue.send("long")
    running, finish = threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        running.set()
        finish.wait(30)

    worker = Worker(
        queue,
        handler,
        wait_seconds=1.0,
        shutdown_timeout=300.0,
        clock=clock,
        visibility_timeout=30.0,
        timer_interval=1.0,
        minimal_life=2.0,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert running.wait(30)
        began = clock.now()
        worker.drain(began + 20.0)
        worker.drain(began + 50.0)  # a later deadline never moves it back
        assert worker.drain_deadline == began + 20.0
        drive(clock, thread)
    finally:
        finish.set()
        thread.join(30)
    # Released at its deadline (not after shutdown_timeout): visible again at once.
    assert 20.0 <= clock.now() - began < 25.0
    assert queue.visible_count() == 1 and worker.stats.completed == 0
