"""What SQSBackend offers the dead-letter and rollover features, on moto's server:
the queue's attributes and redrive policy read once, sends with attributes (and to
a FIFO queue, in a message group), and a cap on a lease that an overridden
``max_lease_age`` scales."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.testing import ManualClock
from tests.sqs.conftest import count_calls, make_client
from tests.sqs.stubbed import sqs_message, stubbed


def test_queue_attributes_and_the_redrive_policy_are_read_once(
    moto_endpoint: str, make_queue: Callable[..., str]
) -> None:
    admin = make_client(moto_endpoint)
    dead = make_queue()
    dead_arn = admin.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"][
        "QueueArn"
    ]
    source = make_queue(visibility_timeout=45)
    policy = {"deadLetterTargetArn": dead_arn, "maxReceiveCount": 5}
    admin.set_queue_attributes(QueueUrl=source, Attributes={"RedrivePolicy": json.dumps(policy)})
    client = make_client(moto_endpoint)
    calls = count_calls(client)
    backend = SQSBackend(client, source)
    assert backend.redrive_policy() == policy
    assert backend.queue_visibility_timeout() == 45.0
    assert backend.queue_attributes()["QueueArn"].endswith(source.rsplit("/", 1)[1])
    assert calls["GetQueueAttributes"] == 1
    assert SQSBackend(client, dead).redrive_policy() is None


def test_send_carries_string_attributes_and_at_most_ten(
    moto_endpoint: str, make_queue: Callable[..., str]
) -> None:
    backend = SQSBackend(make_client(moto_endpoint), make_queue())
    with pytest.raises(ValueError, match="at most 10 attributes"):
        backend.send("x", {f"a{i}": "v" for i in range(11)})
    sent = backend.send("payload", {"source": "jobs", "receives": "3"}, delay=1)
    got: list[Any] = []
    for _ in range(6):  # delayed by a second; moto's long poll returns when it shows
        got = got or backend.receive(wait_seconds=5)
    [message] = got
    assert message.id == sent and message.attributes == {"source": "jobs", "receives": "3"}
    assert message.raw["MessageAttributes"]["source"]["DataType"] == "String"


def test_a_fifo_send_needs_its_group_and_keeps_it(
    moto_endpoint: str, make_queue: Callable[..., str]
) -> None:
    backend = SQSBackend(make_client(moto_endpoint), make_queue(fifo=True))
    with pytest.raises(ValueError, match="group_id"):
        backend.send("x")
    with pytest.raises(ValueError, match="no per-message delay"):
        backend.send("x", group_id="g", delay=5)
    # two sends of one body are two messages: each gets its own deduplication id
    first, second = backend.send("same", group_id="g-1"), backend.send("same", group_id="g-1")
    assert first != second
    [message] = backend.receive(visibility_timeout=30)
    assert message.raw["Attributes"]["MessageGroupId"] == "g-1"


@pytest.mark.parametrize(("age", "margin"), [(None, 60.0), (1000.0, 20.0), (100.0, 2.0)])
def test_the_cap_margin_scales_with_an_overridden_max_lease_age(
    age: float | None, margin: float
) -> None:
    clock = ManualClock()
    backend, stubber, _ = stubbed(clock=clock)
    if age is not None:
        backend = SQSBackend(backend.client, backend.queue_url, clock=clock, max_lease_age=age)
    assert backend.max_lease_age == (age or 43200.0)
    stubber.add_response("receive_message", {"Messages": [sqs_message("m", "AQEB" + "x" * 40)]})
    [message] = backend.receive(visibility_timeout=30)
    assert message.hard_deadline == message.received_at + backend.max_lease_age - margin
    spec: Any = backend.spec()
    assert dict(spec.options).get("max_lease_age") == age  # travels to a renewer process
    with pytest.raises(ValueError, match="max_lease_age"):
        SQSBackend(backend.client, backend.queue_url, max_lease_age=0)
