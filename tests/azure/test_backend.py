"""AzureQueueBackend against Azurite: receive, adopt, extend, release, delete."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

import pytest
from azure.storage.queue import (
    BinaryBase64DecodePolicy,
    BinaryBase64EncodePolicy,
    QueueClient,
    QueueMessage,
)

from leasekeeper import Handle, LeaseManager, LeaseState, Message
from leasekeeper.backends.azure import (
    DEFAULT_EXPIRY_MARGIN,
    AzureQueueBackend,
)
from leasekeeper.backends.base import Backend
from leasekeeper.testing import ManualClock
from tests.azure.settings import KEY

pytestmark = pytest.mark.realtime


def _gone(client: QueueClient) -> bool:
    """No message left in the queue, visible or not."""
    return client.get_queue_properties().approximate_message_count == 0


def test_import_without_the_sdk_names_the_extra() -> None:
    code = (
        "import sys\n"
        "sys.modules['azure.storage.queue'] = None\n"
        "import leasekeeper\n"  # the core must import without the extra
        "try:\n"
        "    import leasekeeper.backends.azure\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert "pip install 'azure-storage-queue>=12.8'" in out.stdout
    assert "azure-storage-queue" in out.stdout


def test_attributes_and_repr(backend: AzureQueueBackend, queue_name: str) -> None:
    assert isinstance(backend, Backend)
    assert backend.max_batch == 1
    assert backend.max_visibility == 604800.0
    assert backend.rotates_receipts is True
    text = repr(backend)
    assert text == f"AzureQueueBackend(account='devstoreaccount1', queue={queue_name!r})"
    assert KEY not in text and "AccountKey" not in text and "http" not in text


def test_constructor_checks() -> None:
    with pytest.raises(TypeError, match="QueueClient"):
        AzureQueueBackend(object())  # type: ignore[arg-type]


def test_receive_records_deadlines_before_the_request(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    queue_client.send_message("hello", time_to_live=3600)
    before = time.monotonic()
    [message] = backend.receive(max_messages=5, visibility_timeout=10)
    after = time.monotonic()
    assert isinstance(message, Message)
    assert message.body == "hello"
    assert message.receive_count == 1
    assert isinstance(message.raw, QueueMessage)
    assert message.id == message.raw.id
    assert before <= message.received_at <= after
    assert message.visibility_timeout == 10.0
    # next_visible_on (whole seconds, the service's clock) may only shorten the estimate
    assert message.deadline_hint is not None
    assert message.visible_until <= message.received_at + 10.0
    assert message.visible_until > after + 7.0  # less 1 s of truncation, less latency
    # hard_deadline: expires_on in local monotonic time, less the margin
    assert message.hard_deadline is not None
    expected = message.received_at + 3600 - DEFAULT_EXPIRY_MARGIN
    assert expected - 2.0 <= message.hard_deadline <= expected + 0.5
    assert "receipt" not in repr(message).lower() or "<" in repr(message)
    assert message.receipt not in repr(message)


def test_receive_counts_and_limits(backend: AzureQueueBackend, queue_client: QueueClient) -> None:
    for i in range(40):
        queue_client.send_message(f"m{i}")
    first = backend.receive(max_messages=100, visibility_timeout=30)  # capped at 32
    assert len(first) == 32
    rest = backend.receive(max_messages=32, visibility_timeout=30)
    assert len(rest) == 8
    assert len({m.id for m in first + rest}) == 40
    with pytest.raises(ValueError):
        backend.receive(max_messages=0)
    with pytest.raises(ValueError):
        backend.receive(visibility_timeout=0)
    with pytest.raises(ValueError):
        backend.receive(visibility_timeout=604801)
    with pytest.raises(ValueError):
        backend.receive(wait_seconds=-1)


def test_binary_policy_gives_bytes(azurite: str, queue_name: str) -> None:
    client = QueueClient.from_connection_string(
        azurite,
        queue_name,
        message_encode_policy=BinaryBase64EncodePolicy(),
        message_decode_policy=BinaryBase64DecodePolicy(),
    )
    with AzureQueueBackend(client) as backend:
        client.send_message(b"\x00\xffbinary")
        [message] = backend.receive(visibility_timeout=5)
        assert message.body == b"\x00\xffbinary"
        assert backend.delete([message.handle])[0].kind == "ok"
    client.close()


class _Counting:
    """raw_request_hook that counts Get Messages calls."""

    def __init__(self) -> None:
        self.gets = 0

    def __call__(self, request: Any) -> None:
        if request.http_request.method == "GET":
            self.gets += 1


def test_wait_seconds_polls_with_backoff_and_stops_on_time(azurite: str, queue_name: str) -> None:
    counter = _Counting()
    client = QueueClient.from_connection_string(azurite, queue_name, raw_request_hook=counter)
    with AzureQueueBackend(client) as backend:
        start = time.monotonic()
        assert backend.receive(wait_seconds=2.0, visibility_timeout=5) == []
        took = time.monotonic() - start
    client.close()
    assert 1.9 <= took < 2.8
    # 0.2 + 0.4 + 0.8 + ... : a handful of polls, never a tight loop
    assert 3 <= counter.gets <= 7


def test_wait_seconds_returns_when_a_message_arrives(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    timer = threading.Timer(0.7, lambda: queue_client.send_message("late"))
    timer.start()
    start = time.monotonic()
    messages = backend.receive(wait_seconds=10.0, visibility_timeout=5)
    took = time.monotonic() - start
    timer.join()
    assert [m.body for m in messages] == ["late"]
    assert took < 3.0


def test_receive_on_a_driven_clock_polls_once(queue_client: QueueClient) -> None:
    with AzureQueueBackend(queue_client, clock=ManualClock()) as backend:
        start = time.monotonic()
        assert backend.receive(wait_seconds=30.0) == []
        assert time.monotonic() - start < 2.0


def test_extend_rotates_the_receipt_and_hides_the_message(
    backend: AzureQueueBackend, other_consumer: AzureQueueBackend, queue_client: QueueClient
) -> None:
    queue_client.send_message("x")
    [message] = backend.receive(visibility_timeout=2)
    [outcome] = backend.extend([message.handle], 5.2)  # rounded up to 6 s
    assert outcome.kind == "ok"
    assert outcome.receipt and outcome.receipt != message.receipt
    time.sleep(2.5)
    assert other_consumer.receive(visibility_timeout=5) == []
    # the old receipt is dead
    [stale] = backend.extend([message.handle], 5)
    assert (stale.kind, stale.detail) == ("lost", "PopReceiptMismatch (HTTP 400)")
    assert backend.delete([Handle(message.id, outcome.receipt)])[0].kind == "ok"
    assert _gone(queue_client)


def test_ten_extensions_then_delete_with_the_newest_receipt(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    queue_client.send_message("x")
    [message] = backend.receive(visibility_timeout=5)
    handle = message.handle
    seen = {handle.receipt}
    for _ in range(10):
        [outcome] = backend.extend([handle], 5)
        assert outcome.kind == "ok", outcome
        assert outcome.receipt is not None and outcome.receipt not in seen
        seen.add(outcome.receipt)
        handle = Handle(message.id, outcome.receipt)
    [deleted] = backend.delete([handle])
    assert deleted.kind == "ok", deleted
    assert _gone(queue_client)


def test_ten_extensions_by_the_manager_then_complete(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    """The same through a LeaseManager: the lease's delete uses the newest receipt."""
    queue_client.send_message("x")
    with LeaseManager(
        backend, visibility_timeout=2, timer_interval=0.1, minimal_life=0.5, extend_threshold=1.8
    ) as manager:
        # Its renewer started before the receive: a renewer process's start (a second on
        # a loaded machine) would eat the 2 s the message is hidden for.
        manager.start()
        [message] = backend.receive(visibility_timeout=2)
        lease = manager.register(message)
        deadline = time.monotonic() + 15
        while lease.extensions < 10 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lease.extensions >= 10
        lease.complete()
        assert lease.state is LeaseState.COMPLETED
        assert manager.stats().extend_errors == 0
    assert _gone(queue_client)


def test_release_makes_the_message_visible_again(
    backend: AzureQueueBackend, other_consumer: AzureQueueBackend, queue_client: QueueClient
) -> None:
    queue_client.send_message("x")
    [message] = backend.receive(visibility_timeout=60)
    [outcome] = backend.release([message.handle], 0.0)
    assert outcome.kind == "ok" and outcome.receipt and outcome.receipt != message.receipt
    [again] = other_consumer.receive(visibility_timeout=60)
    assert again.id == message.id and again.receive_count == 2
    # a release with a delay keeps it hidden that long (rounded up to whole seconds)
    [outcome] = other_consumer.release([again.handle], 1.2)
    assert outcome.kind == "ok"
    assert backend.receive(visibility_timeout=5) == []
    [third] = backend.receive(wait_seconds=4, visibility_timeout=5)
    assert third.id == message.id and third.receive_count == 3


def test_adopt_a_message_received_with_the_sdk(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    queue_client.send_message("mine", time_to_live=600)
    raw = next(iter(queue_client.receive_messages(visibility_timeout=20)))
    now = time.monotonic()
    message = backend.adopt(raw, visibility_timeout=20)
    assert message.body == "mine" and message.raw is raw and message.receipt == raw.pop_receipt
    # next_visible_on (less the skew allowance) shortens the estimate counted from now
    assert message.visible_until <= now + 20
    assert message.visible_until >= now + 17
    assert message.hard_deadline is not None and message.hard_deadline < now + 600
    # without visibility_timeout: next_visible_on alone
    alone = backend.adopt(raw)
    assert now + 17 <= alone.visible_until <= now + 20
    manager = LeaseManager(backend, visibility_timeout=10, timer_interval=1, minimal_life=2)
    with manager, manager.lease(message):
        pass
    assert _gone(queue_client)


def test_adopt_rejects_what_it_cannot_lease(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    with pytest.raises(TypeError, match="QueueMessage"):
        backend.adopt({"id": "x"})
    queue_client.send_message("peeked")
    [peeked] = queue_client.peek_messages()
    with pytest.raises(ValueError, match="pop receipt"):
        backend.adopt(peeked, visibility_timeout=30)


def test_extend_past_the_known_expiry_is_capped_without_a_request(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    queue_client.send_message("x", time_to_live=30)
    [message] = backend.receive(visibility_timeout=5)
    [outcome] = backend.extend([message.handle], 60)
    assert outcome.kind == "capped" and "expires_on" in outcome.detail
    # the receipt was not used up: a short extend still works
    [outcome] = backend.extend([message.handle], 5)
    assert outcome.kind == "ok"


def test_message_not_found_after_the_expiry_is_capped(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    queue_client.send_message("x", time_to_live=1)
    [message] = backend.receive(visibility_timeout=1)
    time.sleep(2.2)  # Azurite deleted it at its expiry
    # Simulate a local clock 1.5 s behind the service's, so the local check (which
    # refuses an extend past the known expiry without a request) lets it through.
    backend._expiry[message.id] = time.time() + 1.5
    [outcome] = backend.extend([message.handle], 1)
    assert (outcome.kind, outcome.detail) == ("capped", "MessageNotFound: the message expired")
    # a delete is no extend: "not found" there stays a loss (rule 4)
    assert backend.delete([message.handle])[0].kind == "lost"


def test_calls_after_close_use_new_clients(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    queue_client.send_message("x")
    [message] = backend.receive(visibility_timeout=10)
    [outcome] = backend.extend([message.handle], 10)
    backend.close()
    [outcome] = backend.extend([Handle(message.id, outcome.receipt or "")], 10)
    assert outcome.kind == "ok"
    assert backend.delete([Handle(message.id, outcome.receipt or "")])[0].kind == "ok"


# ---------------------------------------------------------------- dead letters and caps


def test_the_poison_queue_is_made_once_and_shares_the_credential(
    azurite: str, backend: AzureQueueBackend
) -> None:
    poison = backend.poison_queue()
    assert poison.queue_name == f"{backend.queue_name}-poison"
    assert backend.poison_queue().queue_name == poison.queue_name  # there already: kept
    sent = poison.send("failed too often")
    [message] = poison.receive(visibility_timeout=30)
    assert (message.id, message.body) == (sent, "failed too often")
    assert backend.receive(visibility_timeout=30) == []  # the source queue is apart
    assert poison.delete([message.handle])[0].kind == "ok"
    QueueClient.from_connection_string(azurite, poison.queue_name).delete_queue()


def test_an_overridden_max_lease_age_caps_a_lease_before_the_expiry(
    queue_client: QueueClient,
) -> None:
    backend = AzureQueueBackend(queue_client, max_lease_age=100)
    queue_client.send_message("job", time_to_live=3600)
    [message] = backend.receive(visibility_timeout=30)
    assert message.hard_deadline == message.received_at + 100 - 2  # min(60 s, 2 %)
    with pytest.raises(ValueError, match="attributes"):
        backend.send("x", {"a": "b"})  # Azure messages carry none
