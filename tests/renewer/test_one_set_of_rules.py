"""Both renewers follow one set of lease rules and own the leases they register.

On moto's server, with each renewer: a subclass of the standard renewer that
overrides ``complete()`` sees every complete the manager and its leases make, and
an ``on_lost`` that raises is counted in ``stats().callback_errors``. A renewer
process that cannot build its backend refuses leases; it never loses them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from leasekeeper import (
    ConfigError,
    Lease,
    LeaseManager,
    LeaseState,
    LostReason,
    ProcessRenewer,
    ThreadRenewer,
    Worker,
)
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.config import LeaseConfig
from tests.services import make_client

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

TIMING: dict[str, Any] = {
    "visibility_timeout": 4.0,
    "extend_threshold": 2.0,
    "timer_interval": 0.5,
    "minimal_life": 1.0,
}


@pytest.fixture
def queue_url(moto_endpoint: str, renewer_env: None) -> Iterator[str]:
    admin = make_client(moto_endpoint)
    url: str = admin.create_queue(
        QueueName=f"rules-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "30"}
    )["QueueUrl"]
    yield url
    admin.delete_queue(QueueUrl=url)


def send(endpoint: str, url: str, n: int) -> None:
    admin = make_client(endpoint)
    for i in range(n):
        admin.send_message(QueueUrl=url, MessageBody=f"job {i}")


class CountsCompletes:
    """Mixed into a standard renewer: an override of ``complete`` that counts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.completed: list[str] = []

    def complete(self, lease: Lease) -> None:
        self.completed.append(lease.id)
        super().complete(lease)  # type: ignore[misc]


class CountingThread(CountsCompletes, ThreadRenewer):
    pass


class CountingProcess(CountsCompletes, ProcessRenewer):
    pass


@pytest.mark.parametrize("kind", ["thread", "process"])
def test_a_renewer_that_overrides_complete_sees_every_complete(
    moto_endpoint: str, queue_url: str, kind: str
) -> None:
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    config = LeaseConfig(**TIMING)
    renewer = CountingThread(config) if kind == "thread" else CountingProcess(backend, config)
    manager = LeaseManager(backend, renewer=renewer)
    try:
        manager.start()
        send(moto_endpoint, queue_url, 2)
        ids: list[str] = []
        # 1: a scope around a message received from the backend itself.
        (message,) = backend.receive(max_messages=1, wait_seconds=2, visibility_timeout=4)
        with manager.lease(message) as held:
            ids.append(held.id)
        # 2: a lease's own complete().
        (held,) = manager.receive(max_messages=1, wait_seconds=2)
        held.complete()
        ids.append(held.id)
        # 3: a worker's complete (coalesced into a batch call).
        send(moto_endpoint, queue_url, 1)
        seen: list[str] = []
        worker = Worker(manager, lambda message: seen.append(message.id), wait_seconds=1)
        stats = worker.run(until_idle=2)
        assert stats.completed == 1
        ids += seen
        assert renewer.completed == ids
        assert len(set(ids)) == 3
    finally:
        manager.close()


@pytest.mark.parametrize("renewer", ["thread", "process"])
def test_an_on_lost_that_raises_is_counted_as_a_callback_error(
    moto_endpoint: str, queue_url: str, renewer: str
) -> None:
    told: list[LostReason] = []

    def on_lost(lease: Lease, reason: LostReason) -> None:
        told.append(reason)
        raise RuntimeError("the user's on_lost failed")

    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    manager = LeaseManager(backend, renewer=renewer, on_lost=on_lost, **TIMING)
    try:
        manager.start()
        send(moto_endpoint, queue_url, 1)
        (held,) = manager.receive(max_messages=1, wait_seconds=2)
        # Deleted out of band: the next renewal is refused.
        make_client(moto_endpoint).delete_message(QueueUrl=queue_url, ReceiptHandle=held.receipt)
        assert held.lost.wait(15)
        deadline = time.monotonic() + 10
        while manager.stats().callback_errors == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert held.state is LeaseState.LOST
        assert told == [LostReason.REJECTED]
        assert manager.stats().callback_errors == 1
    finally:
        manager.close()


class UnbuildableSpec:
    """A spec the renewer process cannot build (as a queue it cannot reach)."""

    def build(self) -> Any:
        raise RuntimeError("no queue of that name here")


class Unbuildable(MemoryQueue):
    """A queue that says it can be rebuilt elsewhere, whose spec fails there."""

    def spec(self) -> Any:
        return UnbuildableSpec()


def test_a_process_renewer_that_cannot_build_fails_its_construction_and_loses_none() -> None:
    lost: list[Lease] = []
    queue = Unbuildable(visibility_timeout=30)
    queue.send("job")
    with pytest.raises(ConfigError, match="no queue of that name here"):
        # The constructor waits until its renewer renews: nothing can be received
        # or registered for a renewer that never will, so nothing is reported lost.
        LeaseManager(queue, renewer="process", on_lost=lambda lease, _: lost.append(lease))
    assert lost == []
    auto = LeaseManager(queue, renewer="auto", on_lost=lambda lease, _: lost.append(lease))
    try:
        assert auto.renewer.name == "thread"
        (message,) = queue.receive(max_messages=1)
        auto.register(message).complete()
        assert lost == [] and auto.stats().completed == 1
    finally:
        auto.close()
