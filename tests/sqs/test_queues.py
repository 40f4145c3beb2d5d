"""One worker on two SQS queues (moto's server): weights, an empty queue, and the
renewer process renewing both queues' messages."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from leasekeeper import Message, Worker
from leasekeeper.backends.sqs import SQSBackend
from tests.sqs.conftest import CHILD_ENV, count_calls, make_client

pytestmark = pytest.mark.realtime


def fill(backend: SQSBackend, prefix: str, count: int) -> None:
    for start in range(0, count, 10):
        backend.client.send_message_batch(
            QueueUrl=backend.queue_url,
            Entries=[
                {"Id": str(n), "MessageBody": f"{prefix} {n}"}
                for n in range(start, min(count, start + 10))
            ],
        )


def test_two_queues_by_weight_every_message_once(
    moto_endpoint: str, make_queue: Callable[..., str]
) -> None:
    heavy = SQSBackend(make_client(moto_endpoint), make_queue(visibility_timeout=30))
    light = SQSBackend(make_client(moto_endpoint), make_queue(visibility_timeout=30))
    fill(heavy, "heavy", 150)
    fill(light, "light", 150)
    order: list[str] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        with lock:
            order.append(str(message.body))

    worker = Worker(
        [heavy, light],
        handler,
        weights=[3, 1],
        batch_size=1,
        concurrency=4,
        wait_seconds=1,
        visibility_timeout=30,
    )
    stats = worker.run(until_idle=2)
    first = order[:100]
    share = sum(body.startswith("heavy") for body in first)
    assert 60 <= share <= 90 and 100 - share >= 10
    assert len(order) == 300 == len(set(order))
    assert (stats.completed, stats.lost, stats.failed) == (300, 0, 0)
    names = list(stats.per_queue)
    assert [stats.per_queue[n].completed for n in names] == [150, 150]
    for backend in (heavy, light):
        attributes = backend.client.get_queue_attributes(
            QueueUrl=backend.queue_url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        assert attributes == {
            "ApproximateNumberOfMessages": "0",
            "ApproximateNumberOfMessagesNotVisible": "0",
        }


def test_an_empty_heavy_queue_is_asked_little_while_the_other_drains(
    moto_endpoint: str, make_queue: Callable[..., str]
) -> None:
    empty_client, busy_client = make_client(moto_endpoint), make_client(moto_endpoint)
    empty = SQSBackend(empty_client, make_queue(visibility_timeout=30))
    busy = SQSBackend(busy_client, make_queue(visibility_timeout=30))
    fill(busy, "busy", 60)
    empty_calls, busy_calls = count_calls(empty_client), count_calls(busy_client)
    waits: list[int] = []
    empty_client.meta.events.register(
        "provide-client-params.sqs.ReceiveMessage",
        lambda params, **_: waits.append(int(params.get("WaitTimeSeconds", 0))),
    )
    drained = threading.Event()
    done: list[str] = []

    def handler(message: Message) -> None:
        done.append(message.id)
        if len(done) == 60:
            drained.set()

    worker = Worker(
        [empty, busy],
        handler,
        weights=[3, 1],
        batch_size=1,
        concurrency=2,
        wait_seconds=20,
        visibility_timeout=30,
    ).start()
    try:
        assert drained.wait(60)
        asked_empty = empty_calls["ReceiveMessage"]
    finally:
        worker.stop(10)
    # While the other queue had messages the empty one was never long-polled (a
    # 20 s long poll would have stalled the other), and it rested between its polls.
    assert busy_calls["ReceiveMessage"] >= 60
    assert asked_empty < busy_calls["ReceiveMessage"]
    assert waits[: asked_empty - 1].count(0) == asked_empty - 1


def test_the_renewer_process_renews_both_queues(
    moto_endpoint: str, make_queue: Callable[..., str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in CHILD_ENV.items():  # where the renewer process finds credentials
        monkeypatch.setenv(name, value)
    a = SQSBackend(make_client(moto_endpoint), make_queue(visibility_timeout=2))
    b = SQSBackend(make_client(moto_endpoint), make_queue(visibility_timeout=2))
    fill(a, "a", 2)
    fill(b, "b", 2)
    seen: list[tuple[str, Any]] = []

    def handler(message: Message) -> None:
        time.sleep(3.0)  # past the 2 s visibility timeout: renewed, or done twice
        seen.append((str(message.body), message.backend))

    worker = Worker(
        [a, b],
        handler,
        renewer="process",
        concurrency=4,
        wait_seconds=1,
        visibility_timeout=2,
        timer_interval=0.5,
        minimal_life=0.5,
    )
    assert worker.manager.renewer.name == "process"
    stats = worker.run(until_idle=2)
    assert (stats.completed, stats.lost) == (4, 0)
    assert sorted(body for body, _ in seen) == ["a 0", "a 1", "b 0", "b 1"]
    for body, backend in seen:
        assert backend is (a if body.startswith("a") else b)
    assert worker.manager.stats().extended >= 4
