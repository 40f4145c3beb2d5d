"""read_stream on PySpark local mode against moto's SQS, the local MNS server and Azurite.

The first test is issue 13's "Checked by" scenario. Waits have generous deadlines
and nothing asserts how long anything took: these run beside other load.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from leasekeeper import LeaseConfig
from leasekeeper.spark import AzureQueueSource, SQSSource, read_stream, register
from leasekeeper.spark.stream_rows import COLUMNS
from tests.services import free_port
from tests.spark.cluster import descendants
from tests.spark.test_drain import fill, queue_depth
from tests.sqs.conftest import make_client

pytestmark = pytest.mark.slow

VISIBILITY = 2
CONFIG = LeaseConfig(visibility_timeout=VISIBILITY, timer_interval=0.2, minimal_life=0.5)
# moto's ReceiveMessage takes no lock: concurrent receives can hand one message out
# twice (receive_count 2). Where a test asserts "never received twice", the reader
# receives one call at a time (the parallel receives are tested on MemoryQueue,
# the MNS server and Azurite).
ONE_AT_A_TIME = 1
QUERY_TIMEOUT = 600  # a generous bound for a query to end by itself


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Wait for ``condition``; return how long it took (reported, never asserted)."""
    begun = time.monotonic()
    while not condition():
        assert time.monotonic() - begun < timeout, f"timed out waiting for {what}"
        time.sleep(0.05)
    return time.monotonic() - begun


def slow_marker(path: Path, seconds: float) -> Callable[[str], str]:
    """A UDF body: note the message body in ``path`` (executors are other
    processes), then sleep, so a micro-batch takes longer than the visibility."""
    target = str(path)

    def mark(body: str) -> str:
        with open(target, "a") as f:  # O_APPEND: one short line is written atomically
            f.write(f"{body}\n")
        time.sleep(seconds)
        return body

    return mark


def marked(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def sink_rows(spark: Any, path: Path) -> list[Any]:
    # The file sink's own log names the files of committed batches only.
    return spark.read.parquet(str(path)).collect() if (path / "_spark_metadata").exists() else []


def run_available_now(frame: Any, out: Path, checkpoint: Path) -> None:
    query = (
        frame.writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(out))
    )
    assert query.awaitTermination(QUERY_TIMEOUT), "Trigger.AvailableNow did not end by itself"
    assert query.exception() is None


@pytest.fixture
def sqs(moto_endpoint: str, make_queue: Any) -> Iterator[tuple[Any, str, SQSSource]]:
    client = make_client(moto_endpoint)
    url = make_queue(VISIBILITY)
    yield client, url, SQSSource(url, region="us-east-1", endpoint_url=moto_endpoint)


def not_visible(client: Any, url: str) -> int:
    attributes = client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessagesNotVisible"]
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessagesNotVisible"])


@pytest.mark.parametrize(
    "partitions", [2, 1], ids=["rows-emitted-by-executors", "rows-sent-with-the-plan"]
)
def test_checked_by_scenario(spark: Any, sqs: Any, tmp_path: Path, partitions: int) -> None:
    """120 messages at a 2 s visibility through batches longer than that into a Parquet
    sink: each once, none received twice, queue empty. 80 more, the query stopped
    mid-run: nothing left invisible; restarted from the checkpoint: all 200 in the
    sink, duplicates only from the batch running at the stop. Both readers: with one
    partition a batch, its rows go to Spark with the batch's plan."""
    from pyspark.sql import functions as F

    client, url, source = sqs
    out, checkpoint, marks = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "marks"
    # 40 rows a batch in `partitions` tasks: 3 s a batch (6 s with one partition)
    udf = F.udf(slow_marker(marks, 0.15))

    def frame(config: LeaseConfig) -> Any:
        raw = read_stream(
            spark,
            source,
            config=config,
            max_messages_per_batch=40,
            partitions=partitions,
            receive_concurrency=ONE_AT_A_TIME,
        )
        return raw.withColumn("seen", udf("body"))

    first = fill(client, url, 120)
    run_available_now(frame(CONFIG), out, checkpoint)
    rows = sink_rows(spark, out)
    assert Counter(row["id"] for row in rows) == Counter(first), "not each exactly once"
    assert {row["receive_count"] for row in rows} == {1}, "a message was received twice"
    assert queue_depth(client, url) == 0
    assert len(Counter(marked(marks))) == 120

    # 80 more; the query is stopped while a batch runs. Its leases ask 30 s, so only a
    # release (not a lapse) makes them visible again within the wait below.
    second = [f"job-{n:04d}" for n in range(120, 200)]
    for start in range(0, 80, 10):
        client.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "MessageBody": second[start + i]} for i in range(10)],
        )
    marks.unlink()
    query = (
        frame(CONFIG.replace(visibility_timeout=30))
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .start(str(out))
    )
    try:
        wait_for(lambda: len(marked(marks)) >= 5, QUERY_TIMEOUT, "a batch to be running")
        assert not_visible(client, url) > 0
        running = set(marked(marks))
    finally:
        query.stop()
    took = wait_for(lambda: not_visible(client, url) == 0, 20, "every message to be released")
    print(f"\nnothing invisible {took:.2f}s after query.stop() returned")
    running |= set(marked(marks))  # what the running batch got to before it stopped

    run_available_now(frame(CONFIG), out, checkpoint)
    rows = sink_rows(spark, out)
    bodies = Counter(row["body"] for row in rows)
    assert set(bodies) == {f"job-{n:04d}" for n in range(200)}
    duplicated = {body for body, count in bodies.items() if count > 1}
    assert duplicated <= running, "duplicates from a batch that was not running at the stop"
    assert queue_depth(client, url) == 0


def test_executor_loss_costs_nothing(spark: Any, sqs: Any, tmp_path: Path) -> None:
    """A Python worker dies mid-task: Spark retries the task with the rows the driver
    planned; the driver still holds the leases, so nothing is received twice."""
    from pyspark.sql import functions as F

    client, url, source = sqs
    sent = fill(client, url, 60)
    doomed = {"job-0003", "job-0031", "job-0058"}
    died = str(tmp_path / "died")
    os.makedirs(died)

    def crash_once(body: str) -> str:
        if body in doomed:
            with contextlib.suppress(FileExistsError):
                with open(os.path.join(died, body), "x"):
                    pass
                os._exit(13)  # the first attempt's worker dies, rows and all
        return body

    frame = read_stream(
        spark,
        source,
        config=CONFIG,
        max_messages_per_batch=25,
        partitions=3,
        receive_concurrency=ONE_AT_A_TIME,
    )
    frame = frame.withColumn("checked", F.udf(crash_once)("body"))
    run_available_now(frame, tmp_path / "out", tmp_path / "checkpoint")
    rows = sink_rows(spark, tmp_path / "out")
    assert sorted(os.listdir(died)) == sorted(doomed)
    assert Counter(row["id"] for row in rows) == Counter(sent)
    assert {row["receive_count"] for row in rows} == {1}
    assert queue_depth(client, url) == 0


def runner_pids() -> set[int]:
    """The query readers' processes (PySpark's python_streaming_source_runner) of this
    session: started by its driver, a child of this process - not those of whatever
    else runs Spark on the machine."""
    found = set()
    for pid in descendants(os.getpid()):
        with contextlib.suppress(OSError):
            if b"python_streaming_source_runner" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.add(pid)
    return found


@pytest.mark.parametrize(
    "partitions", [2, 1], ids=["rows-emitted-by-executors", "rows-sent-with-the-plan"]
)
def test_driver_loss_costs_one_visibility_timeout(
    spark: Any, sqs: Any, tmp_path: Path, partitions: int
) -> None:
    """The reader's process is killed (SIGKILL: it releases nothing itself) while a
    batch runs: its renewer process sees it die and releases its messages (with a
    renewer thread they would lapse after one visibility timeout), and a restart
    from the checkpoint reads them again (the batch the offset log names but the
    commit log does not is replayed empty). At least once: duplicates only from the
    batch running at the kill."""
    from pyspark.sql import functions as F

    client, url, source = sqs
    fill(client, url, 60)
    out, checkpoint, marks = tmp_path / "out", tmp_path / "checkpoint", tmp_path / "marks"
    udf = F.udf(slow_marker(marks, 0.1))
    before = runner_pids()
    frame = read_stream(
        spark,
        source,
        config=CONFIG,
        max_messages_per_batch=20,
        partitions=partitions,
        receive_concurrency=ONE_AT_A_TIME,
    )
    query = (
        frame.withColumn("seen", udf("body"))
        .writeStream.format("parquet")
        .option("checkpointLocation", str(checkpoint))
        .start(str(out))
    )
    try:
        wait_for(lambda: len(marked(marks)) >= 25, QUERY_TIMEOUT, "the second batch to run")
        readers = runner_pids() - before
        assert len(readers) == 1
        os.kill(readers.pop(), signal.SIGKILL)
        running = set(marked(marks))
        # The query fails at its next call to the dead reader.
        with contextlib.suppress(Exception):
            query.awaitTermination(QUERY_TIMEOUT)
    finally:
        query.stop()
    running |= set(marked(marks))
    # Nobody renews the dead reader's leases: its renewer process released them.
    took = wait_for(lambda: not_visible(client, url) == 0, 60, "the held messages to lapse")
    print(f"\nthe dead reader's messages were back {took:.2f}s after the query ended")
    run_available_now(
        read_stream(
            spark,
            source,
            config=CONFIG,
            max_messages_per_batch=20,
            partitions=partitions,
            receive_concurrency=ONE_AT_A_TIME,
        ),
        out,
        checkpoint,
    )
    bodies = Counter(row["body"] for row in sink_rows(spark, out))
    assert set(bodies) == {f"job-{n:04d}" for n in range(60)}
    assert {body for body, count in bodies.items() if count > 1} <= running
    assert queue_depth(client, url) == 0


def test_the_format_with_string_options_on_the_local_mns_server(
    spark: Any, mns_server: Any, tmp_path: Path
) -> None:
    from mns.account import Account
    from mns.queue import Message as MNSMessage

    from tests.mns.conftest import ACCESS_ID, ACCESS_KEY

    name = f"stream-{uuid.uuid4().hex[:8]}"
    mns_server.create_queue(name, visibility_timeout=VISIBILITY)
    queue = Account(mns_server.endpoint, ACCESS_ID, ACCESS_KEY).get_queue(name)
    for n in range(30):
        queue.send_message(MNSMessage(f"job-{n:04d}"))
    register(spark)
    frame = (
        spark.readStream.format("leasekeeper")
        .option("backend", "mns")
        .option("endpoint", mns_server.endpoint)
        .option("queue_name", name)
        .option("max_messages_per_batch", "8")
        .option("partitions", "2")
        .option("visibility_timeout", str(VISIBILITY))
        .option("timer_interval", "0.2")
        .option("minimal_life", "0.5")
        .load()
    )
    assert tuple(frame.columns) == COLUMNS
    run_available_now(frame, tmp_path / "out", tmp_path / "checkpoint")
    rows = sink_rows(spark, tmp_path / "out")
    assert sorted(row["body"] for row in rows) == [f"job-{n:04d}" for n in range(30)]
    assert all(row["sent_at"] is not None and row["receive_count"] == 1 for row in rows)
    assert max(row["batch"] for row in rows) >= 4  # 8 a batch
    stats = mns_server.queue_stats(name)
    assert stats.visible + stats.in_flight + stats.delayed == 0
    assert set(stats.receive_counts.values()) == {1}


def test_read_stream_on_azurite(spark: Any, azurite: str, tmp_path: Path) -> None:
    from azure.storage.queue import QueueClient

    name = f"lk-{uuid.uuid4().hex[:20]}"
    admin = QueueClient.from_connection_string(azurite, name)
    admin.create_queue()
    try:
        for n in range(30):
            admin.send_message(f"job-{n:04d}")
        # The reader's process takes its credentials from the driver's environment and
        # spark.executorEnv.* (SparkContext.environment), never from the source.
        environment = spark.sparkContext.environment
        environment["AZURE_STORAGE_CONNECTION_STRING"] = azurite
        try:
            frame = read_stream(
                spark, AzureQueueSource(name), config=CONFIG, max_messages_per_batch=12
            )
        finally:
            del environment["AZURE_STORAGE_CONNECTION_STRING"]
        run_available_now(frame, tmp_path / "out", tmp_path / "checkpoint")
        rows = sink_rows(spark, tmp_path / "out")
        assert sorted(row["body"] for row in rows) == [f"job-{n:04d}" for n in range(30)]
        assert all(row["sent_at"] is not None for row in rows)
        assert admin.get_queue_properties().approximate_message_count == 0
    finally:
        with contextlib.suppress(Exception):
            admin.delete_queue()
        admin.close()


def test_a_queue_never_reached_fails_the_query_naming_the_endpoint(
    spark: Any, tmp_path: Path
) -> None:
    """docs/guide.md, "When a service cannot be reached": a query on a queue no
    receive ever reached fails once REACH_WITHIN (20 s) has passed, with the error
    that names host:port - it ran for ever, receiving and failing."""
    port = free_port()
    frame = read_stream(spark, queue=f"http://127.0.0.1:{port}/000000000000/jobs", config=CONFIG)
    started = time.monotonic()
    query = (
        frame.writeStream.format("parquet")
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .start(str(tmp_path / "out"))
    )
    try:
        with pytest.raises(Exception) as raised:
            query.awaitTermination(QUERY_TIMEOUT)
        took = time.monotonic() - started
    finally:
        query.stop()
    assert type(raised.value).__name__ == "StreamingQueryException"
    assert f"could not reach 127.0.0.1:{port} (" in str(raised.value)
    assert "ReceiveError" in str(raised.value)
    # 20 s of the rule; the rest is the query's start on a loaded machine.
    assert took < 120, took


def test_bad_options_fail_when_the_stream_is_loaded(spark: Any) -> None:
    register(spark)
    reader = spark.readStream.format("leasekeeper").option("backend", "sqs")
    with pytest.raises(Exception, match="visiblity_timeout"):
        reader.option("queue_url", "http://x/q").option("visiblity_timeout", "30").load()
    with pytest.raises(Exception, match="queue_url"):
        spark.readStream.format("leasekeeper").option("backend", "sqs").load()
    with pytest.raises(TypeError, match="SQSSource, MNSSource or AzureQueueSource"):
        read_stream(spark, object())  # type: ignore[arg-type]
