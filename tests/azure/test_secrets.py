"""Pop receipts and the account key never reach logs, reprs or exception text."""

from __future__ import annotations

import logging
import traceback

import pytest
from azure.storage.queue import QueueClient

from leasekeeper import Handle, LeaseManager
from leasekeeper.backends.azure import AzureQueueBackend, AzureQueueError, scrub
from tests.azure.settings import KEY

pytestmark = pytest.mark.realtime


def _assert_clean(text: str, secrets: set[str]) -> None:
    for secret in secrets:
        assert secret not in text, (
            f"a secret leaked: ...{text[max(0, text.find(secret) - 80) :][:160]}"
        )


@pytest.mark.parametrize("sdk_network_trace", [False, True])
def test_receipts_and_key_stay_out_of_logs_and_reprs(
    azurite: str, queue_name: str, caplog: pytest.LogCaptureFixture, sdk_network_trace: bool
) -> None:
    caplog.set_level(logging.DEBUG)  # everything: leasekeeper, azure.*, urllib3
    # With logging_enable=True the SDK's network trace logs every request URL and
    # header at DEBUG level: the URL of an update carries popreceipt=...
    client = QueueClient.from_connection_string(
        azurite, queue_name, logging_enable=sdk_network_trace
    )

    def per_thread() -> QueueClient:
        return QueueClient.from_connection_string(
            azurite, queue_name, retry_total=0, logging_enable=sdk_network_trace
        )

    backend = AzureQueueBackend(client, client_factory=per_thread)
    secrets = {KEY, azurite}
    for i in range(3):
        client.send_message(f"m{i}")
    messages = backend.receive(max_messages=3, visibility_timeout=5)
    assert len(messages) == 3
    secrets |= {m.receipt for m in messages}

    a, b, c = messages
    [extended] = backend.extend([a.handle], 5)
    assert extended.receipt is not None
    secrets.add(extended.receipt)
    [stale] = backend.extend([a.handle], 5)  # the old receipt: PopReceiptMismatch
    assert stale.kind == "lost"
    [released] = backend.release([b.handle], 0)
    assert released.receipt is not None
    secrets.add(released.receipt)
    assert backend.delete([Handle(a.id, extended.receipt)])[0].kind == "ok"
    assert backend.delete([Handle(a.id, extended.receipt)])[0].kind == "lost"
    with LeaseManager(backend, visibility_timeout=5, timer_interval=0.2, minimal_life=0.5) as m:
        lease = m.register(c)
        lease.complete()
        texts = [repr(lease), repr(m), str(m.stats())]

    texts += [repr(backend), repr(client.credential)]
    texts += [repr(x) for x in messages]
    texts += [repr(x) for x in (extended, stale, released, a.handle)]
    for text in texts:
        _assert_clean(text, secrets)
    records = caplog.records
    assert any(r.name.startswith("urllib3") for r in records), "urllib3 did not log at all?"
    if sdk_network_trace:
        # the SDK really did log the update URLs (with the receipt blanked out)
        assert any("popreceipt=<redacted>" in r.getMessage() for r in records)
    _assert_clean(caplog.text, secrets)
    for record in records:
        _assert_clean(record.getMessage(), secrets)
    backend.close()
    client.close()


def test_exception_text_has_no_secrets(azurite: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    client = QueueClient.from_connection_string(azurite, "no-such-queue-xyz", retry_total=0)
    with AzureQueueBackend(client) as backend:
        with pytest.raises(AzureQueueError) as info:
            backend.receive()
        text = "".join(traceback.format_exception(info.value))
        assert "QueueNotFound" in text
        _assert_clean(text, {KEY, azurite})
        receipt = "AgAAAAMAAAAAAAAAsecret+receipt/value=="
        outcome = backend.extend([Handle("some-id", receipt)], 5)[0]
        assert outcome.kind == "fatal"
        _assert_clean(repr(outcome) + outcome.detail + caplog.text, {receipt, KEY})


def test_network_error_text_with_the_receipt_in_the_url_is_not_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tests.azure.settings import connection_string
    from tests.services import free_port as _free_port

    caplog.set_level(logging.DEBUG)
    dead = connection_string(_free_port())
    client = QueueClient.from_connection_string(dead, "q", retry_total=0)
    receipt = "AgAAAAMAAAAAAAAAnetwork+receipt/value=="
    with AzureQueueBackend(client) as backend:
        [outcome] = backend.extend([Handle("some-id", receipt)], 5)
        assert outcome.kind == "retry"
        with LeaseManager(backend, visibility_timeout=5, timer_interval=1, minimal_life=2) as m:
            del m
    _assert_clean(caplog.text + repr(outcome), {receipt, KEY})


def test_scrub() -> None:
    text = (
        "PUT http://h/devstoreaccount1/q/messages/1?popreceipt=AgAA%2Bx%3D%3D&visibilitytimeout=5 "
        "'x-ms-popreceipt': 'AgAAsecret' <PopReceipt>AgAAbody</PopReceipt> "
        "queryparametervalue:AgAAvalue\nnext line sig=abc%2Fdef&se=1 AccountKey=Zm9v;"
    )
    out = scrub(text, ["extra-secret"])
    for leaked in ("AgAA%2Bx", "AgAAsecret", "AgAAbody", "AgAAvalue", "abc%2Fdef", "Zm9v"):
        assert leaked not in out
    assert "visibilitytimeout=5" in out and "next line" in out
    assert scrub("extra-secret here", ["extra-secret"]) == "<redacted> here"
