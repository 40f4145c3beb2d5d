"""leasekeeper on Spark: drain a backlog, or read a queue as a streaming DataFrame.

::

    from leasekeeper.spark import SQSSource, drain, read_stream

    # A backlog, once: executors are queue workers for one Spark job.
    drain(spark, SQSSource(queue_url), handler, output="s3://bucket/drain/", partitions=64)

    # A pipeline that runs all the time: each message is deleted only after the
    # sink committed the micro-batch that carried it.
    frame = read_stream(spark, SQSSource(queue_url), max_messages_per_batch=1000)
    frame.writeStream.format("parquet").option("checkpointLocation", ...).start(path)

Modules: ``sources`` (the picklable queue sources - the backends' specs, so
``SQSSource`` is ``leasekeeper.backends.sqs.SQSSpec`` and ``backend.spec()`` is a
source too - and the one place they become backends), ``draining``
(``drain``/``run_drain``), ``stream`` (``read_stream`` and the ``"leasekeeper"``
streaming format), ``stream_options`` (its string options),
``stream_driver`` (the driver-side half of the reader: receives, leases, commits),
``stream_rows`` (the columns) and ``datasource`` (the PySpark Data Source classes;
the only module that needs PySpark at import). ``import leasekeeper.spark`` works
without PySpark installed. See docs/spark.md.
"""

from __future__ import annotations

from typing import Any

from leasekeeper.spark import sources as _sources
from leasekeeper.spark.draining import (
    COLUMNS,
    DrainReport,
    DrainResult,
    Handler,
    drain,
    run_drain,
)

# The name leasekeeper.spark had before it became a package (tests import it).
from leasekeeper.spark.draining import check_drain_args as _check_args  # noqa: F401
from leasekeeper.spark.sources import Source, build_backend
from leasekeeper.spark.stream import read_stream, register
from leasekeeper.spark.stream_rows import COLUMNS as STREAM_COLUMNS


def __getattr__(name: str) -> Any:
    # SQSSource, MNSSource, AzureQueueSource: the backends' spec classes, imported on
    # first use so that leasekeeper.spark needs only the SDK of the queue it reads.
    return getattr(_sources, name)


__all__ = [
    "COLUMNS",
    "AzureQueueSource",
    "DrainReport",
    "DrainResult",
    "Handler",
    "STREAM_COLUMNS",
    "MNSSource",
    "SQSSource",
    "Source",
    "build_backend",
    "drain",
    "read_stream",
    "register",
    "run_drain",
]
