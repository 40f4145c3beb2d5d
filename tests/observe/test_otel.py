"""leasekeeper.otel: what an operator sees through an OpenTelemetry SDK."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from leasekeeper import LeaseManager, LostReason, Message, Outcome, Worker
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.azure import AzureQueueBackend
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.backends.mns import MNSBackend
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.otel import (
    destination_name,
    instrument,
    messaging_system,
)
from leasekeeper.prometheus import LeaseCollector
from leasekeeper.testing import FaultyBackend, ManualClock
from tests.helpers import ScriptedBackend

ROOT = Path(__file__).resolve().parents[2]

Point = tuple[dict[str, Any], Any]  # (attributes, value: a number, or a histogram's count)


@pytest.fixture
def reader() -> InMemoryMetricReader:
    return InMemoryMetricReader()


@pytest.fixture
def provider(reader: InMemoryMetricReader) -> Iterator[MeterProvider]:
    provider = MeterProvider(metric_readers=[reader])
    yield provider
    provider.shutdown()


def collect(reader: InMemoryMetricReader) -> dict[str, list[Point]]:
    """Every data point by metric name: (attributes, value or histogram count)."""
    found: dict[str, list[Point]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            assert scope.scope.name == "leasekeeper"
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = point.count  # type: ignore[union-attr]
                    found.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return found


def total(points: list[Point], **match: Any) -> Any:
    return sum(v for attrs, v in points if all(attrs.get(k) == w for k, w in match.items()))


def test_issue_16_checked_by(clock: ManualClock, reader: InMemoryMetricReader) -> None:
    """The issue's own check: a manager on MemoryQueue instrumented with an SDK
    MeterProvider and an in-memory reader, and a LeaseCollector on a fresh registry."""
    queue = MemoryQueue(30, clock=clock, name="jobs")
    manager = LeaseManager(queue, clock=clock, visibility_timeout=30)
    instrument(manager, meter_provider=MeterProvider(metric_readers=[reader]))
    registry = CollectorRegistry()
    registry.register(LeaseCollector(manager))
    for i in range(4):
        queue.send(f"job {i}")
    leases = [manager.register(m) for m in queue.receive(max_messages=4)]
    clock.advance(100)  # every lease renewed when 10 s remain: at 20, 40, 60, 80, 100
    leases[0].complete()

    metrics = collect(reader)
    extended = manager.stats().extended
    assert extended == 4 * 5
    assert total(metrics["leasekeeper.extensions"], **{"leasekeeper.extend.outcome": "ok"}) == (
        extended
    )
    assert total(metrics["leasekeeper.renewal.headroom"]) == extended
    durations = metrics["messaging.client.operation.duration"]
    assert total(durations, **{"messaging.operation.name": "extend"}) == 5  # batches of 4
    assert total(durations, **{"messaging.operation.name": "delete"}) == 1
    for attributes, _ in durations:
        assert attributes["messaging.system"] == "leasekeeper.memory"
        assert attributes["messaging.destination.name"] == "jobs"
        assert attributes["messaging.operation.type"] == "settle"
        assert "error.type" not in attributes
    assert total(metrics["leasekeeper.leases.in_flight"]) == 3
    assert total(metrics["leasekeeper.extend.threshold"]) == 10  # renewed when 10 s remain
    assert registry.get_sample_value("leasekeeper_leases_in_flight") == 3
    assert registry.get_sample_value("leasekeeper_extensions_total") == extended


def test_failed_calls_carry_error_type_and_lost_leases_a_reason_class(
    clock: ManualClock,
    scripted: ScriptedBackend,
    make_manager: Any,
    provider: MeterProvider,
    reader: InMemoryMetricReader,
) -> None:
    for i in range(2):
        scripted.inner.send(f"job {i}")
    manager = make_manager(scripted)
    instrument(manager, meter_provider=provider)
    a, b = (manager.register(m) for m in scripted.receive(max_messages=2))
    scripted.script("extend", ConnectionResetError("reset"), Outcome("lost", detail="gone"))
    clock.advance(21)  # extend raises, is retried: the whole batch answers "lost"
    metrics = collect(reader)
    errors = sorted(
        attrs["error.type"]
        for attrs, _ in metrics["messaging.client.operation.duration"]
        if "error.type" in attrs
    )
    assert errors == ["ConnectionResetError", "lost"]
    outcomes = metrics["leasekeeper.extensions"]
    assert total(outcomes, **{"leasekeeper.extend.outcome": "retry"}) == 2
    assert total(outcomes, **{"leasekeeper.extend.outcome": "lost"}) == 2
    assert total(outcomes, **{"leasekeeper.extend.outcome": "ok"}) == 0
    lost = metrics["leasekeeper.leases.lost"]
    assert lost == [
        (
            {
                "messaging.system": "leasekeeper.memory",
                "messaging.destination.name": "memory",
                "leasekeeper.lease.state": "lost",
                "leasekeeper.lease.reason": "rejected",
            },
            2,
        )
    ]
    assert a.lost.is_set() and b.lost.is_set()


def test_lapses_and_abandoned_leases_are_counted(
    clock: ManualClock, provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    queue = MemoryQueue(30, clock=clock, visibility_cap=50)
    manager = LeaseManager(queue, clock=clock, visibility_timeout=30)
    instrument(manager, meter_provider=provider)
    queue.send("capped")
    manager.register(queue.receive()[0])
    clock.advance(60)  # renewed once to 50 s, then the cap is reached
    stuck = LeaseManager(queue, clock=clock, visibility_timeout=30)
    instrument(stuck, meter_provider=provider)
    queue.send("lapses")
    lease = stuck.register(queue.receive()[0])
    stuck.close(release=False)
    clock.advance(35)
    with pytest.raises(Exception, match="lapsed"):
        lease.complete()
    metrics = collect(reader)
    reasons = {
        (a["leasekeeper.lease.state"], a["leasekeeper.lease.reason"]): v
        for a, v in metrics["leasekeeper.leases.lost"]
    }
    assert reasons == {("abandoned", "capped"): 1, ("lost", "lapsed"): 1}
    assert total(metrics["leasekeeper.lapses"]) == 1


def test_every_lost_reason_is_documented() -> None:
    table = (ROOT / "docs" / "observability.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", table, re.MULTILINE))
    assert {reason.value for reason in LostReason} <= documented


def test_each_backend_has_its_messaging_system_and_destination(clock: ManualClock) -> None:
    sqs = SQSBackend.__new__(SQSBackend)
    sqs.queue_url = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"
    mns = MNSBackend.__new__(MNSBackend)
    mns.queue_name = "orders-mns"
    azure = AzureQueueBackend.__new__(AzureQueueBackend)
    azure.queue_name = "orders-azure"
    memory = MemoryQueue(30, clock=clock, name="local")
    wrapped = FaultyBackend(memory, seed=1, clock=clock)

    class Own:
        messaging_system = "redis"

    found = {
        name: (messaging_system(b), destination_name(b))
        for name, b in [
            ("sqs", sqs),
            ("mns", mns),
            ("azure", azure),
            ("memory", memory),
            ("wrapped", wrapped),
            ("own", Own()),
        ]
    }
    assert found == {
        "sqs": ("aws_sqs", "orders"),
        "mns": ("alibaba_cloud.mns", "orders-mns"),
        "azure": ("azure.storage_queue", "orders-azure"),
        "memory": ("leasekeeper.memory", "local"),
        "wrapped": ("leasekeeper.memory", "local"),
        "own": ("redis", None),
    }


def test_no_receipt_reaches_a_metric_attribute(
    clock: ManualClock, provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    queue = MemoryQueue(30, clock=clock, rotate_receipts=True)
    manager = LeaseManager(queue, clock=clock, visibility_timeout=30)
    instrument(manager, meter_provider=provider)
    for i in range(3):
        queue.send(f"job {i}")
    leases = [manager.register(m) for m in queue.receive(max_messages=3)]
    receipts = {lease.receipt for lease in leases}
    for _ in range(4):
        clock.advance(20)
        receipts.update(lease.receipt for lease in leases)
    leases[0].complete()
    leases[1].release()
    values = [
        str(v) for points in collect(reader).values() for attrs, _ in points for v in attrs.values()
    ]
    assert len(receipts) == 3 * 5
    assert not [v for v in values if any(r in v for r in receipts)]


def test_managers_of_one_queue_add_up_and_uninstrument_stops_recording(
    clock: ManualClock, provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    queue = MemoryQueue(30, clock=clock, name="shared")
    other = MemoryQueue(30, clock=clock, name="other")
    managers = [LeaseManager(q, clock=clock, visibility_timeout=30) for q in (queue, queue, other)]
    handles = [instrument(m, meter_provider=provider) for m in managers]
    for q, m in zip((queue, queue, other), managers, strict=True):
        q.send("job")
        m.register(q.receive()[0])
    gauge = collect(reader)["leasekeeper.leases.in_flight"]
    by_queue = {a["messaging.destination.name"]: v for a, v in gauge}
    assert by_queue == {"shared": 2, "other": 1}

    handles[0].uninstrument()
    handles[0].uninstrument()  # twice: nothing more happens
    clock.advance(21)  # every lease renewed once; the first manager's unrecorded
    metrics = collect(reader)
    assert {
        a["messaging.destination.name"]: v for a, v in metrics["leasekeeper.leases.in_flight"]
    } == {
        "shared": 1,
        "other": 1,
    }
    assert total(metrics["leasekeeper.extensions"]) == 2
    assert not handles[0].active and handles[1].active
    with handles[1], handles[2]:
        pass  # leaving the with uninstruments
    assert collect(reader).get("leasekeeper.leases.in_flight", []) == []
    assert all(m.stats().callback_errors == 0 for m in managers)


def test_without_an_sdk_instrumenting_records_nothing_and_harms_nothing(
    clock: ManualClock,
) -> None:
    queue = MemoryQueue(30, clock=clock)
    manager = LeaseManager(queue, clock=clock, visibility_timeout=30)
    handle = instrument(manager)  # the global providers: the API's no-op ones here
    queue.send("job")
    lease = manager.register(queue.receive()[0])
    clock.advance(45)
    lease.complete()
    assert lease.extensions == 2
    assert manager.stats().callback_errors == 0
    handle.uninstrument()
    with pytest.raises(TypeError):
        instrument(queue)  # type: ignore[arg-type]


@pytest.mark.realtime
def test_a_worker_gets_a_span_per_handler_run(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = MemoryQueue(1.0, name="work")
    for body in ("fine", "boom", "taken away"):
        queue.send(body)
    workers: list[Worker] = []

    def handler(message: Message) -> None:
        if message.body == "boom":
            raise ValueError("handler failed")
        if message.body == "taken away":  # its lease is lost while it is handled
            manager = workers[0].manager
            lease = manager.get(message)
            assert lease is not None
            manager.revoke(lease, delay=60)

    worker = Worker(
        queue,
        handler,
        concurrency=3,
        wait_seconds=0.05,
        visibility_timeout=1.0,
        timer_interval=0.1,
        minimal_life=0.3,
        release_delay=60,  # the failed message stays away: one run each
    )
    workers.append(worker)
    handle = instrument(worker, meter_provider=provider, tracer_provider=tracer_provider)
    stats = worker.run(until_idle=0.3)
    assert (stats.completed, stats.failed, stats.lost) == (1, 1, 1)
    spans = exporter.get_finished_spans()
    assert [(s.name, s.kind) for s in spans] == [("process work", SpanKind.CONSUMER)] * 3
    by_id = {s.attributes["messaging.message.id"]: s for s in spans if s.attributes}
    assert set(by_id) == set(queue.receive_counts)
    statuses = sorted(
        (s.status.status_code.name, str((s.attributes or {}).get("error.type"))) for s in spans
    )
    assert statuses == [("ERROR", "LeaseLost"), ("ERROR", "ValueError"), ("UNSET", "None")]
    ok = next(s for s in spans if s.status.status_code is StatusCode.UNSET)
    assert ok.attributes is not None and ok.attributes["messaging.operation.type"] == "process"
    process = collect(reader)["messaging.process.duration"]
    assert sorted(str(a.get("error.type")) for a, _ in process) == [
        "LeaseLost",
        "None",
        "ValueError",
    ]
    handle.uninstrument()
    assert worker.around_handler is None


@pytest.mark.realtime
def test_an_async_worker_gets_a_span_per_handler_run(
    provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    queue = MemoryQueue(1.0, name="work")
    for body in ("fine", "boom"):
        queue.send(body)
    seen_span: list[bool] = []

    async def handler(message: Message) -> None:
        # The span is current in the handler's own task.
        seen_span.append(trace.get_current_span().is_recording())
        await asyncio.sleep(0)
        if message.body == "boom":
            raise ValueError("handler failed")

    worker = AsyncWorker(
        queue,
        handler,
        concurrency=2,
        wait_seconds=0.05,
        visibility_timeout=1.0,
        timer_interval=0.1,
        minimal_life=0.3,
        release_delay=60,
    )
    handle = instrument(worker, meter_provider=provider, tracer_provider=tracer_provider)
    stats = asyncio.run(worker.run(until_idle=0.3))
    assert (stats.completed, stats.failed) == (1, 1)
    assert seen_span == [True, True]
    spans = exporter.get_finished_spans()
    assert [(s.name, s.kind) for s in spans] == [("process work", SpanKind.CONSUMER)] * 2
    statuses = sorted(
        (s.status.status_code.name, str((s.attributes or {}).get("error.type"))) for s in spans
    )
    assert statuses == [("ERROR", "ValueError"), ("UNSET", "None")]
    assert len(collect(reader)["messaging.process.duration"]) == 2
    handle.uninstrument()
    assert worker.around_handler is None


@pytest.mark.parametrize(
    ("module", "dependency", "extra"),
    [
        ("leasekeeper.otel", "opentelemetry", "pip install 'opentelemetry-api>=1.27'"),
        ("leasekeeper.prometheus", "prometheus_client", "pip install 'prometheus-client>=0.20'"),
    ],
)
def test_a_missing_extra_is_named(module: str, dependency: str, extra: str) -> None:
    code = textwrap.dedent(
        f"""
        import sys
        sys.modules[{dependency!r}] = None
        try:
            import {module}
        except ImportError as exc:
            print(exc)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert extra in result.stdout


def test_leasekeeper_imports_with_no_extra_installed() -> None:
    blocked = [
        "boto3",
        "botocore",
        "mns",
        "azure",
        "azure.storage",
        "azure.storage.queue",
        "pyspark",
        "pyarrow",
        "opentelemetry",
        "prometheus_client",
    ]
    code = textwrap.dedent(
        f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None
        import leasekeeper, leasekeeper.observers, leasekeeper.backends.memory
        import leasekeeper.testing
        import leasekeeper.command.demo
        import leasekeeper.command.cli
        import leasekeeper.timeline
        print("ok", leasekeeper.__version__)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("ok")
