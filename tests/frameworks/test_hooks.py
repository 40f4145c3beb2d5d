"""The hooks themselves, in this process, on moto: each framework path that deletes a
message or changes its visibility finds the lease already forgotten (never after),
and what ``FrameworkLeases`` decides per queue. Fast; the worker-process scenarios
are in test_celery.py and test_dramatiq.py."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kombu import Connection

from leasekeeper import LeaseState, WatchLease
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.errors import ConfigError
from leasekeeper.integrations.frameworks import FrameworkLeases, QueueSetup, framework_config
from leasekeeper.integrations.kombu_sqs import ChannelWatch
from leasekeeper.testing import ManualClock
from tests.frameworks.dramatiq_broker import NOOP, make_broker, message

# ---------------------------------------------------------------- timing defaults


def test_the_defaults_scale_down_to_a_three_second_timeout() -> None:
    config = framework_config(3, {})
    assert (config.visibility_timeout, config.timer_interval, config.minimal_life) == (3, 0.5, 0.5)
    assert config.threshold == 1.0  # renewed when a third is left
    roomy = framework_config(60, {})
    assert (roomy.timer_interval, roomy.minimal_life, roomy.threshold) == (1.0, 2.0, 20.0)


def test_the_users_options_win_and_are_checked() -> None:
    config = framework_config(3, {"timer_interval": 0.25, "extend_threshold": 1.5})
    assert (config.timer_interval, config.minimal_life, config.threshold) == (0.25, 0.5, 1.5)
    # Renewing to more than the queue applies: the defaults fit the shorter of the two.
    longer = framework_config(3, {"visibility_timeout": 60})
    assert (longer.visibility_timeout, longer.minimal_life) == (60, 0.5)
    with pytest.raises(ConfigError, match="unknown leasekeeper option"):
        FrameworkLeases("test", {"visibility": 3})


# ---------------------------------------------------------------- FrameworkLeases


@pytest.fixture
def memory() -> Iterator[tuple[FrameworkLeases, MemoryQueue, ManualClock]]:
    clock = ManualClock()
    queue = MemoryQueue(visibility_timeout=3, clock=clock)
    leases = FrameworkLeases("test", {"clock": clock})
    yield leases, queue, clock
    leases.close()


def setup_of(queue: MemoryQueue) -> Callable[[], QueueSetup]:
    return lambda: QueueSetup(queue, 3.0)


def test_a_watch_is_renewed_until_forgotten_by_its_receipt(
    memory: tuple[FrameworkLeases, MemoryQueue, ManualClock],
) -> None:
    leases, queue, clock = memory
    queue.send("job")
    (received,) = queue.receive(visibility_timeout=3)
    watched = leases.queue("memory://jobs", setup_of(queue))
    assert watched is not None
    lease = leases.watch(watched, received.raw)  # as a framework hands it over
    assert isinstance(lease, WatchLease)
    clock.advance(10)  # 4x the timeout
    assert lease.extensions >= 4 and lease.state is LeaseState.ACTIVE
    leases.forget(received.receipt)
    assert lease.state is LeaseState.FORGOTTEN
    assert watched.manager.stats().forgotten == 1
    leases.forget(received.receipt)  # twice, or a receipt never watched: nothing
    leases.forget("unknown")


def test_a_message_with_too_little_life_left_runs_unwatched(
    memory: tuple[FrameworkLeases, MemoryQueue, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    leases, queue, clock = memory
    queue.send("job")
    (received,) = queue.receive(visibility_timeout=3)
    watched = leases.queue("memory://jobs", setup_of(queue))
    assert watched is not None
    clock.advance(2.8)  # less than minimal_life (0.5 s) left
    with caplog.at_level(logging.WARNING, "leasekeeper.integrations.frameworks"):
        assert leases.watch(watched, received.raw, received_at=received.received_at) is None
    assert "is not renewed" in caplog.text


def test_a_queue_whose_setup_fails_is_tried_again_and_a_bad_config_is_not(
    memory: tuple[FrameworkLeases, MemoryQueue, ManualClock], caplog: pytest.LogCaptureFixture
) -> None:
    leases, queue, _ = memory

    def unreachable() -> QueueSetup:
        raise OSError("GetQueueAttributes: connection refused")

    with caplog.at_level(logging.WARNING, "leasekeeper.integrations.frameworks"):
        assert leases.queue("memory://a", unreachable) is None
        assert leases.queue("memory://a", setup_of(queue)) is not None  # tried again
        # A queue hiding messages for 0 s leaves nothing to renew: said once, kept.
        assert leases.queue("memory://b", lambda: QueueSetup(queue, 0.0)) is None
        assert leases.queue("memory://b", setup_of(queue)) is None
    assert "cannot set up lease renewal" in caplog.text
    assert "will not be renewed" in caplog.text


def test_close_forgets_and_releases_nothing(
    memory: tuple[FrameworkLeases, MemoryQueue, ManualClock],
) -> None:
    leases, queue, _ = memory
    queue.send("job")
    (received,) = queue.receive(visibility_timeout=3)
    watched = leases.queue("memory://jobs", setup_of(queue))
    assert watched is not None
    lease = leases.watch(watched, received.raw)
    assert lease is not None
    leases.close()
    assert lease.state is LeaseState.FORGOTTEN
    assert queue.receive(visibility_timeout=3) == []  # still hidden: not released


# ---------------------------------------------------------------- kombu's SQS channel


@pytest.fixture
def kombu_channel(moto_endpoint: str) -> Iterator[tuple[Any, str]]:
    url = f"sqs://testing:testing@{moto_endpoint.split('://', 1)[-1]}"
    options = {"region": "us-east-1", "visibility_timeout": 3, "wait_time_seconds": 0}
    with Connection(url, transport_options=options) as connection:
        yield connection, f"hooks-{uuid.uuid4().hex[:10]}"


def test_kombu_acks_rejects_and_restores_only_after_the_lease_is_forgotten(
    kombu_channel: tuple[Any, str], caplog: pytest.LogCaptureFixture
) -> None:
    connection, name = kombu_channel
    channel = connection.default_channel
    seen: list[tuple[str, LeaseState | None]] = []
    leases = FrameworkLeases("test", {})

    def state_of(tag: str) -> LeaseState | None:
        lease = next((held for held in leases_by_tag if held.message.receipt == tag), None)
        return None if lease is None else lease.state

    # Beneath the hooks: what kombu's own methods see when they run.
    for method in ("basic_ack", "basic_reject", "_restore"):
        original = getattr(channel, method)

        def spy(first: Any, *args: Any, _original: Any = original, _name: str = method, **kw: Any):
            tag = first if isinstance(first, str) else first.delivery_tag
            seen.append((_name, state_of(tag)))
            return _original(first, *args, **kw)

        setattr(channel, method, spy)
    ChannelWatch(channel, leases)
    leases_by_tag: list[WatchLease] = []

    queue = connection.SimpleQueue(name, channel=channel)
    for body in ("acked", "rejected", "requeued", "restored"):
        queue.put(body)
    with caplog.at_level(logging.INFO, "leasekeeper.celery"):
        received = {}
        for _ in range(4):
            got = queue.get(timeout=5)
            received[got.payload] = got
            lease = leases.lease(got.delivery_tag)
            assert lease is not None and lease.state is LeaseState.ACTIVE
            leases_by_tag.append(lease)
    assert "renewing the messages of queue" in caplog.text
    assert "Celery's visibility_timeout" not in caplog.text  # kombu made it: 3 s both

    received["acked"].ack()
    received["rejected"].reject()
    received["requeued"].reject(requeue=True)
    channel.qos.restore_unacked()  # what closing the channel does with the rest
    assert [method for method, _ in seen] == ["basic_ack", "basic_reject", "basic_reject"] + [
        "_restore"
    ] * 2
    assert all(state is LeaseState.FORGOTTEN for _, state in seen), seen
    assert all(lease.state is LeaseState.FORGOTTEN for lease in leases_by_tag)
    leases.close()
    queue.close()


# ---------------------------------------------------------------- dramatiq-sqs's consumer


def test_dramatiq_acks_nacks_and_requeues_only_after_the_lease_is_forgotten(
    moto_endpoint: str,
) -> None:
    from leasekeeper.dramatiq import WatchingConsumer

    broker = make_broker(moto_endpoint.split("://", 1)[-1])
    name = f"hooks-{uuid.uuid4().hex[:10]}"
    broker.declare_queue(name)
    for index in range(4):
        broker.enqueue(message(name, NOOP, f"m{index}"))
    leases = FrameworkLeases("test", {})
    plain = broker.consume(name, prefetch=4, timeout=1000)
    consumer = WatchingConsumer(
        plain.queue,
        4,
        1000,
        dead_letter_queue=None,
        visibility_timeout=3,
        leases=leases,
        client=broker.sqs.meta.client,
    )
    first = next(consumer)  # one receive: the other three wait in the buffer
    assert first is not None and len(consumer.messages) == 3
    by_receipt = {
        m._sqs_message.receipt_handle: leases.lease(m._sqs_message.receipt_handle)
        for m in (first, *consumer.messages)
    }
    assert all(lease is not None for lease in by_receipt.values())
    second = next(consumer)
    order: list[str] = []

    def deleting(proxy: Any, what: str) -> None:
        original = proxy._sqs_message.delete
        lease = by_receipt[proxy._sqs_message.receipt_handle]

        def delete() -> Any:
            assert lease is not None and lease.state is LeaseState.FORGOTTEN
            order.append(what)
            return original()

        proxy._sqs_message.delete = delete

    deleting(first, "ack")
    deleting(second, "nack")
    consumer.ack(first)
    consumer.nack(second)
    third = next(consumer)
    consumer.requeue([third])  # Worker.requeue_messages
    consumer.close()  # the fourth, still in the buffer
    assert order == ["ack", "nack"]
    assert all(lease.state is LeaseState.FORGOTTEN for lease in by_receipt.values() if lease)
    leases.close()
    # The requeued ones are visible again at once: received again, and nothing else.
    again = SQSBackend(broker.sqs.meta.client, plain.queue.url).receive(10, 1.0, 3)
    assert len(again) == 2


def test_an_existing_queue_s_own_timeout_rules_and_a_different_celery_one_is_warned_of(
    kombu_channel: tuple[Any, str], sqs: Any, caplog: pytest.LogCaptureFixture
) -> None:
    connection, name = kombu_channel
    sqs.create_queue(QueueName=name, Attributes={"VisibilityTimeout": "5"})  # not kombu's 3
    channel = connection.default_channel
    leases = FrameworkLeases("test", {})
    ChannelWatch(channel, leases)
    queue = connection.SimpleQueue(name, channel=channel)
    queue.put("job")
    with caplog.at_level(logging.INFO, "leasekeeper.celery"):
        got = queue.get(timeout=5)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "visibility_timeout (3s) is not what SQS applies" in warnings[0].getMessage()
    (watched,) = leases.queues()
    assert watched.visibility_timeout == 5
    assert watched.manager.config.visibility_timeout == 5  # renewals set what SQS applies
    got.ack()
    leases.close()
    queue.close()


def test_a_broker_other_than_sqs_keeps_no_leases(caplog: pytest.LogCaptureFixture) -> None:
    from types import SimpleNamespace

    from leasekeeper.celery import LeaseKeeping

    step = LeaseKeeping.with_options()(SimpleNamespace())
    for driver, said in (
        ("azurestoragequeues", "deletes each message as it receives it"),
        ("redis", "not SQS"),
    ):
        parent = SimpleNamespace(
            connection=SimpleNamespace(transport=SimpleNamespace(driver_type=driver))
        )
        with caplog.at_level(logging.WARNING, "leasekeeper.celery"):
            step.start(parent)
        assert said in caplog.text
    assert step.leases is None
    with pytest.raises(ValueError, match="renewer"):
        LeaseKeeping.with_options(renewer="process")
