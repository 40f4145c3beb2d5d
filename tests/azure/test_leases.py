"""LeaseManager on Azurite: long jobs, the receipt-rotation race, TTL caps, parallel extends."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from leasekeeper import ConfigError, Lease, LeaseManager, LeaseState, LostReason
from leasekeeper.backends.azure import AzureQueueBackend
from tests.helpers import renewed_twice_then_completed

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

# The timings: 2 s visibility, renewed by a scheduler that wakes every 0.2 s.
TIMING = {"visibility_timeout": 2, "timer_interval": 0.2, "minimal_life": 0.5}


def _gone(client: QueueClient) -> bool:
    return client.get_queue_properties().approximate_message_count == 0


def test_long_jobs_are_never_redelivered_while_leased(
    backend: AzureQueueBackend, other_consumer: AzureQueueBackend, queue_client: QueueClient
) -> None:
    for i in range(5):
        queue_client.send_message(f"job-{i}")
    # The manager first (its renewer process may take seconds to start on a loaded
    # machine), then the receive: leased at receipt, as manager.receive() does.
    with LeaseManager(backend, **TIMING) as manager:  # type: ignore[arg-type]
        messages = backend.receive(max_messages=5, visibility_timeout=2)
        assert len(messages) == 5
        leases = [manager.register(m) for m in messages]
        # The "jobs" run 3x the visibility timeout; a second consumer polls all along.
        stolen = []
        end = time.monotonic() + 6.0
        while time.monotonic() < end:
            stolen += other_consumer.receive(max_messages=32, visibility_timeout=30)
            time.sleep(0.05)
        assert stolen == [], [m.id for m in stolen]
        assert all(lease.extensions >= 3 for lease in leases), [x.extensions for x in leases]
        for lease in leases:
            lease.complete()
        stats = manager.stats()
    assert all(lease.state is LeaseState.COMPLETED for lease in leases)
    assert stats.lost == 0 and stats.extend_errors == 0 and stats.lapses == 0
    assert _gone(queue_client)


class _SlowUpdates:
    """raw_response_hook: hold Update Message answers (the service has already rotated
    the receipt) while ``armed`` is set, and say so through ``entered``."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.armed = threading.Event()
        self.entered = threading.Event()
        self.slowed = 0

    def __call__(self, response: Any) -> None:
        if response.http_request.method == "PUT" and self.armed.is_set():
            self.slowed += 1
            self.entered.set()
            time.sleep(self.delay)


def test_delete_during_an_in_flight_update_uses_the_new_receipt(
    azurite: str, queue_name: str, queue_client: QueueClient, caplog: pytest.LogCaptureFixture
) -> None:
    # The answer is held back 0.8 s; the extend goes out with 1.6 s left, so it still
    # returns before the lease's deadline (past it, the lease is lost: rule 5).
    slow = _SlowUpdates(delay=0.8)

    def slow_client() -> QueueClient:
        return QueueClient.from_connection_string(
            azurite, queue_name, retry_total=0, raw_response_hook=slow
        )

    backend = AzureQueueBackend(queue_client, client_factory=slow_client)
    queue_client.send_message("x")
    [message] = backend.receive(visibility_timeout=2)
    slow.armed.set()
    timing = {**TIMING, "extend_threshold": 1.6}
    # The thread renewer: the extends go through this process's client_factory.
    with LeaseManager(backend, renewer="thread", **timing) as manager:  # type: ignore[arg-type]
        lease = manager.register(message)
        assert slow.entered.wait(5), "no extend was sent"
        # The update is applied server-side: the receipt the lease holds is dead now.
        started = time.monotonic()
        lease.complete()  # must wait for the extend and use the receipt it returns
        waited = time.monotonic() - started
    assert lease.state is LeaseState.COMPLETED
    assert lease.extensions >= 1
    assert waited > 0.3  # it really did wait for the in-flight update
    assert "PopReceiptMismatch" not in caplog.text and "MessageNotFound" not in caplog.text
    assert _gone(queue_client)
    backend.close()


def test_message_whose_ttl_ends_during_processing_is_capped(
    backend: AzureQueueBackend, queue_client: QueueClient
) -> None:
    reasons: list[tuple[Lease, LostReason]] = []
    called = threading.Event()

    def on_lost(lease: Lease, reason: LostReason) -> None:
        reasons.append((lease, reason))
        called.set()

    with LeaseManager(backend, on_lost=on_lost, **TIMING) as manager:  # type: ignore[arg-type]
        # Its renewer started before the receive: a renewer process's start (seconds on
        # a loaded machine) would eat the 2 s the message is hidden for.
        manager.start()
        queue_client.send_message("short-lived", time_to_live=6)
        [message] = backend.receive(visibility_timeout=2)
        assert message.hard_deadline is not None
        lease = manager.register(message)
        assert lease.lost.wait(8), "the lease was never capped"
        assert called.wait(2), "on_lost was not called"  # it runs just after lost is set
        assert lease.state is LeaseState.ABANDONED
        assert lease.reason is not None and lease.reason.startswith("capped")
        # capped by the manager's own hard_deadline (from expires_on), before any call
        # the service would have accepted anyway: Azurite lets visibility pass the expiry
        assert "expires_on" not in lease.reason and "expired" not in lease.reason
        assert reasons == [(lease, LostReason.CAPPED)]  # on_lost hears the reason's name
        assert manager.stats().capped == 1
        assert manager.stats().extend_errors == 0
        # the manager stopped before the expiry: the last extend never passed it
        assert time.monotonic() <= message.hard_deadline + backend.expiry_margin


def test_fifty_parallel_extends_all_succeed(
    azurite: str, queue_name: str, queue_client: QueueClient
) -> None:
    owners: dict[int, int] = {}  # id(client) -> thread that made it
    shared: list[str] = []
    lock = threading.Lock()

    def make_client() -> QueueClient:
        me = threading.get_ident()

        def hook(request: Any) -> None:
            if threading.get_ident() != me:
                with lock:
                    shared.append(request.http_request.method)

        client = QueueClient.from_connection_string(
            azurite, queue_name, retry_total=0, raw_request_hook=hook
        )
        with lock:
            owners[id(client)] = me
        return client

    backend = AzureQueueBackend(queue_client, client_factory=make_client)
    for i in range(50):
        queue_client.send_message(f"m{i}")
    messages = backend.receive(max_messages=32, visibility_timeout=6)
    messages += backend.receive(max_messages=32, visibility_timeout=6)
    assert len(messages) == 50
    # Each extend has 3 s to come back: 50 at once from a loaded machine's Azurite
    # took over a second (a 1 s threshold lapsed them, as it should, with a warning).
    with LeaseManager(
        backend,
        renewer="thread",  # its extends go through this process's client_factory
        visibility_timeout=6,
        extend_threshold=3.0,
        timer_interval=0.2,
        minimal_life=0.5,
    ) as m:
        leases = [m.register(msg) for msg in messages]
        deadline = time.monotonic() + 30
        while min(x.extensions for x in leases) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert min(x.extensions for x in leases) >= 2
        stats = m.stats()
        assert stats.extend_errors == 0 and stats.lost == 0 and stats.retries == 0
        done = threading.Barrier(10)

        def complete(chunk: list[Lease]) -> None:
            done.wait()
            for lease in chunk:
                lease.complete()

        threads = [threading.Thread(target=complete, args=(leases[i::10],)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert all(x.state is LeaseState.COMPLETED for x in leases)
    assert shared == [], "a client was used from a thread other than its own"
    assert len(owners) > 1  # extends really ran on several threads, each with its own client
    assert _gone(queue_client)
    backend.close()


def test_dead_letter_poison_is_azures_queue_name_poison(
    backend: AzureQueueBackend, queue_client: QueueClient, queue_name: str, azurite: str
) -> None:
    """Azure's convention (Azure Functions'): failed messages go to <queue>-poison,
    created if missing."""
    queue_client.send_message("poison")
    with LeaseManager(
        backend,
        dead_letter="poison",
        max_receives=2,
        release_delay=0,
        **TIMING,  # type: ignore[arg-type]
    ) as manager:
        for _ in range(2):
            held: list[Lease] = []
            for _ in range(20):
                held = held or manager.receive(wait_seconds=0.5)
            with pytest.raises(RuntimeError), held[0]:
                raise RuntimeError("fails")
        assert manager.stats().dead_lettered == 1
    poison = QueueClient.from_connection_string(azurite, f"{queue_name}-poison")
    try:
        (copy,) = list(poison.receive_messages())
        assert copy.content == "poison"
    finally:
        poison.delete_queue()
        poison.close()
    assert list(queue_client.peek_messages()) == []  # deleted from its own queue


def test_a_client_factory_of_your_own_keeps_the_renewals_in_this_process(
    azurite: str,
    queue_name: str,
    queue_client: QueueClient,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A renewer process builds its clients from the backend's spec: it cannot call
    the factory that carries a transport or settings of the user's own. So such a
    backend renews in this process, through the factory's clients: the default says
    why in one WARNING, and ``renewer="process"`` refuses before anything is leased.
    (The environment has the account's key: that is not why.)"""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite)
    made: list[QueueClient] = []

    def factory() -> QueueClient:
        made.append(QueueClient.from_connection_string(azurite, queue_name, retry_total=0))
        return made[-1]

    backend = AzureQueueBackend(queue_client, client_factory=factory)
    with pytest.raises(ConfigError, match="client_factory"):
        LeaseManager(backend, renewer="process", **TIMING)  # type: ignore[arg-type]
    queue_client.send_message("job")
    [message] = backend.receive(visibility_timeout=2)
    with caplog.at_level(logging.WARNING, logger="leasekeeper"):
        manager = LeaseManager(backend, **TIMING)  # type: ignore[arg-type]
    try:
        assert manager.renewer.name == "thread"
        renewed_twice_then_completed(manager, message)
    finally:
        manager.close()
    assert made, "the renewals did not go through the factory's clients"
    assert _gone(queue_client)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "client_factory" in warning
