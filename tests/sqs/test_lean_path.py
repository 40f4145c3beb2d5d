"""The lean SQS call path (backends/sqs/lean.py) where it differs from the client's:
when it stands in for the client and when not, botocore's standard retries on
the calls botocore retries (a receive) and one attempt on leasekeeper's own, the
connection failures as botocore names them, a client without credentials. The
error shapes are in test_errors.py, the contract in tests/contract (both run on
both paths)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config

from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.backends.sqs.lean import lean_path, why_not
from leasekeeper.errors import ReceiveError
from tests.sqs.scripted import ScriptedSQS
from tests.sqs.stubbed import QUEUE_URL, REGION, handles

THROTTLED = {"code": "RequestThrottled", "query_code": "RequestThrottled", "message": "Rate"}
UNAVAILABLE = {"code": "ServiceUnavailable", "query_code": "ServiceUnavailable", "message": ""}


def client_of(endpoint: str, **config: Any) -> Any:
    return boto3.client(
        "sqs",
        region_name=REGION,
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(**config) if config else None,
    )


@pytest.fixture
def script() -> Iterator[ScriptedSQS]:
    with ScriptedSQS() as made:
        yield made


def lean_backend(endpoint: str, **options: Any) -> tuple[SQSBackend, list[float]]:
    """A backend on the lean path whose backoff sleeps are recorded, not slept."""
    config = options.pop("config", {"retries": {"total_max_attempts": 3, "mode": "standard"}})
    backend = SQSBackend(client_of(endpoint, **config), QUEUE_URL, **options)
    assert backend.lean is not None and backend.lean.usable()
    slept: list[float] = []
    backend.lean.sleep = slept.append
    return backend, slept


def test_a_receive_is_retried_as_botocore_retries_it(script: ScriptedSQS) -> None:
    backend, slept = lean_backend(script.url)
    script.error("ReceiveMessage", status=400, **THROTTLED)
    script.error("ReceiveMessage", status=503, **UNAVAILABLE)
    script.answer("ReceiveMessage", {"Messages": []})
    assert backend.receive(max_messages=10, visibility_timeout=30) == []
    assert len(script.requests) == 3 and len(slept) == 2
    # botocore's backoff: up to 1 s (a throttle) then up to 0.1 s (a 5xx, 2nd retry)
    assert 0 <= slept[0] <= 1 and 0 <= slept[1] <= 0.1


def test_a_receive_gives_up_after_the_clients_max_attempts(script: ScriptedSQS) -> None:
    backend, slept = lean_backend(script.url)
    for _ in range(3):
        script.error("ReceiveMessage", status=503, **UNAVAILABLE)
    with pytest.raises(ReceiveError) as raised:
        backend.receive(max_messages=10, visibility_timeout=30)
    assert raised.value.kind == "retry" and "ServiceUnavailable" in raised.value.detail
    assert len(script.requests) == 3 and len(slept) == 2


def test_a_fatal_error_is_not_retried(script: ScriptedSQS) -> None:
    backend, slept = lean_backend(script.url)
    script.error(
        "ReceiveMessage",
        code="AWS.SimpleQueueService.NonExistentQueue",
        query_code="QueueDoesNotExist",
        message="The specified queue does not exist.",
        status=400,
    )
    with pytest.raises(ReceiveError) as raised:
        backend.receive(max_messages=10, visibility_timeout=30)
    assert raised.value.kind == "fatal" and "QueueDoesNotExist" in raised.value.detail
    assert len(script.requests) == 1 and slept == []


@pytest.mark.parametrize("client_retries", [False, True])
def test_leasekeepers_own_calls_make_one_attempt_unless_client_retries(
    script: ScriptedSQS, client_retries: bool
) -> None:
    backend, _ = lean_backend(script.url, client_retries=client_retries)
    for _ in range(3):
        script.error("ChangeMessageVisibilityBatch", status=503, **UNAVAILABLE)
    [outcome] = backend.extend(handles(1), 30)
    assert outcome.kind == "retry" and "ServiceUnavailable" in outcome.detail
    assert len(script.requests) == (3 if client_retries else 1)


def test_a_connection_closed_without_an_answer_is_retry(script: ScriptedSQS) -> None:
    backend, _ = lean_backend(script.url)
    script.reset("DeleteMessageBatch")
    [outcome] = backend.delete(handles(1))
    assert outcome.kind == "retry" and outcome.detail.endswith("(ConnectionClosedError)")
    assert outcome.detail.startswith("could not reach 127.0.0.1:")  # the endpoint, named


def test_no_server_is_retry_and_a_silent_one_times_out() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    backend, _ = lean_backend(f"http://127.0.0.1:{port}")  # nothing listens
    [outcome] = backend.extend(handles(1), 30)
    assert outcome.kind == "retry"
    assert outcome.detail == f"could not reach 127.0.0.1:{port} (EndpointConnectionError)"
    with socket.socket() as silent:  # accepts (the backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        config = {"read_timeout": 0.3, "retries": {"total_max_attempts": 1}}
        backend, _ = lean_backend(f"http://127.0.0.1:{silent.getsockname()[1]}", config=config)
        [outcome] = backend.delete(handles(1))
        silent_port = silent.getsockname()[1]
    assert outcome.kind == "retry"
    assert outcome.detail == f"could not reach 127.0.0.1:{silent_port} (ReadTimeoutError)"


def test_a_client_without_credentials_is_fatal_and_says_what_to_set(
    script: ScriptedSQS, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    client = boto3.session.Session().client("sqs", region_name=REGION, endpoint_url=script.url)
    backend = SQSBackend(client, QUEUE_URL)
    assert backend.lean is not None and backend.lean.usable()
    [outcome] = backend.extend(handles(1), 30)
    assert outcome.kind == "fatal" and "AWS_ACCESS_KEY_ID" in outcome.detail
    assert script.requests == []


def test_a_hook_of_yours_sends_the_calls_through_the_client(script: ScriptedSQS) -> None:
    backend, _ = lean_backend(script.url)
    seen: list[str] = []
    backend.client.meta.events.register(
        "before-call.sqs", lambda model, **_: seen.append(model.name)
    )
    script.answer("DeleteMessageBatch", {"Successful": [{"Id": "0"}], "Failed": []})
    assert [o.kind for o in backend.delete(handles(1))] == ["ok"]
    assert seen == ["DeleteMessageBatch"]  # the client made the call
    assert backend.lean is not None and not backend.lean.usable()


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ({"proxies": {"http": "http://127.0.0.1:1"}}, "proxies"),
        ({"retries": {"mode": "adaptive"}}, "retry mode"),
        ({"retries": {"mode": "legacy"}}, "retry mode"),
        ({"tcp_keepalive": True}, "tcp_keepalive"),
    ],
)
def test_a_client_setting_the_lean_path_cannot_honour_keeps_the_client(
    script: ScriptedSQS, config: dict[str, Any], reason: str
) -> None:
    client = client_of(script.url, **config)
    assert reason in str(why_not(client))
    backend = SQSBackend(client, QUEUE_URL)
    assert backend.lean is None and lean_path(client) is None
    script.answer("ChangeMessageVisibilityBatch", {"Successful": [{"Id": "0"}], "Failed": []})
    if "proxies" not in config:  # the client itself still reaches the service
        assert [o.kind for o in backend.extend(handles(1), 30)] == ["ok"]


def test_fast_path_false_keeps_every_call_on_the_client(script: ScriptedSQS) -> None:
    backend = SQSBackend(client_of(script.url), QUEUE_URL, fast_path=False)
    assert backend.lean is None
    assert dict(backend.spec().options).get("fast_path") is False  # and so where rebuilt
