"""Measure 8: messages per second through Spark - ``read_stream`` and ``drain`` side by side.

One SQS queue on a moto server, one local[2] Spark session, the same handler
cost (a busy CPU loop per message, so neither way gains from threads that only
sleep) and the same Parquet output. Each way gets the same backlog on the same
queue, one after the other, and is timed from start to finish, the detection of
the end included:

- ``drain``: ``run_drain`` with 2 tasks (batch_size 10, idle_seconds 2); the
  handler runs on the executors; its Parquet outcome rows are the output.
- ``read_stream``: a query with Trigger.AvailableNow (max_messages_per_batch
  1000, 2 partitions, 2 receives at a time like drain's 2 tasks); the handler is
  a UDF on ``body``; a Parquet sink with a checkpoint; timed from ``start()`` to
  the end of ``awaitTermination()``.

Both must end with every message in their output and the queue empty. One run;
no target: it says what each way costs here, not what it must reach.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests import toolchain

from benchmarks.common import (
    MOTO_ENV,
    BenchResult,
    Context,
    Row,
    fmt,
    fmt_ratio,
    moto_server,
    ratio,
    sqs_client,
)
from leasekeeper import LeaseConfig, Message

NAME = "stream"
TITLE = "11. Spark: read_stream vs drain throughput"
COST = 0.001  # handler CPU seconds per message
VISIBILITY = 30


def busy(body: str) -> int:
    """The handler's cost: COST seconds of CPU (the stream's UDF on ``body``)."""
    until = time.perf_counter() + COST
    while time.perf_counter() < until:
        pass
    return len(body)


def handle(message: Message) -> int:
    """The same cost as drain's handler."""
    return busy(str(message.body))


@contextmanager
def moto_sqs() -> Iterator[tuple[Any, str, str]]:
    """moto's server with queue "bench"; yields (client, queue URL, endpoint)."""
    # The local server's dummy credentials, for this process, its client and Spark's
    # Python processes (which inherit them when the session starts).
    os.environ.update(MOTO_ENV)
    with moto_server() as endpoint:
        client = sqs_client(endpoint)
        url = client.create_queue(
            QueueName="bench", Attributes={"VisibilityTimeout": str(VISIBILITY)}
        )["QueueUrl"]
        yield client, url, endpoint


def fill(client: Any, url: str, count: int) -> None:
    for start in range(0, count, 10):
        client.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "MessageBody": f"job-{start + i:06d}"}
                for i in range(min(10, count - start))
            ],
        )


def depth(client: Any, url: str) -> int:
    counts = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(counts["ApproximateNumberOfMessages"]) + int(
        counts["ApproximateNumberOfMessagesNotVisible"]
    )


@contextmanager
def spark_session() -> Iterator[Any]:
    missing = toolchain.java_missing()
    if missing is not None:
        raise RuntimeError(missing)
    home = toolchain.java_home()
    if home is not None:
        os.environ["JAVA_HOME"] = str(home)
    os.environ.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("leasekeeper-bench-stream")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def time_drain(spark: Any, source: Any, output: str, config: LeaseConfig) -> dict[str, Any]:
    from leasekeeper.spark import run_drain

    begun = time.monotonic()
    result = run_drain(
        spark,
        source,
        handle,
        output=output,
        partitions=2,
        config=config,
        batch_size=10,
        idle_seconds=2,
    )
    seconds = time.monotonic() - begun
    return {"seconds": seconds, "completed": result.report.completed}


def time_stream(spark: Any, source: Any, where: str, config: LeaseConfig) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from leasekeeper.spark import read_stream

    # Two receives at a time, as drain's two tasks (moto's ReceiveMessage takes no
    # lock: more concurrent receives hand messages out twice).
    frame = read_stream(
        spark,
        source,
        config=config,
        max_messages_per_batch=1000,
        partitions=2,
        receive_concurrency=2,
    )
    frame = frame.withColumn("handled", F.udf(busy, "int")("body")).select("id", "handled")
    begun = time.monotonic()
    query = (
        frame.writeStream.format("parquet")
        .option("checkpointLocation", f"{where}/checkpoint")
        .trigger(availableNow=True)
        .start(f"{where}/sink")
    )
    query.awaitTermination()
    seconds = time.monotonic() - begun
    rows = spark.read.parquet(f"{where}/sink")
    return {
        "seconds": seconds,
        "completed": rows.select("id").distinct().count(),
        "rows": rows.count(),
        "batches": len(query.recentProgress),
    }


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    count = ctx.pick(300, 1000)
    # A failing handler's message waits 60 s: a bug here shows as a missing count,
    # not as a drain that never ends.
    config = LeaseConfig(visibility_timeout=VISIBILITY, release_delay=60)
    from leasekeeper.spark import SQSSource

    where = tempfile.mkdtemp(prefix="leasekeeper-bench-stream-")
    with moto_sqs() as (client, url, endpoint), spark_session() as spark:
        source = SQSSource(url, region="us-east-1", endpoint_url=endpoint)
        fill(client, url, count)
        drained = time_drain(spark, source, f"{where}/drain", config)
        drained["left"] = depth(client, url)
        fill(client, url, count)
        streamed = time_stream(spark, source, f"{where}/stream", config)
        streamed["left"] = depth(client, url)
    rates = {
        name: (figures["completed"] / figures["seconds"] if figures["seconds"] > 0 else None)
        for name, figures in (("drain", drained), ("read_stream", streamed))
    }
    ok = all(
        figures["completed"] == count and figures["left"] == 0 for figures in (drained, streamed)
    )
    result.figures = {
        "messages": count,
        "handler_cpu_seconds": COST,
        "drain": drained,
        "read_stream": streamed,
        "per_second": rates,
    }
    result.rows.append(
        Row(
            measure=(
                f"messages/s through Spark local[2], {count} SQS messages (moto), "
                f"{COST * 1000:g} ms CPU handler, Parquet out"
            ),
            leasekeeper=(
                f"read_stream {fmt(rates['read_stream'], 'msg/s')} "
                f"({fmt(streamed['seconds'], 's')}, {streamed['batches']} batches)"
            ),
            baselines=f"drain {fmt(rates['drain'], 'msg/s')} ({fmt(drained['seconds'], 's')})",
            ratio=fmt_ratio(ratio(rates["read_stream"], rates["drain"]), "read_stream/drain"),
            note="" if ok else f"incomplete: {drained} / {streamed}",
        )
    )
    result.notes.append(
        "one run each, same queue, same handler cost; both timed to their own end "
        "(drain's idle_seconds wait, the stream's last empty batch)"
    )
    return result
