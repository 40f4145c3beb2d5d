"""Traces that cross the queue: a message sent inside a producer's span is processed
in a span of that trace, on every service that carries message attributes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import baggage, context, propagate, trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from leasekeeper import Message, Worker
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.otel import inject, instrument, send
from tests.contract.conftest import made_subject


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer_provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


def process_spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.kind is trace.SpanKind.CONSUMER]


@pytest.mark.realtime
@pytest.mark.parametrize("service", ["sqs-moto", "mns-local", "redis"])
def test_three_messages_sent_in_a_producer_span_are_processed_in_its_trace(
    service: str,
    request: pytest.FixtureRequest,
    exporter: InMemorySpanExporter,
    tracer_provider: TracerProvider,
) -> None:
    tracer = tracer_provider.get_tracer("producer")
    with made_subject(service, request) as subject:
        backend: Any = subject.backend
        with tracer.start_as_current_span("send orders", kind=trace.SpanKind.PRODUCER) as span:
            producer = span.get_span_context()
            for n in range(3):
                attributes: dict[str, str] = {"order": str(n)}
                propagate.inject(attributes)  # OpenTelemetry's own, as a producer writes it
                backend.send(f"order {n}", attributes)
        worker = Worker(backend, lambda m: None, wait_seconds=1, renewer="thread")
        instrument(worker, tracer_provider=tracer_provider)
        stats = worker.run(until_idle=2)
    assert stats.completed == 3
    spans = process_spans(exporter)
    assert len(spans) == 3
    for processed in spans:
        assert processed.context.trace_id == producer.trace_id
        assert processed.parent is not None and processed.parent.span_id == producer.span_id


def test_inject_carries_the_trace_and_baggage_to_the_handler(
    exporter: InMemorySpanExporter, tracer_provider: TracerProvider
) -> None:
    queue = MemoryQueue(30.0, name="orders")
    tracer = tracer_provider.get_tracer("producer")
    token = context.attach(baggage.set_baggage("tenant", "acme"))
    try:
        with tracer.start_as_current_span("send") as span:
            producer = span.get_span_context()
            queue.send("with context", inject({"kind": "order"}))
    finally:
        context.detach(token)
    queue.send("without")
    seen: dict[str, tuple[object, int]] = {}

    def handler(message: Message) -> None:
        current = trace.get_current_span().get_span_context()
        seen[str(message.body)] = (baggage.get_baggage("tenant"), current.trace_id)

    worker = Worker(queue, handler, wait_seconds=0.1)
    instrument(worker, tracer_provider=tracer_provider)
    worker.run(until_idle=0.5)
    assert seen["with context"] == ("acme", producer.trace_id)
    # A message that carries no context starts a trace of its own.
    assert seen["without"][0] is None and seen["without"][1] != producer.trace_id
    (fresh,) = [s for s in process_spans(exporter) if s.context.trace_id != producer.trace_id]
    assert fresh.parent is None
    assert inject() == {}  # no current span, no baggage: nothing to add


def test_an_async_worker_continues_the_trace_too(
    exporter: InMemorySpanExporter, tracer_provider: TracerProvider
) -> None:
    queue = MemoryQueue(30.0, name="orders")
    tracer = tracer_provider.get_tracer("producer")
    with tracer.start_as_current_span("send") as span:
        producer = span.get_span_context()
        for n in range(3):
            queue.send(f"order {n}", inject())

    async def handler(message: Message) -> None:
        await asyncio.sleep(0)

    worker = AsyncWorker(queue, handler, wait_seconds=0.1)
    instrument(worker, tracer_provider=tracer_provider)
    out: list[Any] = []
    thread = threading.Thread(
        target=lambda: out.append(asyncio.run(worker.run(until_idle=0.5))), daemon=True
    )
    thread.start()
    thread.join(30)
    spans = process_spans(exporter)
    assert len(spans) == 3
    assert {s.context.trace_id for s in spans} == {producer.trace_id}


def test_a_multi_queue_worker_names_each_message_s_queue_in_its_span(
    exporter: InMemorySpanExporter, tracer_provider: TracerProvider
) -> None:
    urgent, bulk = MemoryQueue(30.0, name="urgent"), MemoryQueue(30.0, name="bulk")
    urgent.send("u")
    bulk.send("b")
    worker = Worker([urgent, bulk], lambda m: None, weights=[3, 1], wait_seconds=0.1)
    instrument(worker, tracer_provider=tracer_provider)
    worker.run(until_idle=0.5)
    names = sorted(s.name for s in process_spans(exporter))
    assert names == ["process bulk", "process urgent"]


@pytest.mark.realtime
@pytest.mark.parametrize("service", ["azure-azurite", "sqs-moto"])
def test_otel_send_carries_the_context_where_a_service_has_no_attributes(
    service: str,
    request: pytest.FixtureRequest,
    exporter: InMemorySpanExporter,
    tracer_provider: TracerProvider,
) -> None:
    tracer = tracer_provider.get_tracer("producer")
    seen: list[tuple[object, dict[str, str]]] = []
    with made_subject(service, request) as subject:
        backend: Any = subject.backend
        with tracer.start_as_current_span("send") as span:
            producer = span.get_span_context()
            for n in range(3):
                send(backend, f"order {n}", {"kind": "order"})

        def handler(message: Message) -> None:
            seen.append((message.body, dict(message.attributes)))

        worker = Worker(backend, handler, wait_seconds=1, renewer="thread")
        instrument(worker, tracer_provider=tracer_provider)
        worker.run(until_idle=2)
    # The handler sees the body as sent (an envelope, on Azure, taken off) and the
    # attributes with the context beside its own.
    assert sorted(body for body, _ in seen) == ["order 0", "order 1", "order 2"]
    assert all(a["kind"] == "order" and "traceparent" in a for _, a in seen)
    spans = process_spans(exporter)
    assert len(spans) == 3
    assert {s.context.trace_id for s in spans} == {producer.trace_id}
