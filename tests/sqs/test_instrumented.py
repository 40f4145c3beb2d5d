"""Instrumented users see every call: while anything wraps botocore's call pipeline
(OpenTelemetry's botocore instrumentation, ddtrace, X-Ray, a decorator of one's
own), the lean SQS path hands the hot calls back to the client, and the default
renewer renews in the worker's process, where the tracer is (a renewer process's
calls would go untraced). Checked with the real opentelemetry-instrumentation-
botocore package and an in-memory span exporter on moto, and with wrappers of
every kind on a raw server."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import wrapt
from botocore.client import BaseClient
from opentelemetry.instrumentation.botocore import BotocoreInstrumentor
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from leasekeeper import LeaseManager
from leasekeeper.backends.sqs import SQSBackend
from tests.sqs.conftest import make_client
from tests.sqs.raw_server import RawServer, http_answer

pytestmark = pytest.mark.realtime


@pytest.fixture
def traced() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = BotocoreInstrumentor()
    instrumentor.instrument(tracer_provider=provider)
    try:
        yield exporter
    finally:
        instrumentor.uninstrument()


def span_names(exporter: InMemorySpanExporter) -> list[str]:
    return [span.name for span in exporter.get_finished_spans()]


def test_with_opentelemetry_a_leases_receive_and_delete_are_traced(
    moto_endpoint: str, make_queue: Callable[..., str], traced: InMemorySpanExporter
) -> None:
    url = make_queue(visibility_timeout=30)
    client = make_client(moto_endpoint)
    client.send_message(QueueUrl=url, MessageBody="job")
    backend = SQSBackend(client, url)
    assert backend.lean is not None and not backend.lean.usable()
    assert "wrapped" in str(backend.credentials_problem())  # so: renewed in this process
    traced.clear()
    with LeaseManager(backend, visibility_timeout=30) as manager:
        [held] = list(manager.receive(max_messages=1, wait_seconds=5))
        with held:
            pass
    names = span_names(traced)
    assert "SQS.ReceiveMessage" in names and "SQS.DeleteMessageBatch" in names, names


def test_without_instrumentation_the_lean_path_is_back(
    moto_endpoint: str, make_queue: Callable[..., str]
) -> None:
    instrumentor = BotocoreInstrumentor()
    instrumentor.instrument(tracer_provider=TracerProvider())
    backend = SQSBackend(make_client(moto_endpoint), make_queue())
    assert backend.lean is not None and not backend.lean.usable()
    instrumentor.uninstrument()
    assert backend.lean.usable() and backend.credentials_problem() is None


def decorated(original: Any, seen: list[str]) -> Any:
    @functools.wraps(original)
    def traced_call(self: Any, operation: str, params: Any) -> Any:
        seen.append(operation)
        return original(self, operation, params)

    return traced_call


@pytest.mark.parametrize("kind", ["wrapt", "decorator", "on-the-client"])
def test_any_wrapper_of_botocores_call_sees_the_hot_calls(
    kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[str] = []
    with RawServer() as server:
        backend = SQSBackend(make_client(server.url), f"{server.url}/123456789012/jobs")
        assert backend.lean is not None and backend.lean.usable()
        original = BaseClient.__dict__["_make_api_call"]
        if kind == "wrapt":

            def record(wrapped: Any, instance: Any, args: Any, kwargs: Any) -> Any:
                seen.append(args[0])
                return wrapped(*args, **kwargs)

            monkeypatch.setattr(
                BaseClient, "_make_api_call", wrapt.FunctionWrapper(original, record)
            )
        elif kind == "decorator":
            monkeypatch.setattr(BaseClient, "_make_api_call", decorated(original, seen))
        else:
            client = backend.client
            bound = decorated(original, seen).__get__(client)
            monkeypatch.setattr(client, "_make_api_call", bound, raising=False)
        assert not backend.lean.usable()
        server.answer(http_answer(b'{"Messages":[]}'))
        server.answer(http_answer(b'{"Successful":[{"Id":"0"}],"Failed":[]}'))
        backend.receive(max_messages=10, visibility_timeout=30)
        message = backend.adopt(
            {"MessageId": "m", "ReceiptHandle": "r", "Body": "b"}, visibility_timeout=30
        )
        backend.delete([message])
        assert seen == ["ReceiveMessage", "DeleteMessageBatch"]
        monkeypatch.undo()
        assert backend.lean.usable()
