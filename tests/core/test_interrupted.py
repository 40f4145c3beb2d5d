"""A handler interrupted - Ctrl-C's KeyboardInterrupt, SystemExit, a cancellation - did
not fail. In ``with held:``, ``lease()``, ``@leased``, the workers and aio its message
is released at once (no release delay), is never sent to the dead-letter queue
whatever its receive count, is not counted as a failure, and no failure or poison
advice is said. On MemoryQueue with a ManualClock: nothing waits in real time."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import leasekeeper
from leasekeeper import LeaseManager, LeaseState, Message, Worker, aio
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import ManualClock
from tests.core.test_worker import drive, run_in_thread
from tests.helpers import ScriptedBackend

TIMING = {"visibility_timeout": 30.0, "timer_interval": 1.0, "minimal_life": 2.0}
# On its last try with a dead-letter queue: a failure now would dead-letter it.
POISON = {"max_receives": 1, "release_delay": 60.0}


class Queues:
    """A queue (its calls recorded) with one message, and a dead-letter queue."""

    def __init__(self, clock: ManualClock) -> None:
        self.queue = ScriptedBackend(MemoryQueue(30, clock=clock, name="jobs"))
        self.dead = MemoryQueue(30, clock=clock, name="jobs-dead")
        self.sent = self.queue.inner.send("a job")

    def released_at_once(self) -> None:
        """The message was released with no delay, is visible again, and was never
        dead-lettered."""
        assert [delay for *_, delay in self.queue.calls_of("release")] == [0.0]
        assert self.queue.inner.visible_count() == 1
        assert len(self.dead) == 0


@pytest.fixture
def queues(clock: ManualClock) -> Queues:
    return Queues(clock)


@pytest.fixture
def said(caplog: pytest.LogCaptureFixture) -> Iterator[Callable[[], list[str]]]:
    """What leasekeeper said at WARNING or above."""
    caplog.set_level(logging.INFO, logger="leasekeeper")
    yield lambda: [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("leasekeeper") and r.levelno >= logging.WARNING
    ]


INTERRUPTIONS = [KeyboardInterrupt, SystemExit, GeneratorExit]


@pytest.mark.parametrize("interruption", INTERRUPTIONS, ids=lambda e: e.__name__)
@pytest.mark.parametrize("form", ["with held", "manager.lease", "lease()", "@leased"])
def test_an_interrupted_block_releases_its_message_at_once(
    clock: ManualClock,
    queues: Queues,
    said: Callable[[], list[str]],
    form: str,
    interruption: type[BaseException],
) -> None:
    manager = LeaseManager(queues.queue, clock=clock, dead_letter=queues.dead, **POISON, **TIMING)
    leasekeeper.configure(clock=clock, **POISON, **TIMING)  # (no dead-letter queue there)
    try:
        [message] = queues.queue.receive()
        if form == "with held":
            held = manager.register(message)
            with pytest.raises(interruption), held:
                raise interruption()
        elif form == "manager.lease":
            with pytest.raises(interruption), manager.lease(message) as held:
                raise interruption()
        elif form == "lease()":
            with pytest.raises(interruption), leasekeeper.lease(message) as held:
                raise interruption()
        else:

            @leasekeeper.leased
            def handle(message: Message) -> None:
                raise interruption()

            with pytest.raises(interruption):
                handle(message)
        queues.released_at_once()
        assert said() == []
    finally:
        manager.close()
        leasekeeper.shutdown()


def test_an_ordinary_failure_still_fails(
    clock: ManualClock, queues: Queues, said: Callable[[], list[str]]
) -> None:
    """The other side: an Exception on the last try is a poison message."""
    manager = LeaseManager(queues.queue, clock=clock, dead_letter=queues.dead, **POISON, **TIMING)
    [held] = manager.receive()
    with pytest.raises(ValueError), held:
        raise ValueError("fails")
    assert len(queues.dead) == 1 and held.state is LeaseState.COMPLETED
    assert any("handler failed" in line for line in said())
    manager.close()


def test_a_worker_handler_that_exits_is_interrupted_not_failed(
    clock: ManualClock, queues: Queues, said: Callable[[], list[str]]
) -> None:
    """``sys.exit()`` in a ``Worker``'s handler: its message released at once, counted
    ``interrupted``; the worker goes on and ends as ever."""
    runs: list[int] = []

    def handle(message: Message) -> None:
        runs.append(message.receive_count)
        if len(runs) == 1:
            raise SystemExit(3)

    worker = Worker(
        queues.queue, handle, wait_seconds=1, clock=clock, dead_letter=queues.dead,
        **POISON, **TIMING,
    )  # fmt: skip
    thread, out = run_in_thread(worker.run, until_idle=5)
    drive(clock, thread)
    stats = out[0]
    assert (stats.received, stats.interrupted, stats.failed, stats.completed) == (2, 1, 0, 1)
    assert runs == [1, 2]  # back at once, done on its second receive
    assert [delay for *_, delay in queues.queue.calls_of("release")] == [0.0]
    assert len(queues.dead) == 0 and said() == []


def test_an_async_worker_handler_interrupted_releases_at_once_and_stops_the_loop(
    clock: ManualClock, queues: Queues, said: Callable[[], list[str]]
) -> None:
    """A KeyboardInterrupt raised in an ``AsyncWorker``'s handler stops its loop, as it
    would have; its message goes back at once, not counted as a failure."""

    async def handle(message: Message) -> None:
        raise KeyboardInterrupt

    worker = AsyncWorker(
        queues.queue, handle, wait_seconds=1, clock=clock, dead_letter=queues.dead,
        **POISON, **TIMING,
    )  # fmt: skip
    out: list[Any] = []

    def run() -> None:
        try:
            asyncio.run(worker.run(until_idle=5))
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    drive(clock, thread)
    # The handler's task keeps its KeyboardInterrupt (asyncio's own "never retrieved"
    # report): finalised here, not in the middle of whatever runs next.
    gc.collect()
    assert [type(exc) for exc in out] == [KeyboardInterrupt]
    queues.released_at_once()
    assert (worker.stats.interrupted, worker.stats.failed) == (1, 0)
    assert said() == []


@pytest.mark.parametrize("interruption", [asyncio.CancelledError, KeyboardInterrupt])
def test_an_interrupted_async_block_releases_its_message_at_once(
    clock: ManualClock,
    queues: Queues,
    said: Callable[[], list[str]],
    interruption: type[BaseException],
) -> None:
    manager = LeaseManager(queues.queue, clock=clock, dead_letter=queues.dead, **POISON, **TIMING)
    [message] = queues.queue.receive()

    async def body() -> None:
        async with aio.lease(message, manager=manager):
            raise interruption()

    with pytest.raises(interruption):
        asyncio.run(body())
    manager.flush(5)
    queues.released_at_once()
    assert said() == []
    manager.close()


def test_an_interrupted_handler_on_a_fifo_queue_goes_back_at_once_in_order(
    clock: ManualClock, said: Callable[[], list[str]]
) -> None:
    """On a FIFO queue the interrupted message goes back at once with the later
    messages of its group the worker held, and the group is done again in order - a
    failure would have kept them away for ``release_delay`` (60 s here)."""
    queue = MemoryQueue(30.0, clock=clock, fifo=True)
    for n in range(3):
        queue.send(f"a:{n}", group_id="a")
    order: list[str] = []

    def handle(message: Message) -> None:
        order.append(str(message.body))
        if order == ["a:0"]:
            raise SystemExit

    worker = Worker(queue, handle, concurrency=2, wait_seconds=1, clock=clock, **POISON, **TIMING)
    thread, out = run_in_thread(worker.run, until_idle=5)
    drive(clock, thread)
    stats = out[0]
    assert order == ["a:0", "a:0", "a:1", "a:2"]
    assert (stats.interrupted, stats.failed, stats.completed) == (1, 0, 3)
    assert len(queue) == 0 and said() == []
