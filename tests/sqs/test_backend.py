"""SQSBackend without a server: requests, deadlines, batching, adopt, secrets (Stubber)."""

from __future__ import annotations

import logging
import math
import re
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest
from botocore.stub import ANY

from leasekeeper import Lease, LeaseManager, LeaseState
from leasekeeper.backends.base import Backend, Handle
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.testing import ManualClock
from tests.sqs.stubbed import (
    QUEUE_URL,
    add_error,
    change_entries,
    delete_entries,
    handles,
    receipt,
    sqs_message,
    stubbed,
)

ENTRY_ID = re.compile(r"[A-Za-z0-9_-]{1,80}")


def receive_params(**overrides: Any) -> dict[str, Any]:
    params = {
        "QueueUrl": QUEUE_URL,
        "MaxNumberOfMessages": 1,
        "WaitTimeSeconds": 0,
        "VisibilityTimeout": 30,
        "MessageSystemAttributeNames": ["All"],
        "MessageAttributeNames": ["All"],
    }
    params.update(overrides)
    return params


class TickClock:
    """Every now() is one second later than the previous one (wall = now + offset)."""

    def __init__(self) -> None:
        self.t = 100.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            self.t += 1.0
            return self.t

    def peek(self) -> float:
        return self.t

    def wall(self) -> float:
        return self.t + 1_700_000_000.0

    def wait(self, condition: threading.Condition, timeout: float) -> bool:
        return False


# ---------------------------------------------------------------- the contract


def test_class_attributes_and_protocol() -> None:
    backend, _, _ = stubbed()
    assert SQSBackend.max_batch == 10
    assert SQSBackend.max_visibility == 43200.0
    assert SQSBackend.rotates_receipts is False
    assert isinstance(backend, Backend)


def test_repr_shows_the_queue_url_only() -> None:
    backend, _, client = stubbed()
    text = repr(backend)
    assert text == f"SQSBackend(queue_url={QUEUE_URL!r})"
    credentials = client._request_signer._credentials
    assert credentials.access_key not in text.replace(QUEUE_URL, "")


def test_import_without_boto3_names_the_extra() -> None:
    code = textwrap.dedent(
        """
        import sys
        sys.modules["boto3"] = None
        sys.modules["botocore"] = None
        sys.modules["botocore.exceptions"] = None
        import leasekeeper  # works without the SDK
        try:
            import leasekeeper.backends.sqs
        except ImportError as exc:
            print(exc)
        else:
            print("imported")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    # A command that works today: the SDK from PyPI (leasekeeper is not published there).
    assert "pip install 'boto3>=1.34' (what leasekeeper's sqs extra brings)" in result.stdout


# ---------------------------------------------------------------- receive


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"max_messages": 0}, ValueError, "max_messages must be >= 1"),
        ({"max_messages": True}, TypeError, "max_messages must be an int"),
        ({"max_messages": 2.0}, TypeError, "max_messages must be an int"),
        ({"wait_seconds": -1}, ValueError, "wait_seconds must be a number of seconds >= 0"),
        ({"wait_seconds": math.nan}, ValueError, "wait_seconds"),
        ({"visibility_timeout": -1}, ValueError, ">= 0 and <= 43200"),
        ({"visibility_timeout": 43201}, ValueError, ">= 0 and <= 43200"),
        ({"visibility_timeout": float("nan")}, ValueError, ">= 0 and <= 43200"),
    ],
)
def test_receive_validates_arguments(
    kwargs: dict[str, Any], error: type[Exception], names: str
) -> None:
    backend, stubber, _ = stubbed()
    with pytest.raises(error, match=names):
        backend.receive(**kwargs)
    stubber.assert_no_pending_responses()


def test_receive_asks_for_at_most_what_sqs_allows() -> None:
    # A receive returns *up to* max_messages: more than 10, or a wait over 20 s, is
    # asked as SQS's limit rather than refused.
    backend, stubber, _ = stubbed()
    stubber.add_response(
        "receive_message",
        {},
        receive_params(MaxNumberOfMessages=10, WaitTimeSeconds=20, VisibilityTimeout=30),
    )
    assert backend.receive(max_messages=11, wait_seconds=60, visibility_timeout=30) == []
    stubber.assert_no_pending_responses()


@pytest.mark.parametrize(("wait", "sent"), [(0.0, 0), (0.001, 1), (0.5, 1), (1.0, 1), (19.2, 20)])
def test_a_fractional_long_poll_rounds_up(wait: float, sent: int) -> None:
    """0.5 s is a 1 s poll, not a 0 s one: an idle worker must not busy-poll."""
    backend, stubber, _ = stubbed()
    stubber.add_response(
        "receive_message", {}, receive_params(WaitTimeSeconds=sent, VisibilityTimeout=30)
    )
    assert backend.receive(wait_seconds=wait, visibility_timeout=30) == []
    stubber.assert_no_pending_responses()


def test_receive_request_and_deadlines() -> None:
    clock = TickClock()
    backend, stubber, client = stubbed(clock=clock)
    rh = receipt()
    stubber.add_response(
        "receive_message",
        {"Messages": [sqs_message("m-1", rh, "payload", receive_count=3)]},
        receive_params(MaxNumberOfMessages=10, WaitTimeSeconds=2, VisibilityTimeout=13),
    )
    sent: list[float] = []
    client.meta.events.register(
        "before-parameter-build.sqs.ReceiveMessage", lambda **_: sent.append(clock.peek())
    )
    # 1.5 s of long poll is rounded up (the deadline counts from before the request,
    # so a longer poll cannot make it late); 12.2 s of visibility is asked as 13 (a
    # longer real invisibility is the safe side)
    [message] = backend.receive(max_messages=10, wait_seconds=1.5, visibility_timeout=12.2)
    stubber.assert_no_pending_responses()
    # received_at is the last clock reading before the request was sent
    assert message.received_at == sent[0]
    assert message.visibility_timeout == 12.2
    assert message.visible_until == message.received_at + 12.2
    assert message.hard_deadline == message.received_at + 43200 - 60
    assert message.id == "m-1"
    assert message.body == "payload"
    assert message.receipt == rh
    assert message.receive_count == 3
    assert message.raw["ReceiptHandle"] == rh
    assert message.backend is backend
    assert rh not in repr(message)


def test_receive_uses_the_queue_visibility_read_once() -> None:
    backend, stubber, _ = stubbed()
    stubber.add_response(
        "get_queue_attributes",
        {"Attributes": {"VisibilityTimeout": "45"}},
        {"QueueUrl": QUEUE_URL, "AttributeNames": ["All"]},  # every attribute, read once
    )
    for n in range(3):
        stubber.add_response(
            "receive_message",
            {"Messages": [sqs_message(f"m-{n}", receipt())]},
            receive_params(VisibilityTimeout=45),
        )
    messages = [m for _ in range(3) for m in backend.receive()]
    stubber.assert_no_pending_responses()  # one GetQueueAttributes, three receives
    assert [m.visibility_timeout for m in messages] == [45.0] * 3


def test_receive_nothing() -> None:
    backend, stubber, _ = stubbed()
    stubber.add_response("receive_message", {}, receive_params())
    assert backend.receive(visibility_timeout=30) == []


def test_a_new_receive_restarts_the_twelve_hours() -> None:
    # moto counts 12 h from SentTimestamp and never resets it; SQS counts from the
    # receive that issued the handle, and so does hard_deadline.
    clock = ManualClock()
    backend, stubber, _ = stubbed(clock=clock)
    for _ in range(2):
        stubber.add_response("receive_message", {"Messages": [sqs_message("m", receipt())]})
    [first] = backend.receive(visibility_timeout=30)
    clock.advance(3600)
    [second] = backend.receive(visibility_timeout=30)
    assert second.hard_deadline is not None and first.hard_deadline is not None
    assert second.hard_deadline - first.hard_deadline == pytest.approx(3600)


# ---------------------------------------------------------------- extend / release / delete


@pytest.mark.parametrize(
    ("operation", "asked", "sent"),
    [
        ("extend", 30.0, 30),
        ("extend", 2.2, 3),  # up: the manager's deadline counts from 2.2
        ("extend", 0.3, 1),
        ("extend", 43200.0, 43200),
        ("extend", 30.0000000001, 30),  # float noise is not a second more
        ("release", 0.0, 0),
        ("release", 1.7, 1),  # down: never held back (or a FIFO group blocked) longer
        ("release", 0.9, 0),
        ("release", 50000.0, 43200),
    ],
)
def test_visibility_timeout_rounding(operation: str, asked: float, sent: int) -> None:
    backend, stubber, _ = stubbed()
    batch = handles(2)
    stubber.add_response(
        "change_message_visibility_batch",
        {"Successful": [{"Id": "0"}, {"Id": "1"}], "Failed": []},
        {"QueueUrl": QUEUE_URL, "Entries": change_entries(batch, sent)},
    )
    call = backend.extend if operation == "extend" else backend.release
    assert [o.kind for o in call(batch, asked)] == ["ok", "ok"]
    stubber.assert_no_pending_responses()


@pytest.mark.parametrize("timeout", [0.0, -1.0, 43200.5, 99999.0, math.inf, math.nan])
def test_an_extend_sqs_cannot_make_is_not_sent(timeout: float) -> None:
    # Sending 43200 for 99999 would make the manager's deadline later than SQS's.
    backend, stubber, _ = stubbed()
    outcomes = backend.extend(handles(2), timeout)
    assert [o.kind for o in outcomes] == ["fatal", "fatal"]
    assert (
        outcomes[0].detail.startswith("InvalidParameterValue") and "not sent" in outcomes[0].detail
    )
    stubber.assert_no_pending_responses()


def test_batches_of_ten_with_valid_unique_ids_and_no_single_calls() -> None:
    backend, stubber, client = stubbed()
    calls: list[str] = []
    client.meta.events.register(
        "before-parameter-build.sqs.*", lambda model, **_: calls.append(model.name)
    )
    batch = handles(25)
    seen: list[list[dict[str, Any]]] = []
    for start in (0, 10, 20):
        chunk = batch[start : start + 10]
        stubber.add_response(
            "change_message_visibility_batch",
            {"Successful": [{"Id": str(i)} for i in range(len(chunk))], "Failed": []},
            {"QueueUrl": QUEUE_URL, "Entries": change_entries(chunk, 30)},
        )
        seen.append(change_entries(chunk, 30))
    outcomes = backend.extend(batch, 30)
    stubber.assert_no_pending_responses()
    assert [o.kind for o in outcomes] == ["ok"] * 25
    assert calls == ["ChangeMessageVisibilityBatch"] * 3
    for entries in seen:
        ids = [entry["Id"] for entry in entries]
        assert len(ids) <= 10 and len(set(ids)) == len(ids)
        assert all(ENTRY_ID.fullmatch(i) for i in ids)


def test_a_batch_of_one_uses_the_batch_api() -> None:
    backend, stubber, _ = stubbed()
    [handle] = handles(1)
    stubber.add_response(
        "delete_message_batch",
        {"Successful": [{"Id": "0"}], "Failed": []},
        {"QueueUrl": QUEUE_URL, "Entries": delete_entries([handle])},
    )
    assert [o.kind for o in backend.delete([handle])] == ["ok"]


def test_empty_batch_makes_no_call() -> None:
    backend, stubber, _ = stubbed()
    assert backend.extend([], 30) == [] and backend.delete([]) == []
    stubber.assert_no_pending_responses()


# ---------------------------------------------------------------- adopt


def test_adopt_dict_and_resource_read_queue_attributes_once() -> None:
    clock = ManualClock()
    backend, stubber, client = stubbed(clock=clock)
    stubber.add_response(
        "get_queue_attributes",
        {"Attributes": {"VisibilityTimeout": "60"}},
        {"QueueUrl": QUEUE_URL, "AttributeNames": ["All"]},  # every attribute, read once
    )
    first = backend.adopt(sqs_message("a", receipt()))
    second = backend.adopt(sqs_message("b", receipt()))
    resource_message = _resource_message(client, sqs_message("c", receipt(), "from a resource"))
    third = backend.adopt(resource_message)
    stubber.assert_no_pending_responses()
    assert [m.id for m in (first, second, third)] == ["a", "b", "c"]
    assert third.body == "from a resource"
    assert third.receipt == resource_message.receipt_handle
    assert third.raw is resource_message
    for message in (first, second, third):
        assert message.visibility_timeout == 60.0
        assert message.received_at == clock.now()
        assert message.hard_deadline == clock.now() + 43200 - 60


def _resource_message(client: Any, data: dict[str, Any], url: str = QUEUE_URL) -> Any:
    import boto3

    session = boto3.session.Session(region_name="us-east-1")
    sqs = session.resource("sqs", aws_access_key_id="testing", aws_secret_access_key="testing")
    message = sqs.Message(url, data["ReceiptHandle"])
    message.meta.data = data
    return message


def test_adopt_first_receive_timestamp_shortens_the_estimate() -> None:
    clock = ManualClock()
    backend, _, _ = stubbed(clock=clock)
    now_ms = int(clock.wall() * 1000)
    message = backend.adopt(
        sqs_message("a", receipt(), receive_count=1, first_receive_ms=now_ms - 5000),
        visibility_timeout=30,
    )
    assert message.received_at == clock.now()
    assert message.visible_until == pytest.approx(clock.now() - 5 + 30)
    assert message.hard_deadline == pytest.approx(clock.now() - 5 + 43200 - 60)


@pytest.mark.parametrize(
    ("count", "first_ago", "sent_ago", "expected_left"),
    [
        (1, -3.0, None, 30.0),  # a timestamp "in the future" (clock skew) changes nothing
        (1, 40.0, None, -10.0),  # first delivery 40 s ago: adopted too late, really
        (4, 3600.0, 7200.0, 30.0),  # redelivery: old timestamps say nothing of this receive
        (4, 10.0, 20.0, 20.0),  # but shorten the estimate while it stays ahead
        (None, None, 12.0, 18.0),  # SentTimestamp alone
        (None, None, None, 30.0),  # no attributes asked for: now + visibility
    ],
)
def test_adopt_server_times_only_shorten(
    count: int | None, first_ago: float | None, sent_ago: float | None, expected_left: float
) -> None:
    clock = ManualClock()
    backend, _, _ = stubbed(clock=clock)
    now_ms = clock.wall() * 1000
    data = sqs_message(
        "a",
        receipt(),
        receive_count=count or 1,
        first_receive_ms=None if first_ago is None else int(now_ms - first_ago * 1000),
        sent_ms=None if sent_ago is None else int(now_ms - sent_ago * 1000),
    )
    if count is None:
        del data["Attributes"]["ApproximateReceiveCount"]
    message = backend.adopt(data, visibility_timeout=30)
    assert message.visible_until - clock.now() == pytest.approx(expected_left, abs=0.01)
    assert message.visible_until <= clock.now() + 30


def test_adopt_rejects_what_it_cannot_use() -> None:
    backend, _, client = stubbed()
    rh = receipt()
    with pytest.raises(TypeError, match="receive_message"):
        backend.adopt("not a message")
    with pytest.raises(ValueError, match="ReceiptHandle") as missing:
        backend.adopt({"MessageId": "x", "Body": "b"}, visibility_timeout=30)
    with pytest.raises(ValueError, match="not") as other_queue:
        backend.adopt(
            _resource_message(
                client,
                sqs_message("a", rh),
                "https://sqs.us-east-1.amazonaws.com/123456789012/other",
            ),
            visibility_timeout=30,
        )
    for error in (missing, other_queue):
        assert rh not in str(error.value)


# ---------------------------------------------------------------- with the manager


def state_of(lease: Lease) -> LeaseState:
    return lease.state


def _leased(
    clock: ManualClock, margin: float | None = None
) -> tuple[SQSBackend, Any, LeaseManager, Any]:
    backend, stubber, _ = stubbed(clock=clock)
    if margin is not None:
        backend.hard_deadline_margin = margin
    stubber.add_response("receive_message", {"Messages": [sqs_message("m-1", receipt())]})
    [message] = backend.receive(visibility_timeout=30)
    manager = LeaseManager(
        backend, clock=clock, visibility_timeout=30, timer_interval=1, minimal_life=2
    )
    lease = manager.register(message)
    return backend, stubber, manager, lease


@pytest.mark.parametrize("whole_call", [False, True], ids=["per-entry", "whole-call"])
def test_service_capped_answer_abandons_the_lease(whole_call: bool) -> None:
    clock = ManualClock()
    _, stubber, manager, lease = _leased(clock)
    message = (
        "Value 30 for parameter VisibilityTimeout is invalid. Reason: Total VisibilityTimeout "
        "for the message is beyond the limit [43200 seconds]"
    )
    if whole_call:
        add_error(
            stubber,
            "change_message_visibility_batch",
            code="InvalidParameterValue",
            query_code=None,
            message=message,
            status=400,
        )
    else:
        stubber.add_response(
            "change_message_visibility_batch",
            {
                "Successful": [],
                "Failed": [
                    {
                        "Id": "0",
                        "Code": "InvalidParameterValue",
                        "Message": message,
                        "SenderFault": True,
                    }
                ],
            },
        )
    clock.advance(25)
    stubber.assert_no_pending_responses()
    assert lease.state is LeaseState.ABANDONED
    assert lease.reason is not None and lease.reason.startswith("capped")
    assert lease.lost.is_set()
    assert manager.stats().capped == 1
    manager.close(release=False)


def test_hard_deadline_caps_the_lease_before_the_service_refuses() -> None:
    # A margin that leaves 40 s of the 12 hours: the manager extends up to the cap,
    # then ends the lease as capped itself, without asking SQS past it.
    clock = ManualClock()
    _, stubber, manager, lease = _leased(clock, margin=43200 - 40)
    stubber.add_response(
        "change_message_visibility_batch",
        {"Successful": [{"Id": "0"}], "Failed": []},
        {
            "QueueUrl": QUEUE_URL,
            "Entries": [{"Id": "0", "ReceiptHandle": ANY, "VisibilityTimeout": 20}],
        },
    )
    clock.advance(20)  # due at 30 - 10: asks only the 20 s left before the cap
    assert lease.state is LeaseState.ACTIVE and lease.extensions == 1
    clock.advance(15)
    stubber.assert_no_pending_responses()
    assert state_of(lease) is LeaseState.ABANDONED
    assert lease.reason is not None and lease.reason.startswith("capped")
    manager.close(release=False)


def test_receipts_never_reach_logs_reprs_or_errors(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="leasekeeper")
    clock = ManualClock()
    backend, stubber, manager, lease = _leased(clock)
    rh = lease.message.receipt
    quoted = f'The input receipt handle "{rh}" is not a valid receipt handle.'
    add_error(
        stubber,
        "change_message_visibility_batch",
        code="ThrottlingException",
        query_code="ThrottlingException",
        message=f"Rate exceeded for {rh}",
        status=400,
    )
    stubber.add_response(
        "change_message_visibility_batch",
        {
            "Successful": [],
            "Failed": [
                {
                    "Id": "0",
                    "Code": "ReceiptHandleIsInvalid",
                    "Message": quoted,
                    "SenderFault": True,
                }
            ],
        },
    )
    clock.advance(25)
    stubber.assert_no_pending_responses()
    assert lease.state is LeaseState.LOST
    outcomes = [
        *backend.delete([Handle("m-1", rh)]),  # un-stubbed: a BotoCoreError, mapped
    ]
    texts = [
        caplog.text,
        repr(backend),
        repr(lease),
        repr(lease.message),
        str(lease.reason),
        repr(outcomes),
        repr(manager.stats()),
    ]
    with pytest.raises(Exception) as raised:
        lease.complete()
    texts.append(str(raised.value))
    for text in texts:
        assert rh not in text
    assert "ReceiptHandleIsInvalid" in str(lease.reason)
    manager.close(release=False)
