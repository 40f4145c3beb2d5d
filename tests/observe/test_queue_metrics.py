"""A multi-queue worker's figures carry each queue's name: Prometheus and OpenTelemetry."""

from __future__ import annotations

import threading

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry

from leasekeeper import Message, Worker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.otel import instrument
from leasekeeper.prometheus import LeaseCollector
from tests.observe.test_otel import collect, total


def two_queues() -> tuple[MemoryQueue, MemoryQueue]:
    urgent, bulk = MemoryQueue(30.0, name="urgent"), MemoryQueue(30.0, name="bulk")
    for n in range(3):
        urgent.send(f"u{n}")
    bulk.send("b0")
    return urgent, bulk


def test_prometheus_counts_each_queue_s_messages_and_leases() -> None:
    urgent, bulk = two_queues()
    holding = threading.Event()
    go = threading.Event()
    held = 0
    lock = threading.Lock()

    def handler(message: Message) -> None:
        nonlocal held
        with lock:
            held += 1
            if held == 4:
                holding.set()
        go.wait(30)
        if message.body == "u2":
            raise ValueError("fails")

    worker = Worker([urgent, bulk], handler, concurrency=4, wait_seconds=0.1, renewer="thread")
    registry = CollectorRegistry()
    registry.register(LeaseCollector(worker))
    worker.start()
    sample = registry.get_sample_value
    try:
        assert holding.wait(30)
        assert sample("leasekeeper_queue_leases_in_flight", {"queue": "urgent"}) == 3
        assert sample("leasekeeper_queue_leases_in_flight", {"queue": "bulk"}) == 1
        assert sample("leasekeeper_leases_in_flight") == 4
    finally:
        go.set()
        worker.stop(30)
    messages = "leasekeeper_worker_messages_total"
    assert sample(messages, {"queue": "urgent", "outcome": "received"}) == 3
    assert sample(messages, {"queue": "urgent", "outcome": "completed"}) == 2
    assert sample(messages, {"queue": "urgent", "outcome": "failed"}) == 1
    assert sample(messages, {"queue": "bulk", "outcome": "completed"}) == 1
    assert worker.stats.completed == 3 and worker.stats.failed == 1


def test_opentelemetry_figures_name_the_queue_of_each_call_and_lease() -> None:
    urgent, bulk = two_queues()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    holding = threading.Event()
    go = threading.Event()

    def handler(message: Message) -> None:
        if message.body == "b0":
            holding.set()
            go.wait(30)

    worker = Worker([urgent, bulk], handler, concurrency=4, wait_seconds=0.1, renewer="thread")
    instrument(worker, meter_provider=provider)
    worker.start()
    try:
        assert holding.wait(30)
        in_flight = collect(reader)["leasekeeper.leases.in_flight"]
        assert total(in_flight, **{"messaging.destination.name": "bulk"}) == 1
    finally:
        go.set()
        worker.stop(30)
    points = collect(reader)
    calls = points["messaging.client.operation.duration"]
    deletes = [a for a, _ in calls if a.get("messaging.operation.name") == "delete"]
    assert {a["messaging.destination.name"] for a in deletes} == {"urgent", "bulk"}
    processed = points["messaging.process.duration"]
    assert total(processed, **{"messaging.destination.name": "urgent"}) == 3
    assert total(processed, **{"messaging.destination.name": "bulk"}) == 1
    provider.shutdown()
