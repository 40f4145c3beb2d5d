"""Source specs: picklable, secret-free, validated (no Spark session needed)."""

from __future__ import annotations

import dataclasses
import json
import pickle
import subprocess
import sys

import pytest

from leasekeeper import LeaseConfig
from leasekeeper.backends.azure import AzureQueueSpec
from leasekeeper.backends.mns import MNSSpec
from leasekeeper.backends.registry import URLSpec
from leasekeeper.backends.sqs import SQSBackend, SQSSpec
from leasekeeper.spark import AzureQueueSource, MNSSource, SQSSource, _check_args
from leasekeeper.spark.sources import SOURCE_KINDS, source_from_options, source_options
from tests.services import make_client


def test_the_sources_are_the_backends_specs() -> None:
    # One description of a queue, whether a Spark executor or a renewer process
    # builds it: a backend's spec() is a source too.
    assert (SQSSource, MNSSource, AzureQueueSource) == (SQSSpec, MNSSpec, AzureQueueSpec)
    backend = SQSBackend(make_client("http://127.0.0.1:1"), "http://127.0.0.1:1/1/q")
    options = source_options(backend.spec())  # the queue by URL, its client's settings
    assert options == {
        "backend": "url",
        "queue": "http://127.0.0.1:1/1/q",
        "queue_options": json.dumps(
            {
                "connect_timeout": 2,  # make_client's
                "endpoint_url": "http://127.0.0.1:1",
                "max_attempts": 3,  # the first and two retries
                "max_pool_connections": 10,
                "read_timeout": 30,
                "region": "us-east-1",
                "retry_mode": "standard",
            }
        ),
    }
    assert source_from_options(options) == backend.spec()
    assert source_from_options({"queue": "sqs://jobs"}) == URLSpec("sqs://jobs")
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
    assert done.stdout.split() == ["[]"]  # the sources are plain specs: no SDK until built


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


def test_a_queue_by_url_is_a_source_and_survives_the_formats_options() -> None:
    from leasekeeper.spark.sources import as_source
    from leasekeeper.spark.stream_options import StreamOptions, stream_options

    url = "redis://cache:6379/0?stream=jobs&group=g"
    source = as_source(None, url)  # read_stream(spark, queue=url), drain(..., queue=url)
    assert source == as_source(url) == URLSpec(url)
    options = stream_options(source, config=LeaseConfig(visibility_timeout=60)).to_options()
    assert options["queue"] == url
    assert StreamOptions.parse(options).source == source
    with_options = URLSpec.of(url, {"visibility_timeout": 60, "consumer": "spark"})
    assert source_from_options(source_options(with_options)) == with_options
    with pytest.raises(TypeError, match="not both"):
        as_source(source, url)
    with pytest.raises(ValueError, match="installed schemes"):
        as_source(None, "nowhere://jobs")
    with pytest.raises(TypeError, match="queue=URL"):
        as_source(None)
