"""A receive of a FIFO queue whose answer is lost in transit (issue 45, item 5).

SQS carried the ReceiveMessage out - its messages are now invisible, and their
message group blocked - but the answer never reached the worker. SQS's documented
remedy is the ReceiveRequestAttemptId: a receive asked again with the same one
within five minutes answers the same messages and receipt handles. moto does not
model it, so the fault proxy (tests/sqs/fault_proxy.py, ``real_sqs``) stands in
for SQS there: it loses the first receive's answer after moto carried it out
(``lost_answer``), and answers a repeated attempt id as SQS does. Checked on both
call paths: the call's own retry sends the same attempt id and gets the group's
messages at once; with no retry left in the call, the next receive asks again
with it; a plain receive without one (what leasekeeper sent before) gets nothing
for a visibility timeout. A standard queue's receive carries none.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.errors import ReceiveError
from tests.sqs.conftest import make_client
from tests.sqs.fault_proxy import FaultProxyProcess
from tests.sqs.scripted import ScriptedSQS

pytestmark = [pytest.mark.realtime]

LOSE_ONE_RECEIVE: dict[str, Any] = {
    "real_sqs": True,
    "error_rate": 1.0,
    "kinds": ("lost_answer",),
    "actions": ("ReceiveMessage",),
    "max_faults": 1,
}


def fill_group(moto_endpoint: str, url: str, count: int = 3) -> list[str]:
    admin = make_client(moto_endpoint)
    return [
        admin.send_message(QueueUrl=url, MessageBody=f"job {i}", MessageGroupId="g")["MessageId"]
        for i in range(count)
    ]


@pytest.mark.parametrize("fast_path", [True, False], ids=["lean", "client"])
def test_the_calls_retry_asks_again_with_the_same_attempt_and_gets_the_group(
    moto_endpoint: str, make_queue: Callable[..., str], fast_path: bool
) -> None:
    url = make_queue(visibility_timeout=60, fifo=True)
    sent = fill_group(moto_endpoint, url)
    with FaultProxyProcess(moto_endpoint, **LOSE_ONE_RECEIVE) as proxy:
        client = make_client(proxy.url, retries={"total_max_attempts": 3, "mode": "standard"})
        backend = SQSBackend(client, url, fast_path=fast_path)
        assert (backend.lean is not None) is fast_path
        received = backend.receive(max_messages=10, wait_seconds=0, visibility_timeout=60)
        stats = proxy.stats()
    assert [m.id for m in received] == sent  # the group, in order, at once
    assert [m.group for m in received] == ["g"] * 3
    assert stats["injected"] == {"lost_answer": 1}
    assert stats["forwarded"].get("ReceiveMessage:replayed") == 1


def test_with_no_retry_left_the_next_receive_asks_again(
    moto_endpoint: str, make_queue: Callable[..., str]
) -> None:
    url = make_queue(visibility_timeout=60, fifo=True)
    sent = fill_group(moto_endpoint, url)
    with FaultProxyProcess(moto_endpoint, **LOSE_ONE_RECEIVE) as proxy:
        client = make_client(proxy.url, retries={"total_max_attempts": 1, "mode": "standard"})
        backend = SQSBackend(client, url)
        with pytest.raises(ReceiveError) as raised:
            backend.receive(max_messages=10, wait_seconds=0, visibility_timeout=60)
        assert raised.value.kind == "retry"
        received = backend.receive(max_messages=10, wait_seconds=0, visibility_timeout=60)
        assert [m.id for m in received] == sent
        # that attempt is used up: the receive after asks anew (and the group is in flight)
        assert backend.receive(max_messages=10, wait_seconds=0, visibility_timeout=60) == []


def test_without_an_attempt_id_a_lost_answer_hides_the_group(
    moto_endpoint: str, make_queue: Callable[..., str]
) -> None:
    """What the attempt id saves: the same lost answer, the same retry, no id."""
    url = make_queue(visibility_timeout=60, fifo=True)
    fill_group(moto_endpoint, url)
    with FaultProxyProcess(moto_endpoint, **LOSE_ONE_RECEIVE) as proxy:
        client = make_client(proxy.url, retries={"total_max_attempts": 3, "mode": "standard"})
        answer = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=60)
    assert answer.get("Messages", []) == []  # invisible, and their group blocked, for 60 s


def test_only_a_fifo_queues_receive_carries_an_attempt_id() -> None:
    with ScriptedSQS() as script:
        client = make_client(script.url)
        for name in ("jobs.fifo", "jobs"):
            script.answer("ReceiveMessage", {"Messages": []})
            SQSBackend(client, f"{script.url}/123456789012/{name}").receive(
                max_messages=10, visibility_timeout=30
            )
        [(_, fifo), (_, standard)] = script.requests
    assert len(fifo["ReceiveRequestAttemptId"]) == 32
    assert "ReceiveRequestAttemptId" not in standard
