"""Error mapping: Azurite's real answers where it gives them, a fake transport for the rest."""

from __future__ import annotations

from typing import Any

import pytest
from azure.core.exceptions import (
    HttpResponseError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceRequestTimeoutError,
    ServiceResponseError,
    ServiceResponseTimeoutError,
)
from azure.storage.queue import QueueClient

from leasekeeper import Handle, LeaseLost, LeaseManager, LeaseState, LostReason, Outcome
from leasekeeper.backends.azure import AzureQueueBackend, AzureQueueError, classify_error
from tests.azure.fakes import (
    FakeTransport,
    error_response,
    fake_client,
    no_content,
    updated_response,
)
from tests.azure.settings import KEY

pytestmark = pytest.mark.realtime


# ---------------------------------------------------------------- real Azurite answers


def test_stale_receipt_is_lost(backend: AzureQueueBackend, queue_client: QueueClient) -> None:
    queue_client.send_message("x")
    [message] = backend.receive(visibility_timeout=30)
    [fresh] = backend.extend([message.handle], 30)
    assert fresh.kind == "ok"
    # Azurite answers 400 PopReceiptMismatch for the dead receipt (Azure may say 404)
    assert backend.extend([message.handle], 30) == [
        Outcome("lost", detail="PopReceiptMismatch (HTTP 400)")
    ]
    assert backend.release([message.handle], 0)[0].kind == "lost"
    assert backend.delete([message.handle])[0] == Outcome(
        "lost", detail="PopReceiptMismatch (HTTP 400)"
    )


def test_deleted_message_is_lost(backend: AzureQueueBackend, queue_client: QueueClient) -> None:
    queue_client.send_message("x")
    [message] = backend.receive(visibility_timeout=30)
    assert backend.delete([message.handle])[0].kind == "ok"
    expected = Outcome("lost", detail="MessageNotFound (HTTP 404)")
    assert backend.extend([message.handle], 30) == [expected]
    assert backend.release([message.handle], 0) == [expected]
    assert backend.delete([message.handle]) == [expected]


def test_delete_after_loss_raises_lease_lost(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    """Rule 4: "not found" on a delete is a loss, not a success."""
    queue_client.send_message("x")
    [message] = backend.receive(visibility_timeout=30)
    manager = LeaseManager(backend, visibility_timeout=30, timer_interval=1, minimal_life=2)
    lease = manager.register(message)
    assert backend.delete([message.handle])[0].kind == "ok"  # someone else deleted it
    with pytest.raises(LeaseLost, match="MessageNotFound"):
        lease.complete()
    assert lease.state is LeaseState.LOST
    manager.close()


def test_missing_queue_is_fatal(azurite: str) -> None:
    client = QueueClient.from_connection_string(azurite, "no-such-queue-here")
    with AzureQueueBackend(client) as backend:
        handle = Handle("00000000-0000-0000-0000-000000000000", "receipt-that-does-not-matter")
        expected = Outcome("fatal", detail="QueueNotFound (HTTP 404)")
        assert backend.extend([handle], 30) == [expected]
        assert backend.release([handle], 0) == [expected]
        assert backend.delete([handle]) == [expected]
        with pytest.raises(AzureQueueError) as info:
            backend.receive()
        assert info.value.kind == "fatal"
        assert info.value.detail == "QueueNotFound (HTTP 404)"
        assert info.value.__cause__ is None and info.value.__context__ is None
    client.close()


def test_wrong_key_is_fatal(azurite: str, queue_name: str) -> None:
    wrong = azurite.replace(KEY, "A" * 86 + "==")
    client = QueueClient.from_connection_string(wrong, queue_name)
    with AzureQueueBackend(client) as backend:
        [outcome] = backend.extend([Handle("id", "receipt")], 30)
        assert outcome == Outcome("fatal", detail="AuthenticationFailed (HTTP 403)")
        with pytest.raises(AzureQueueError, match="AuthenticationFailed"):
            backend.receive()
    client.close()


def test_out_of_range_from_azurite_is_a_bug(queue_client: QueueClient) -> None:
    """The backend never sends it (it checks first), but the service's answer maps too."""
    queue_client.send_message("x")
    message = next(iter(queue_client.receive_messages(visibility_timeout=30)))
    with pytest.raises(HttpResponseError) as info:
        queue_client.update_message(
            message.id, pop_receipt=message.pop_receipt, visibility_timeout=700000
        )
    kind, detail = classify_error(info.value)
    assert kind == "fatal"
    assert detail.startswith("OutOfRangeQueryParameterValue (HTTP 400) [visibilitytimeout]")
    assert "700000" not in detail


def test_connection_refused_is_retry() -> None:
    from tests.azure.settings import connection_string
    from tests.services import free_port as _free_port

    # retry_total=0: the SDK's own retries (15 s backoff) would only slow the receive down;
    # the per-thread clients used for extend/delete/release have them off already.
    port = _free_port()
    client = QueueClient.from_connection_string(connection_string(port), "q", retry_total=0)
    with AzureQueueBackend(client) as backend:
        [outcome] = backend.extend([Handle("id", "secret-receipt")], 30)
        where = f"127.0.0.1:{port}"  # named: the endpoint nothing answered at
        assert outcome == Outcome("retry", detail=f"could not reach {where} (ServiceRequestError)")
        with pytest.raises(AzureQueueError) as info:
            backend.receive()
        assert info.value.kind == "retry"
    client.close()


def test_out_of_range_timeouts_are_not_sent(backend: AzureQueueBackend) -> None:
    handle = Handle("id", "receipt")
    for bad in (0.0, -1.0, 604801.0, float("nan"), float("inf")):
        [outcome] = backend.extend([handle], bad)
        assert outcome.kind == "fatal", bad
    for bad in (-1.0, float("nan"), float("inf")):
        [outcome] = backend.release([handle], bad)
        assert outcome.kind == "fatal", bad


# ---------------------------------------------------------------- fake transport


def _backend_answering(answer: Any) -> tuple[AzureQueueBackend, FakeTransport]:
    transport = FakeTransport(lambda request: answer)
    backend = AzureQueueBackend(
        fake_client(transport), client_factory=lambda: fake_client(transport)
    )
    return backend, transport


@pytest.mark.parametrize(
    ("status", "code", "kind"),
    [
        (404, "MessageNotFound", "lost"),
        (400, "PopReceiptMismatch", "lost"),
        (404, "PopReceiptMismatch", "lost"),
        (404, "QueueNotFound", "fatal"),
        (403, "AuthenticationFailed", "fatal"),
        (403, "AuthorizationFailure", "fatal"),
        (403, "AuthorizationPermissionMismatch", "fatal"),
        (409, "QueueBeingDeleted", "fatal"),
        (400, "OutOfRangeQueryParameterValue", "fatal"),
        (400, "InvalidQueryParameterValue", "fatal"),
        (503, "ServerBusy", "retry"),
        (500, "InternalError", "retry"),
        (500, "OperationTimedOut", "retry"),
        (502, "BadGateway", "retry"),
        (429, "TooManyRequests", "retry"),
    ],
)
def test_service_error_codes(status: int, code: str, kind: str) -> None:
    backend, transport = _backend_answering(error_response(status, code))
    handle = Handle("msg-1", "the-receipt")
    for outcome in (
        backend.extend([handle], 30)[0],
        backend.release([handle], 0)[0],
        backend.delete([handle])[0],
    ):
        assert outcome.kind == kind
        assert outcome.detail.startswith(f"{code} (HTTP {status})")
        assert outcome.receipt is None
    # extend and release sent Update Message with the id and an explicit timeout
    (m1, u1), (m2, u2), (m3, _) = transport.sent
    assert (m1, m2, m3) == ("PUT", "PUT", "DELETE")
    assert "/messages/msg-1?" in u1 and "visibilitytimeout=30" in u1
    assert "visibilitytimeout=0" in u2
    backend.close()


def test_invalid_receipt_parameter_detail_names_the_parameter_not_the_value() -> None:
    receipt = "AgAAAAMAAAAAAAAAsecretSECRET=="
    answer = error_response(
        400,
        "InvalidQueryParameterValue",
        {"QueryParameterName": "popreceipt", "QueryParameterValue": receipt, "Reason": "bad"},
        message="Value for one of the query parameters specified in the request URI is invalid.",
    )
    backend, _ = _backend_answering(answer)
    [outcome] = backend.extend([Handle("msg-1", receipt)], 30)
    assert outcome.kind == "fatal"
    assert outcome.detail.startswith("InvalidQueryParameterValue (HTTP 400) [popreceipt]")
    assert "leasekeeper" in outcome.detail  # says it is a bug
    assert receipt not in outcome.detail and receipt not in repr(outcome)


@pytest.mark.parametrize(
    "exc",
    [
        ServiceRequestError("connect failed: /q/messages/1?popreceipt=SECRET"),
        ServiceResponseError("connection reset: /q/messages/1?popreceipt=SECRET"),
        ServiceRequestTimeoutError("timed out"),
        ServiceResponseTimeoutError("read timed out"),
        ConnectionResetError("reset"),
        TimeoutError("timeout"),
    ],
)
def test_network_errors_are_retry(exc: BaseException) -> None:
    backend, _ = _backend_answering(exc)
    handle = Handle("msg-1", "SECRET")
    for outcome in (
        backend.extend([handle], 30)[0],
        backend.release([handle], 0)[0],
        backend.delete([handle])[0],
    ):
        assert outcome.kind == "retry"
        assert "SECRET" not in outcome.detail
    backend.close()


def test_update_answer_carries_the_new_receipt() -> None:
    backend, transport = _backend_answering(updated_response("new-receipt"))
    [outcome] = backend.extend([Handle("msg-1", "old-receipt")], 7.01)
    assert outcome == Outcome("ok", receipt="new-receipt")
    assert "visibilitytimeout=8" in transport.sent[-1][1]  # rounded up
    [outcome] = backend.release([Handle("msg-1", "new-receipt")], 0)
    assert outcome == Outcome("ok", receipt="new-receipt")
    assert "visibilitytimeout=0" in transport.sent[-1][1]  # explicit, not left out


def test_delete_answer() -> None:
    backend, transport = _backend_answering(no_content())
    assert backend.delete([Handle("msg-1", "r")]) == [Outcome("ok")]
    assert transport.sent[-1][0] == "DELETE"


class _RaisingClient:
    """A stand-in client whose calls raise what the test says."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def update_message(self, *args: Any, **kwargs: Any) -> Any:
        raise self.exc

    def delete_message(self, *args: Any, **kwargs: Any) -> Any:
        raise self.exc

    def close(self) -> None:
        pass


def _coded(exc: HttpResponseError, code: str) -> HttpResponseError:
    exc.error_code = code  # what the SDK's process_storage_error sets
    return exc


@pytest.mark.parametrize(
    ("exc", "kind", "detail"),
    [
        (
            ResourceNotFoundError("The specified message does not exist."),
            "lost",
            "ResourceNotFoundError",
        ),
        (_coded(ResourceNotFoundError("gone"), "MessageNotFound"), "lost", "MessageNotFound"),
        (_coded(HttpResponseError("x"), "PopReceiptMismatch"), "lost", "PopReceiptMismatch"),
        (_coded(HttpResponseError("x"), "QueueNotFound"), "fatal", "QueueNotFound"),
        (_coded(HttpResponseError("x"), "AuthorizationFailure"), "fatal", "AuthorizationFailure"),
        (_coded(HttpResponseError("x"), "ServerBusy"), "retry", "ServerBusy"),
        (HttpResponseError("no response at all"), "retry", "HttpResponseError"),
        (ValueError("odd"), "retry", "unexpected ValueError"),
    ],
)
def test_exceptions_from_a_monkeypatched_client(
    queue_client: QueueClient, exc: BaseException, kind: str, detail: str
) -> None:
    backend = AzureQueueBackend(queue_client, client_factory=lambda: _RaisingClient(exc))  # type: ignore[arg-type,return-value]
    handle = Handle("msg-1", "r")
    assert backend.extend([handle], 30) == [Outcome(kind, detail=detail)]  # type: ignore[arg-type]
    assert backend.delete([handle]) == [Outcome(kind, detail=detail)]  # type: ignore[arg-type]


def test_every_outcome_kind_reaches_the_manager(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    """A fatal extend ends the lease (LOST, reason "fatal: QueueNotFound ...")."""
    queue_client.send_message("x")
    [message] = backend.receive(visibility_timeout=3)
    raising = AzureQueueBackend(
        queue_client,
        client_factory=lambda: _RaisingClient(_coded(HttpResponseError("x"), "QueueNotFound")),  # type: ignore[arg-type,return-value]
    )
    message.backend = raising
    reasons: list[str] = []
    with LeaseManager(
        raising,
        renewer="thread",  # the clients client_factory makes are this process's
        visibility_timeout=3,
        timer_interval=0.2,
        minimal_life=0.5,
        on_lost=lambda lease, reason: reasons.append(reason),
    ) as manager:
        lease = manager.register(message)
        assert lease.lost.wait(5)
    assert lease.state is LeaseState.LOST
    assert reasons == [LostReason.FATAL]
    assert (lease.reason or "").startswith("fatal: QueueNotFound")
