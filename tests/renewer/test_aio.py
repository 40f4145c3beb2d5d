"""leasekeeper.aio on each cloud backend's local service, in both renewer modes.

A coroutine's lease is renewed off the event loop (the manager's scheduler thread,
or the renewer process), so a handler that blocks the loop keeps its message; a
loss noticed there reaches the loop.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import pytest

from leasekeeper import LeaseLost, LeaseState, Message, aio
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.base import Backend
from tests.renewer.conftest import Leasing
from tests.renewer.test_lease_api import wait_for

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 120))


class Competitor:
    """Another consumer of the queue, long-polling it the whole time from a thread."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.received: list[str] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="competitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self.backend.receive(max_messages=10, wait_seconds=1, visibility_timeout=30)
            self.received += [m.id for m in got]
            self.polls += 1

    def __enter__(self) -> Competitor:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


def test_an_async_worker_keeps_long_jobs_while_one_blocks_the_loop(leasing: Leasing) -> None:
    for body in ("blocks the loop", "awaits", "awaits too"):
        leasing.subject.send(body)
    started: set[str] = set()
    done: list[str] = []

    async def main() -> Any:
        all_started = asyncio.Event()
        competitor: list[Competitor] = []

        async def handler(message: Message) -> None:
            started.add(message.id)
            if len(started) == 3:
                all_started.set()
            await all_started.wait()
            if message.body == "blocks the loop":
                time.sleep(5)  # 5 s on a 4 s timeout, with the loop standing still
            else:
                await asyncio.sleep(5)
            done.append(str(message.body))
            if len(done) == 3:
                worker.stop()

        worker = AsyncWorker(leasing.manager, handler, concurrency=3, wait_seconds=1)
        running = asyncio.ensure_future(worker.run())
        await all_started.wait()
        with Competitor(leasing.subject.backend) as spy:
            competitor.append(spy)
            stats = await running
        return stats, competitor[0]

    stats, spy = run(main())
    assert sorted(done) == ["awaits", "awaits too", "blocks the loop"]
    assert spy.polls > 0 and spy.received == [], "a leased message reached another consumer"
    assert (stats.completed, stats.failed, stats.lost) == (3, 0, 0)
    manager_stats = leasing.manager.stats()
    assert manager_stats.lapses == 0 and manager_stats.lost == 0
    assert manager_stats.extended >= 3  # each job outlived its 4 s timeout
    assert leasing.manager.leases() == []


def test_an_async_lease_is_renewed_then_deleted(leasing: Leasing) -> None:
    leasing.subject.send("job")
    (message,) = leasing.receive()

    async def main() -> aio.AsyncLease:
        async with aio.lease(message, manager=leasing.manager) as held:
            deadline = time.monotonic() + 30
            while held.extensions < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)  # the loop is free; renewals happen elsewhere
            assert leasing.subject.backend.receive(max_messages=1) == []  # still ours
        return held

    held = run(main())
    assert held.extensions >= 2 and held.state is LeaseState.COMPLETED
    stats = leasing.manager.stats()
    assert (stats.completed, stats.lost, stats.lapses) == (1, 0, 0)


def test_a_loss_reaches_the_coroutine(leasing: Leasing) -> None:
    leasing.subject.send("job")
    (message,) = leasing.receive()

    async def main() -> None:
        async with aio.lease(message, manager=leasing.manager, cancel_on_lost=True):
            # Someone else deletes it with our receipt: the next extend is refused.
            assert leasing.subject.backend.delete([message.handle])[0].kind == "ok"
            await asyncio.sleep(60)  # cancelled by the loss long before this ends

    with pytest.raises(LeaseLost):
        run(main())
    # on_lost runs on the manager's callback thread: the cancellation may come first.
    wait_for(lambda: leasing.lost)
    assert leasing.lost[0][0].id == message.id
