"""A second Spark application for tests/spark/test_worker_loss.py, run with
``spark-submit --master spark://...`` as a user deploys one: its own driver (this
process and the JVM spark-submit starts), its own executor on the test cluster.

Its executors get the region and no keys (``spark.executorEnv.AWS_DEFAULT_REGION`` only,
from the command line; the workers have none): what a cluster looks like when a
user forgot to pass the credentials. The driver has keys in its environment.

1. ``drain`` on ``--drain-queue``: the executors cannot sign a request, so the job
   fails; the error's text goes to ``--status`` after a line ``drain-failed``.
2. ``read_stream`` on ``--stream-queue``, into a Parquet sink with a checkpoint,
   with a UDF that notes each body in ``--marks`` and takes ``--row-seconds`` a
   row; executors need no credentials for it (only the driver's reader calls
   the queue). ``stream-started`` goes to ``--status``; then it runs until the
   test kills this driver (SIGKILL to its process group).

Self-contained on purpose (no ``tests`` imports): what its executors unpickle
is leasekeeper's and this file's own code.
"""

from __future__ import annotations

import argparse
import os
import time
import traceback
from typing import Any


def note(path: str, line: str) -> None:
    with open(path, "a") as f:  # O_APPEND: one short line is written atomically
        f.write(line + "\n")


def marker(path: str, seconds: float) -> Any:
    def mark(body: str) -> str:
        note(path, f"{body} {os.getpid()}")
        time.sleep(seconds)
        return body

    return mark


def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("endpoint", "drain-queue", "stream-queue", "out", "checkpoint", "marks", "status"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--visibility", type=float, default=6.0)
    parser.add_argument("--row-seconds", type=float, default=0.05)
    args = parser.parse_args()

    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    from leasekeeper import LeaseConfig
    from leasekeeper.spark import SQSSource, drain, read_stream

    spark = SparkSession.builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    config = LeaseConfig(
        visibility_timeout=args.visibility, timer_interval=0.2, minimal_life=0.5, release_delay=60
    )
    source = SQSSource(args.drain_queue, region="us-east-1", endpoint_url=args.endpoint)
    try:
        drain(spark, source, lambda message: 1, output=f"{args.out}-drain", idle_seconds=2)
        note(args.status, "drain-succeeded")
    except Exception:
        note(args.status, "drain-failed\n" + traceback.format_exc())

    source = SQSSource(args.stream_queue, region="us-east-1", endpoint_url=args.endpoint)
    frame = read_stream(
        spark, source, config=config, max_messages_per_batch=20, receive_concurrency=1
    )
    query = (
        frame.withColumn("seen", F.udf(marker(args.marks, args.row_seconds))("body"))
        .writeStream.format("parquet")
        .option("checkpointLocation", args.checkpoint)
        .start(args.out)
    )
    note(args.status, "stream-started")
    query.awaitTermination()


if __name__ == "__main__":
    main()
