"""The "leasekeeper" format's string options, and what needs no Spark session."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from leasekeeper import LeaseConfig
from leasekeeper.spark import AzureQueueSource, MNSSource, SQSSource
from leasekeeper.spark.stream_options import StreamOptions, stream_options

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "source",
    [
        SQSSource("https://sqs.eu-west-1.amazonaws.com/1/jobs", region="eu-west-1"),
        SQSSource("http://127.0.0.1:5000/1/jobs", endpoint_url="http://127.0.0.1:5000"),
        MNSSource("http://123.mns.cn-hangzhou.aliyuncs.com", "jobs"),
        AzureQueueSource("jobs"),
        AzureQueueSource("jobs", account_url="https://acct.queue.core.windows.net"),
    ],
)
def test_options_round_trip_through_strings(source: object) -> None:
    config = LeaseConfig(
        visibility_timeout=45,
        timer_interval=0.5,
        max_lease_duration=3600,
        extend_threshold="auto",
        stall_timeout=600,
        on_cap="rollover",
    )
    options = stream_options(
        source,  # type: ignore[arg-type]
        config=config,
        max_messages_per_batch=250,
        partitions=8,
        log_level="info",
        prefetch=0,
        renewer="thread",
    )
    strings = options.to_options()
    assert all(isinstance(v, str) for v in strings.values())
    assert StreamOptions.parse(strings) == options
    # Spark's options are case-insensitive.
    assert StreamOptions.parse({k.upper(): v for k, v in strings.items()}) == options
    assert pickle.loads(pickle.dumps(options)) == options


def test_defaults() -> None:
    parsed = StreamOptions.parse({"backend": "SQS", "queue_url": "http://x/1/q"})
    assert parsed.source == SQSSource("http://x/1/q")
    assert parsed.config == LeaseConfig()
    assert (parsed.max_messages_per_batch, parsed.partitions, parsed.receive_concurrency) == (
        1000,
        1,
        8,
    )
    # The reader receives ahead up to a batch's worth by default, none with 0.
    assert parsed.prefetch is None and parsed.lease_ahead == 1000
    assert (
        StreamOptions.parse({"backend": "sqs", "queue_url": "u", "prefetch": "0"}).lease_ahead == 0
    )
    # Its leases are renewed as a Worker's are: a renewer process where one can run.
    assert parsed.renewer == "auto"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({}, "'backend' must be one of sqs, mns, azure"),
        ({"backend": "kafka"}, "'backend' must be one of"),
        ({"backend": "sqs"}, "needs option 'queue_url'"),
        ({"backend": "mns", "endpoint": "http://x"}, "needs option 'queue_name'"),
        ({"backend": "sqs", "queue_url": "u", "visiblity_timeout": "3"}, "visiblity_timeout"),
        ({"backend": "sqs", "queue_url": "u", "partitions": "two"}, "'partitions' must be an int"),
        ({"backend": "sqs", "queue_url": "u", "partitions": "0"}, "partitions must be an integer"),
        ({"backend": "sqs", "queue_url": "u", "poll_seconds": "-1"}, "poll_seconds"),
        ({"backend": "sqs", "queue_url": "u", "visibility_timeout": "1"}, "visibility_timeout"),
        ({"backend": "sqs", "queue_url": "u", "log_level": "loud"}, "log_level"),
        ({"backend": "sqs", "queue_url": "u", "prefetch": "-1"}, "prefetch must be None or"),
        ({"backend": "sqs", "queue_url": "u", "prefetch": "all"}, "'prefetch' must be an int"),
        ({"backend": "sqs", "queue_url": "u", "renewer": "mine"}, "renewer must be one of auto"),
    ],
)
def test_bad_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StreamOptions.parse(options)


def test_a_connection_string_with_a_key_is_refused_without_echoing_it() -> None:
    conn = "DefaultEndpointsProtocol=http;AccountName=a;AccountKey=c2VjcmV0;QueueEndpoint=x"
    with pytest.raises(ValueError, match="executors' environment") as raised:
        StreamOptions.parse({"backend": "azure", "queue_name": "q", "connection_string": conn})
    assert "c2VjcmV0" not in str(raised.value)


def test_read_stream_takes_only_the_three_sources() -> None:
    with pytest.raises(TypeError, match="SQSSource, MNSSource or AzureQueueSource"):
        stream_options(object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="LeaseConfig"):
        stream_options(SQSSource("u"), config={"visibility_timeout": 3})  # type: ignore[arg-type]


def test_leasekeeper_and_its_spark_package_import_without_pyspark() -> None:
    code = (
        "import sys\n"
        "sys.modules['pyspark'] = None  # any import of pyspark fails\n"
        "import leasekeeper, leasekeeper.spark\n"
        "from leasekeeper.spark import read_stream, drain, SQSSource\n"
        "from leasekeeper.spark import stream_driver, stream_options, stream_rows\n"
        "try:\n"
        "    import leasekeeper.spark.datasource\n"
        "except ImportError:\n"
        "    print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=REPO,
    )
    assert done.stdout.strip() == "ok", done.stderr


@pytest.mark.parametrize("partitions", [1, 3])
def test_one_partition_a_batch_is_read_by_a_simple_reader(partitions: int) -> None:
    """With one partition a micro-batch PySpark gets no partitioned reader and falls back
    to the simple one, whose rows travel with the batch's plan; with more it gets the
    partitioned reader, whose rows executors emit. Both pickle without a driver."""
    from pyspark.errors import PySparkNotImplementedError
    from pyspark.sql.datasource import DataSourceStreamReader, SimpleDataSourceStreamReader
    from pyspark.sql.types import StructType

    from leasekeeper.spark.datasource import LeasekeeperDataSource

    options = stream_options(SQSSource("http://127.0.0.1:5000/1/jobs"), partitions=partitions)
    source = LeasekeeperDataSource(options.to_options())
    schema = StructType([])
    if partitions == 1:
        with pytest.raises(PySparkNotImplementedError):
            source.streamReader(schema)
        reader: object = source.simpleStreamReader(schema)
        assert isinstance(reader, SimpleDataSourceStreamReader)
    else:
        reader = source.streamReader(schema)
        assert isinstance(reader, DataSourceStreamReader)
    copy = pickle.loads(pickle.dumps(reader))
    assert copy.options == options and copy._driver is None
