"""Poison messages on SQS (moto's server): a message whose handler always fails is in
the dead-letter queue after exactly ``max_receives`` receives and gone from its own,
with no hot loop; without a dead-letter target, the queue's own redrive policy is
read once and named when the worker starts."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest

from leasekeeper import Message, Worker
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.failures import RECEIVES, RETRIED_FOR_EVER, SOURCE
from tests.sqs.conftest import make_client

pytestmark = pytest.mark.realtime

# Short delays: the first failure is back in about 0.1 s, the second in 0.2 s.
TIMING: dict[str, Any] = {
    "visibility_timeout": 4.0,
    "timer_interval": 0.5,
    "minimal_life": 1.0,
    "release_delay": 0.1,
}


def failing(message: Message) -> None:
    raise RuntimeError("always fails")


def test_a_poison_message_reaches_the_dead_letter_queue_after_exactly_max_receives(
    moto_endpoint: str, make_queue: Callable[..., str], caplog: pytest.LogCaptureFixture
) -> None:
    client = make_client(moto_endpoint)
    source = SQSBackend(client, make_queue(visibility_timeout=4))
    dead = SQSBackend(client, make_queue())
    sent = source.send("poison", {"tenant": "acme"})
    caplog.set_level(logging.INFO, logger="leasekeeper")
    worker = Worker(source, failing, wait_seconds=0.2, max_receives=3, dead_letter=dead, **TIMING)
    stats = worker.run(until_idle=2)
    assert (stats.received, stats.failed, stats.dead_lettered) == (3, 2, 1)
    copies: list[Message] = []
    for _ in range(20):
        copies += dead.receive(max_messages=10, wait_seconds=0.5)
        if copies:
            break
    (copy,) = copies
    assert copy.body == "poison" and copy.attributes["tenant"] == "acme"
    assert copy.attributes[RECEIVES] == "3" and copy.attributes[SOURCE] == source.queue_url
    assert source.receive(max_messages=10, wait_seconds=0.5) == []  # gone from its queue
    assert sent != copy.id
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("leasekeeper")]
    assert len(lines) < 20, lines  # no hot loop
    assert sum("handler failed" in line for line in lines) == 3


def test_without_a_dead_letter_target_the_queues_redrive_policy_is_named(
    moto_endpoint: str,
    make_queue: Callable[..., str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if no failure had been seen in this process: "retried for ever" could be said.
    monkeypatch.setattr(RETRIED_FOR_EVER, "said", False)
    admin = make_client(moto_endpoint)
    dead_url = make_queue()
    arn = admin.get_queue_attributes(QueueUrl=dead_url, AttributeNames=["QueueArn"])
    policy = {"deadLetterTargetArn": arn["Attributes"]["QueueArn"], "maxReceiveCount": 4}
    source_url = make_queue(visibility_timeout=4)
    admin.set_queue_attributes(
        QueueUrl=source_url, Attributes={"RedrivePolicy": json.dumps(policy)}
    )
    caplog.set_level(logging.INFO, logger="leasekeeper.failures")
    worker = Worker(SQSBackend(make_client(moto_endpoint), source_url), failing, **TIMING)
    worker.run(until_idle=0.5)
    lines = [r.getMessage() for r in caplog.records]
    assert any("redrive policy" in line and "4 times" in line for line in lines), lines
    assert not any("retried for ever" in line for line in lines)
