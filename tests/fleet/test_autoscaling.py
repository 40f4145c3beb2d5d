"""Autoscaling signals: the backlog counted in the background (on a ManualClock: every
``every`` seconds, never at scrape time), the busy ratio, and both as Prometheus and
OpenTelemetry metrics."""

from __future__ import annotations

import logging
import threading
import urllib.request
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry, generate_latest

from leasekeeper import LeaseManager, Message, ReceiveError, Worker
from leasekeeper.backends.contract import QueueCounts
from leasekeeper.backends.forwarding import ForwardingBackend
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.fleet import BacklogSampler, busy_ratio
from leasekeeper.otel import instrument
from leasekeeper.prometheus import LeaseCollector, serve_metrics
from leasekeeper.testing import ManualClock


class Flaky(ForwardingBackend):
    """A queue whose counts fail while ``failing`` is set, and are counted."""

    def __init__(self, inner: MemoryQueue) -> None:
        super().__init__(inner)
        self.failing = False
        self.counted = 0

    def queue_counts(self) -> QueueCounts:
        self.counted += 1
        if self.failing:
            raise ReceiveError("retry", "ServiceUnavailable: try again", operation="counts")
        return super().queue_counts()


def test_the_backlog_is_counted_every_few_seconds_in_the_background(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="leasekeeper.fleet")
    inner = MemoryQueue(30.0, clock=clock)
    inner.send_many([f"job-{i}" for i in range(20)])
    queue = Flaky(inner)
    sampler = BacklogSampler([("jobs", queue)], every=30.0, clock=clock).start()
    try:
        assert clock.wait_for_sleepers(1)  # counted at once, then waiting 30 s
        assert sampler.backlog() == {"jobs": 20} and queue.counted == 1
        queue.receive(max_messages=5, visibility_timeout=3600)
        for _ in range(100):  # read as often as one likes: no call to the service
            assert sampler.backlog() == {"jobs": 20}
        clock.advance(29.9)
        assert clock.wait_for_sleepers(1) and queue.counted == 1
        clock.advance(0.1)
        assert clock.wait_for_sleepers(1) and queue.counted == 2
        assert sampler.backlog() == {"jobs": 15}
        assert sampler.counts()["jobs"] == QueueCounts(15, 5, 0)
        queue.failing = True  # the last count stands; one warning
        for _ in range(3):
            clock.advance(30.0)
            assert clock.wait_for_sleepers(1)
        assert queue.counted == 5 and sampler.backlog() == {"jobs": 15}
        queue.failing = False
        queue.receive(max_messages=5, visibility_timeout=3600)
        clock.advance(30.0)
        assert clock.wait_for_sleepers(1) and sampler.backlog() == {"jobs": 10}
    finally:
        sampler.close()
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert warnings == [
        "backlog: counting jobs failed (counts failed (retry): ServiceUnavailable: try "
        "again); the last count "
        "stands and it is asked again every 30s"
    ]
    assert any("counting jobs works again" in r.getMessage() for r in caplog.records)


def test_a_queue_that_cannot_count_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    class Counterless:
        pass

    sampler = BacklogSampler([("odd", Counterless())])  # type: ignore[list-item]
    sampler.sample()
    assert sampler.backlog() == {} and sampler.samples == 0
    assert "cannot count its messages" in caplog.text


def test_busy_ratio_counts_running_handlers_not_prefetched_messages() -> None:
    assert busy_ratio(SimpleNamespace(running=0, concurrency=4)) == 0.0
    assert busy_ratio(SimpleNamespace(running=3, concurrency=4)) == 0.75
    assert busy_ratio(SimpleNamespace(running=14, concurrency=4)) == 1.0  # 10 wait


@pytest.fixture
def busy_worker() -> Iterator[tuple[Worker, MemoryQueue, threading.Event]]:
    queue = MemoryQueue(30.0)
    queue.send_many([f"job-{i}" for i in range(12)])
    started, finish = threading.Semaphore(0), threading.Event()

    def handler(message: Message) -> None:
        started.release()
        assert finish.wait(30)

    worker = Worker(queue, handler, concurrency=4, wait_seconds=0.05, renewer="thread")
    thread = threading.Thread(target=worker.run)
    thread.start()
    for _ in range(4):
        assert started.acquire(timeout=30)
    try:
        yield worker, queue, finish
    finally:
        finish.set()
        worker.stop(30)


@pytest.mark.realtime
def test_prometheus_exposes_the_backlog_and_the_busy_ratio(
    busy_worker: tuple[Worker, MemoryQueue, threading.Event],
) -> None:
    worker, _, _ = busy_worker
    sampler = BacklogSampler.of(worker, every=3600.0)
    sampler.sample()
    registry = CollectorRegistry()
    registry.register(LeaseCollector(worker, backlog=sampler))
    text = generate_latest(registry).decode()
    name = worker.intake.sources.all[0].name
    assert f'leasekeeper_queue_backlog_messages{{queue="{name}"}} 8.0' in text
    assert "leasekeeper_worker_busy_ratio 1.0" in text
    assert sampler.samples == 1  # the scrape asked the queue nothing


@pytest.mark.realtime
def test_serve_metrics_counts_a_worker_s_backlog_and_stops_with_it(
    busy_worker: tuple[Worker, MemoryQueue, threading.Event],
) -> None:
    worker, _, _ = busy_worker
    server = serve_metrics(worker, 0, backlog_every=3600.0)
    try:
        assert server.sampler is not None
        with urllib.request.urlopen(server.url, timeout=10) as answer:
            text = answer.read().decode()
        assert "leasekeeper_queue_backlog_messages{" in text
    finally:
        server.close()
    assert all(t.name != "leasekeeper-backlog" for t in threading.enumerate())
    manager = LeaseManager(MemoryQueue(), renewer="thread")
    with pytest.raises(TypeError, match="backlog_every counts a worker's queues"):
        serve_metrics(manager, 0, backlog_every=30.0)
    manager.close()


@pytest.mark.realtime
def test_opentelemetry_records_the_busy_ratio_and_the_backlog(
    busy_worker: tuple[Worker, MemoryQueue, threading.Event],
) -> None:
    worker, _, _ = busy_worker
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    handle = instrument(worker, meter_provider=provider, backlog_every=3600.0)
    try:
        assert handle.sampler is not None
        handle.sampler.sample()
        data = reader.get_metrics_data()
        assert data is not None
        points = {
            metric.name: [(dict(p.attributes or {}), p.value) for p in metric.data.data_points]  # type: ignore[union-attr]
            for resource in data.resource_metrics
            for scope in resource.scope_metrics
            for metric in scope.metrics
        }
        [(attributes, busy)] = points["leasekeeper.worker.busy_ratio"]
        assert busy == 1.0 and attributes["messaging.system"] == "leasekeeper.memory"
        [(attributes, backlog)] = points["leasekeeper.queue.backlog"]
        assert backlog == 8
    finally:
        handle.uninstrument()
        provider.shutdown()
    assert all(t.name != "leasekeeper-backlog" for t in threading.enumerate())
