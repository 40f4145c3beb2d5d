"""The asyncio scenario of issue 15, on moto at a 2 s visibility timeout.

An AsyncWorker runs 10 jobs of 3 s, one of which blocks the event loop for 3 s
(``time.sleep`` inside the coroutine); another consumer polls the queue directly,
with its own boto3 client, the whole time: it receives none of them, and all are
deleted. ``async with lease(msg)`` (the per-process default manager) held for 3 s
is renewed, then deletes.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

import leasekeeper
from leasekeeper import LeaseState, Message, aio
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.sqs import SQSBackend
from tests.renewer.conftest import RENEWERS
from tests.services import CHILD_ENV, make_client

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

T = TypeVar("T")
# Renewed when 1.2 s of the 2 s remain: room for a late wake-up on a loaded machine.
TIMING: dict[str, Any] = {
    "visibility_timeout": 2,
    "timer_interval": 0.2,
    "minimal_life": 0.5,
    "extend_threshold": 1.2,
}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 120))


class Spy:
    """A second consumer polling the queue with its own client, from a thread."""

    def __init__(self, endpoint: str, url: str) -> None:
        self.client = make_client(endpoint)
        self.url = url
        self.received: list[str] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqs-spy", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            response = self.client.receive_message(
                QueueUrl=self.url, MaxNumberOfMessages=10, VisibilityTimeout=30, WaitTimeSeconds=1
            )
            self.polls += 1
            self.received += [m["MessageId"] for m in response.get("Messages", [])]

    def __enter__(self) -> Spy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.fixture
def queue_url(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in CHILD_ENV.items():  # for a renewer process's own client
        monkeypatch.setenv(name, value)
    admin = make_client(moto_endpoint)
    url: str = admin.create_queue(
        QueueName=f"aio-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "2"}
    )["QueueUrl"]
    yield url
    admin.delete_queue(QueueUrl=url)


def counts(client: Any, url: str) -> tuple[int, int]:
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


@pytest.mark.parametrize("renewer", RENEWERS)
def test_ten_jobs_of_3s_one_blocking_the_loop(
    moto_endpoint: str, queue_url: str, renewer: str
) -> None:
    client = make_client(moto_endpoint)
    for i in range(10):
        client.send_message(QueueUrl=queue_url, MessageBody=f"job {i}")
    started: set[str] = set()
    done: list[str] = []
    seen: list[Any] = []  # the manager's stats as the last job ends (before it closes)

    async def main() -> Any:
        all_started = asyncio.Event()

        async def handler(message: Message) -> None:
            started.add(message.id)
            if len(started) == 10:
                all_started.set()
            await all_started.wait()
            if message.body == "job 0":
                time.sleep(3)  # blocks the event loop for 3 s
            else:
                await asyncio.sleep(3)
            done.append(message.id)
            if len(done) == 10:
                seen.append(worker.manager.stats())
                worker.stop()

        worker = AsyncWorker(
            SQSBackend(client, queue_url), handler, concurrency=10, renewer=renewer, **TIMING
        )
        running = asyncio.ensure_future(worker.run())
        await all_started.wait()
        with Spy(moto_endpoint, queue_url) as spy:
            stats = await running
        return stats, spy

    stats, spy = run(main())
    assert spy.polls > 0 and spy.received == [], "a leased message reached another consumer"
    assert (stats.received, stats.completed, stats.failed, stats.lost) == (10, 10, 0, 0)
    assert len(set(done)) == 10
    assert seen[0].lapses == 0 and seen[0].lost == 0
    assert seen[0].extended >= 10  # every job outlived its 2 s timeout
    assert counts(client, queue_url) == (0, 0)  # all deleted


def test_async_with_lease_held_for_3s_is_renewed_then_deleted(
    moto_endpoint: str, queue_url: str
) -> None:
    client = make_client(moto_endpoint)
    client.send_message(QueueUrl=queue_url, MessageBody="job")
    backend = SQSBackend(client, queue_url)
    leasekeeper.shutdown(release=False)
    leasekeeper.configure(**TIMING)
    try:
        (message,) = backend.receive(max_messages=1, wait_seconds=1)

        async def main() -> aio.AsyncLease:
            with Spy(moto_endpoint, queue_url) as spy:
                async with aio.lease(message) as held:  # the default manager
                    await asyncio.sleep(3)
            assert spy.received == []
            return held

        held = run(main())
    finally:
        leasekeeper.shutdown()
        leasekeeper.configure()
    assert held.extensions >= 1 and held.state is LeaseState.COMPLETED
    assert counts(client, queue_url) == (0, 0)
