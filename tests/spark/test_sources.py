"""Source specs: picklable, secret-free, validated (no Spark session needed)."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import pytest

from leasekeeper.backends.azure import AzureQueueSpec
from leasekeeper.backends.mns import MNSSpec
from leasekeeper.backends.sqs import SQSBackend, SQSSpec
from leasekeeper.spark import AzureQueueSource, MNSSource, SQSSource, _check_args
from leasekeeper.spark.sources import SOURCE_KINDS, source_from_options, source_options
from tests.services import make_client


def test_the_sources_are_the_backends_specs() -> None:
    # One description of a queue, whether a Spark executor or a renewer process
    # builds it: a backend's spec() is a source too.
    assert (SQSSource, MNSSource, AzureQueueSource) == (SQSSpec, MNSSpec, AzureQueueSpec)
    backend = SQSBackend(make_client("http://127.0.0.1:1"), "http://127.0.0.1:1/1/q")
    assert source_options(backend.spec()) == {
        "backend": "sqs",
        "queue_url": "http://127.0.0.1:1/1/q",
        "region": "us-east-1",
        "endpoint_url": "http://127.0.0.1:1",
    }
    for kind, (_, _, _, fields) in SOURCE_KINDS.items():
        cls = {"sqs": SQSSpec, "mns": MNSSpec, "azure": AzureQueueSpec}[kind]
        assert fields == tuple(f.name for f in dataclasses.fields(cls))


def test_string_options_round_trip_with_a_flag() -> None:
    source = SQSSource("http://q/1/jobs", region="eu-west-1", client_retries=True)
    options = source_options(source)
    assert options["client_retries"] == "true"
    assert source_from_options(options) == source
    with pytest.raises(ValueError, match=r"client_retries.*true or false"):
        source_from_options({**options, "client_retries": "maybe"})


def test_leasekeeper_spark_imports_only_the_sdk_it_uses() -> None:
    code = (
        "import sys; import leasekeeper.spark as s; from leasekeeper.spark import MNSSource; "
        "print(sorted(m for m in ('boto3', 'mns', 'azure.storage.queue') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["['mns']"]


def test_sources_pickle_round_trip() -> None:
    for source in (
        SQSSource("https://sqs.us-east-1.amazonaws.com/1/q", region="us-east-1"),
        MNSSource("http://127.0.0.1:9999", "jobs"),
        AzureQueueSource("jobs"),
    ):
        assert pickle.loads(pickle.dumps(source)) == source


def test_azure_source_refuses_a_connection_string_with_a_key() -> None:
    conn = "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=c2VjcmV0;QueueEndpoint=x"
    with pytest.raises(ValueError, match="executors' environment") as raised:
        AzureQueueSource("jobs", connection_string=conn)
    assert "c2VjcmV0" not in str(raised.value)
    keyless = AzureQueueSource("jobs", connection_string="UseDevelopmentStorage=true")
    assert "UseDevelopmentStorage" not in repr(keyless)
    with pytest.raises(ValueError, match="not both"):
        AzureQueueSource("jobs", connection_string="UseDevelopmentStorage=true", account_url="x")


def test_mns_source_needs_credentials_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MNS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("MNS_ACCESS_KEY_SECRET", raising=False)
    with pytest.raises(Exception, match="MNS_ACCESS_KEY_ID"):
        MNSSource("http://127.0.0.1:1", "q").build()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 10, 10, 5.0, None), "partitions"),
        ((2, 0, 10, 5.0, None), "batch_size"),
        ((2, 10, -1, 5.0, None), "concurrency"),
        ((2, 10, 10, 0.0, None), "idle_seconds"),
        ((2, 10, 10, float("nan"), None), "idle_seconds"),
        ((2, 10, 10, 5.0, 0), "max_messages"),
        ((2, 10, 10, 5.0, None, "processes"), "renewer"),
    ],
)
def test_drain_arguments_are_checked(args: tuple[object, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _check_args(*args[:5], renewer=args[5] if len(args) > 5 else "thread")  # type: ignore[arg-type]
