"""leasekeeper.prometheus: what a Prometheus scrape of a manager shows."""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from leasekeeper import LeaseManager
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.prometheus import LeaseCollector, serve_metrics
from leasekeeper.testing import ManualClock


@pytest.fixture
def manager(clock: ManualClock, queue: MemoryQueue) -> LeaseManager:
    return LeaseManager(queue, clock=clock, visibility_timeout=30)


def test_the_in_flight_gauge_reads_the_leases_held(
    clock: ManualClock, queue: MemoryQueue, manager: LeaseManager
) -> None:
    registry = CollectorRegistry()
    registry.register(LeaseCollector(manager))
    assert registry.get_sample_value("leasekeeper_leases_in_flight") == 0
    for i in range(3):
        queue.send(f"job {i}")
    first, second, _ = (manager.register(m) for m in queue.receive(max_messages=3))
    assert registry.get_sample_value("leasekeeper_leases_in_flight") == 3
    clock.advance(45)  # two renewals each
    first.complete()
    second.release()
    sample = registry.get_sample_value
    assert sample("leasekeeper_leases_in_flight") == 1
    assert sample("leasekeeper_leases_registered_total") == 3
    assert sample("leasekeeper_extensions_total") == 6 == manager.stats().extended
    assert sample("leasekeeper_extend_calls_total") == 2
    assert sample("leasekeeper_leases_ended_total", {"state": "completed"}) == 1
    assert sample("leasekeeper_leases_ended_total", {"state": "released"}) == 1
    assert sample("leasekeeper_leases_ended_total", {"state": "lost"}) == 0
    assert sample("leasekeeper_scheduler_lag_seconds", {"quantile": "0.99"}) is not None
    assert sample("leasekeeper_scheduler_running") == 1
    assert sample("leasekeeper_extend_threshold_seconds") == manager.stats().extend_threshold == 10
    manager.close()
    assert sample("leasekeeper_scheduler_running") == 0
    assert sample("leasekeeper_leases_ended_total", {"state": "released"}) == 2


def test_every_metric_has_help_and_counters_end_in_total(manager: LeaseManager) -> None:
    families = list(LeaseCollector(manager, namespace="jobs").collect())
    assert families and all(f.name.startswith("jobs_") for f in families)
    assert all(len(f.documentation) > 20 for f in families)
    names = {s.name for f in families for s in f.samples}
    counters = [f for f in families if f.type == "counter"]
    assert counters and all(s.name.endswith("_total") for f in counters for s in f.samples)
    assert {"jobs_leases_in_flight", "jobs_lapses_total", "jobs_send_lag_seconds"} <= names


def test_nothing_registers_at_import(manager: LeaseManager) -> None:
    assert not [m.name for m in REGISTRY.collect() if m.name.startswith("leasekeeper")]
    with pytest.raises(TypeError):
        LeaseCollector(object())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="namespace"):
        LeaseCollector(manager, namespace="not-a-name")


def test_serve_metrics_answers_a_scrape_on_loopback(
    queue: MemoryQueue, manager: LeaseManager
) -> None:
    queue.send("job")
    manager.register(queue.receive()[0])
    server = serve_metrics(manager, 0)
    try:
        assert server.addr == "127.0.0.1" and server.port > 0
        with urllib.request.urlopen(server.url, timeout=10) as response:
            text = response.read().decode()
    finally:
        server.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (in_flight,) = families["leasekeeper_leases_in_flight"].samples
    assert in_flight.value == 1
    assert families["leasekeeper_leases_registered"].type == "counter"
    # Only the manager's metrics: a registry of its own, not the process's default one.
    assert all(name.startswith("leasekeeper_") for name in families)


def test_lost_leases_are_counted_by_their_lost_reason(
    clock: ManualClock, queue: MemoryQueue, manager: LeaseManager
) -> None:
    registry = CollectorRegistry()
    registry.register(LeaseCollector(manager))
    queue.send("deleted elsewhere")
    (message,) = queue.receive()
    manager.register(message)
    queue.delete([message.handle])  # out of band: the next extend is refused
    clock.advance(25)
    sample = registry.get_sample_value
    assert sample("leasekeeper_leases_lost_total", {"reason": "rejected"}) == 1
    assert sample("leasekeeper_leases_lost_total", {"reason": "lapsed"}) == 0
    assert manager.stats().lost_reasons == {"rejected": 1}
