"""The fault proxy's ``real_sqs`` mode: moto behind it answers as the real SQS does.

moto accepts any handle a message ever had and lets a late extend hide a message
again (docs/backend-semantics.md, SQS: moto's deviations 2 and 6). The real service
answers a late extend 200 and does nothing, rejects the extend of a handle that
is no longer the latest with InvalidParameterValue, and answers a delete with
such a handle 200 and deletes nothing. First the rules on a driven clock, then
through the proxy with a real boto3 client.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from botocore.exceptions import ClientError

from leasekeeper.backends.base import Handle
from leasekeeper.backends.sqs import SQSBackend, classify_error, classify_exception
from tests.sqs.conftest import make_client
from tests.sqs.fault_proxy import (
    EXPIRED_FIFO,
    FORWARD,
    GONE,
    LATE,
    NOT_AVAILABLE,
    STALE,
    UNKNOWN,
    FaultProxyProcess,
    ReceiptTracker,
)
from tests.sqs.test_moto import queue_counts

# ---------------------------------------------------------------- the rules, driven clock


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_latest_handle_extends_until_its_deadline_then_does_nothing() -> None:
    clock = Clock()
    tracker = ReceiptTracker(clock)
    tracker.received("/1/q", "m", "h1", deadline=clock.now + 2)
    clock.now += 1.9
    assert tracker.judge_change("h1") == FORWARD
    tracker.changed("h1", deadline=clock.now + 2)  # forwarded, applied: to 103.9
    clock.now += 1.99
    assert tracker.judge_change("h1") == FORWARD
    clock.now += 0.01  # the deadline itself: the message is visible
    assert tracker.judge_change("h1") == LATE
    assert tracker.judge_delete("h1") == FORWARD  # still the latest handle: it deletes
    tracker.deleted("h1")
    assert tracker.judge_change("h1") == GONE
    assert tracker.counts == {
        "extend:forward": 2,
        "extend:late": 1,
        "delete:forward": 1,
        "extend:gone": 1,
    }


def test_after_a_second_receive_the_first_handle_is_stale() -> None:
    clock = Clock()
    tracker = ReceiptTracker(clock)
    tracker.received("/1/q", "m", "h1", deadline=clock.now + 2)
    clock.now += 2.5
    tracker.received("/1/q", "m", "h2", deadline=clock.now + 30)  # someone else's now
    assert tracker.judge_change("h1") == STALE
    assert tracker.judge_delete("h1") == STALE
    assert tracker.judge_change("h2") == FORWARD
    assert tracker.judge_delete("h2") == FORWARD
    assert tracker.judge_change("never-issued") == UNKNOWN
    stale = [e for e in tracker.events if e["verdict"] == STALE]
    assert [(e["action"], e["id"], e["receive"], e["latest"]) for e in stale] == [
        ("extend", "m", 1, 2),
        ("delete", "m", 1, 2),
    ]
    assert all("h1" not in str(e) and "h2" not in str(e) for e in tracker.events)


def test_a_fifo_handle_expires_at_its_deadline() -> None:
    clock = Clock()
    tracker = ReceiptTracker(clock)
    tracker.received("/1/q.fifo", "m", "h1", deadline=clock.now + 2)
    assert tracker.judge_delete("h1") == FORWARD
    clock.now += 2
    assert tracker.judge_delete("h1") == EXPIRED_FIFO


def test_the_stale_extend_answer_is_classified_lost() -> None:
    text = NOT_AVAILABLE.format(handle="AQEB" + "x" * 60)
    kind, detail = classify_error("InvalidParameterValue", "", text, sender_fault=True)
    assert kind == "lost"
    assert "AQEB" not in detail


# ---------------------------------------------------------------- through the proxy


def send(client: Any, url: str, body: str) -> str:
    return str(client.send_message(QueueUrl=url, MessageBody=body)["MessageId"])


def receive_one(client: Any, url: str, visibility: int) -> tuple[dict[str, Any], float]:
    """Receive one message; returns it and the time the answer came back."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        messages = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=visibility
        ).get("Messages", [])
        if messages:
            return messages[0], time.monotonic()
    pytest.fail("nothing to receive in 10 s")


def receive_all(client: Any, url: str) -> set[str]:
    """Every message visible now (hidden for 30 s by this receive)."""
    got: set[str] = set()
    while True:
        messages = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, VisibilityTimeout=30
        ).get("Messages", [])
        if not messages:
            return got
        got |= {m["MessageId"] for m in messages}


def wait_past(answered_at: float, visibility: float) -> None:
    """Real time: past the service's deadline of a receive answered at ``answered_at``
    (the proxy counts it from before it forwarded the receive, moto from when it
    handled it: both earlier)."""
    time.sleep(max(0.0, answered_at + visibility + 0.05 - time.monotonic()))


@pytest.fixture
def proxy(moto_endpoint: str) -> Any:
    with FaultProxyProcess(moto_endpoint, error_rate=0.0, real_sqs=True) as running:
        yield running


@pytest.mark.realtime
def test_a_late_extend_answers_success_and_the_message_stays_visible(
    make_queue: Any, proxy: Any
) -> None:
    url = make_queue(visibility_timeout=30)
    client = make_client(proxy.url)
    message_id = send(client, url, "job")
    first, answered_at = receive_one(client, url, visibility=1)
    wait_past(answered_at, 1)

    late = client.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[{"Id": "x", "ReceiptHandle": first["ReceiptHandle"], "VisibilityTimeout": 30}],
    )
    assert late["Successful"] == [{"Id": "x"}] and late.get("Failed", []) == []
    # ... and did nothing: a second consumer gets the message at once.
    second, _ = receive_one(make_client(proxy.url), url, visibility=30)
    assert second["MessageId"] == message_id

    # Now the first handle is not the latest: its extend fails, as lost.
    stale = client.change_message_visibility_batch(
        QueueUrl=url,
        Entries=[{"Id": "x", "ReceiptHandle": first["ReceiptHandle"], "VisibilityTimeout": 30}],
    )
    assert stale["Successful"] == []
    [failed] = stale["Failed"]
    assert (failed["Id"], failed["Code"], failed["SenderFault"]) == (
        "x",
        "InvalidParameterValue",
        True,
    )
    assert failed["Message"].endswith(
        "Reason: Message does not exist or is not available for visibility timeout change."
    )
    backend = SQSBackend(client, url)
    [outcome] = backend.extend([Handle(message_id, first["ReceiptHandle"])], 30)
    assert outcome.kind == "lost", outcome
    with pytest.raises(ClientError) as raised:
        client.change_message_visibility(
            QueueUrl=url, ReceiptHandle=first["ReceiptHandle"], VisibilityTimeout=30
        )
    assert raised.value.response["Error"]["Code"] == "InvalidParameterValue"
    assert classify_exception(raised.value)[0] == "lost"

    # A delete with the first handle answers success and deletes nothing ...
    for _ in range(2):
        gone = client.delete_message_batch(
            QueueUrl=url, Entries=[{"Id": "d", "ReceiptHandle": first["ReceiptHandle"]}]
        )
        assert gone["Successful"] == [{"Id": "d"}]
        client.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    assert [o.kind for o in backend.delete([Handle(message_id, first["ReceiptHandle"])])] == ["ok"]
    assert queue_counts(client, url) == (0, 1), "a stale handle deleted the message"
    # ... while the latest one does.
    client.delete_message(QueueUrl=url, ReceiptHandle=second["ReceiptHandle"])
    assert queue_counts(client, url) == (0, 0)
    counts = proxy.stats()["real_sqs"]["counts"]
    assert counts["extend:late"] == 1
    assert counts["extend:stale"] == 3
    assert counts["delete:stale"] == 5
    assert counts["delete:forward"] == 1


@pytest.mark.realtime
def test_a_mixed_batch_forwards_what_the_service_applies_and_answers_the_rest(
    make_queue: Any, proxy: Any
) -> None:
    url = make_queue(visibility_timeout=30)
    client = make_client(proxy.url)
    # One receive at a time, so each message gets the handle and timeout it needs
    # (moto hands out visible messages in the order they were sent).
    stale_id = send(client, url, "stale")
    stale, _ = receive_one(client, url, visibility=1)
    late_id = send(client, url, "late")
    late, answered_at = receive_one(client, url, visibility=1)
    on_time_id = send(client, url, "on time")
    on_time, on_time_at = receive_one(client, url, visibility=5)
    assert (stale["MessageId"], late["MessageId"], on_time["MessageId"]) == (
        stale_id,
        late_id,
        on_time_id,
    )
    wait_past(answered_at, 1)
    again, _ = receive_one(make_client(proxy.url), url, visibility=30)  # the oldest
    assert again["MessageId"] == stale_id

    entries = [
        {"Id": "bogus", "ReceiptHandle": "not-a-handle", "VisibilityTimeout": 30},
        {"Id": "stale", "ReceiptHandle": stale["ReceiptHandle"], "VisibilityTimeout": 30},
        {"Id": "on-time", "ReceiptHandle": on_time["ReceiptHandle"], "VisibilityTimeout": 30},
        {"Id": "late", "ReceiptHandle": late["ReceiptHandle"], "VisibilityTimeout": 30},
    ]
    answer = client.change_message_visibility_batch(QueueUrl=url, Entries=entries)
    assert answer["Successful"] == [{"Id": "on-time"}, {"Id": "late"}]
    assert [(f["Id"], f["Code"]) for f in answer["Failed"]] == [
        ("bogus", "ReceiptHandleIsInvalid"),  # moto's own answer, forwarded
        ("stale", "InvalidParameterValue"),
    ]
    outcomes = SQSBackend(client, url).extend(
        [Handle(stale_id, stale["ReceiptHandle"]), Handle(late_id, late["ReceiptHandle"])], 30
    )
    assert [o.kind for o in outcomes] == ["lost", "ok"]

    # The on-time extend was applied (hidden for 30 s, not 5), the late one was not.
    wait_past(on_time_at, 5)
    assert receive_all(client, url) == {late_id}
    real = proxy.stats()["real_sqs"]
    assert real["counts"] == {
        "extend:unknown": 1,
        "extend:stale": 2,
        "extend:forward": 1,
        "extend:late": 2,
    }


@pytest.mark.realtime
def test_a_fifo_delete_after_the_deadline_fails_as_expired(make_queue: Any, proxy: Any) -> None:
    url = make_queue(visibility_timeout=1, fifo=True)
    client = make_client(proxy.url)
    client.send_message(QueueUrl=url, MessageBody="job", MessageGroupId="g")
    # No VisibilityTimeout: the queue's own 1 s, which the proxy reads itself.
    first = client.receive_message(QueueUrl=url, MaxNumberOfMessages=1)["Messages"][0]
    wait_past(time.monotonic(), 1)
    [outcome] = SQSBackend(client, url).delete([Handle(first["MessageId"], first["ReceiptHandle"])])
    assert outcome.kind == "lost", outcome
    with pytest.raises(ClientError, match="receipt handle has expired"):
        client.delete_message(QueueUrl=url, ReceiptHandle=first["ReceiptHandle"])
    assert queue_counts(client, url) == (1, 0)
