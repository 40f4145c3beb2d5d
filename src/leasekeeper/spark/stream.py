"""``read_stream``: a queue as a Structured Streaming source, each message deleted only
after the sink committed the micro-batch that carried it.

::

    from leasekeeper import LeaseConfig
    from leasekeeper.spark import SQSSource, read_stream

    frame = read_stream(spark, SQSSource(queue_url), config=LeaseConfig(visibility_timeout=60))
    (frame.writeStream.format("parquet")
        .option("checkpointLocation", "s3a://bucket/checkpoints/jobs")
        .start("s3a://bucket/jobs"))

or, after ``register(spark)`` (``read_stream`` does it too)::

    spark.readStream.format("leasekeeper").option("backend", "sqs") \\
        .option("queue_url", queue_url).option("visibility_timeout", "60").load()

The driver receives and leases each micro-batch's messages and keeps them
invisible, however long the batch runs, until Spark commits it; executors only
emit rows. Delivery is at least once: de-duplicate on ``id`` in the sink. See
``leasekeeper.spark.stream_driver`` for how, and docs/spark.md for the contract.
This module imports PySpark only when called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from leasekeeper.config import LeaseConfig
from leasekeeper.spark.sources import Source, as_source
from leasekeeper.spark.stream_options import (
    DEFAULT_MAX_MESSAGES_PER_BATCH,
    Renewer,
    stream_options,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

FORMAT = "leasekeeper"
MIN_PYSPARK = (4, 2)


def register(spark: SparkSession) -> None:
    """Register the ``"leasekeeper"`` streaming format with ``spark`` (PySpark >= 4.2)."""
    import pyspark

    version = tuple(int(part) for part in pyspark.__version__.split(".")[:2] if part.isdigit())
    if version < MIN_PYSPARK:
        raise RuntimeError(
            f"leasekeeper's streaming source needs PySpark >= 4.2 (admission control and "
            f"Trigger.AvailableNow for Python sources); this is {pyspark.__version__}"
        )
    from leasekeeper.spark.datasource import LeasekeeperDataSource

    spark.dataSource.register(LeasekeeperDataSource)


def read_stream(
    spark: SparkSession,
    source: Source | str | None = None,
    *,
    queue: str | None = None,
    config: LeaseConfig | None = None,
    max_messages_per_batch: int = DEFAULT_MAX_MESSAGES_PER_BATCH,
    partitions: int | None = None,
    receive_concurrency: int = 8,
    poll_seconds: float = 1.0,
    fill_seconds: float = 2.0,
    log_level: str | None = None,
    prefetch: int | None = None,
    renewer: Renewer = "auto",
) -> DataFrame:
    """A streaming DataFrame of the messages of the queue ``queue=URL`` names (any
    URL ``leasekeeper.connect`` takes), or of ``source`` (``backend.spec()``,
    ``SQSSource``, ``MNSSource``, ``AzureQueueSource``); columns in
    ``leasekeeper.spark.stream_rows``.

    ``config`` is the LeaseConfig of the reader's leases (its ``visibility_timeout``
    is also what each receive asks for). The reader keeps receiving while Spark
    runs batches: up to ``prefetch`` messages (default ``max_messages_per_batch``;
    0 receives only when Spark asks) are received and leased ahead, with up to
    ``receive_concurrency`` calls in flight, or one long poll of ``poll_seconds``
    while the queue is empty. Each micro-batch takes at most
    ``max_messages_per_batch`` of them, waiting at most ``fill_seconds`` for more
    when fewer are there; it is split into ``partitions`` Spark partitions
    (default: the session's default parallelism). With ``partitions=1`` the rows go
    to Spark with the batch's plan and no executor starts a Python worker for
    them: the least work for Spark a micro-batch, where the work per row is light
    (more partitions spread a heavy UDF's rows over several cores).
    ``log_level`` (e.g. "INFO") makes the reader's process log to stderr.
    ``renewer`` renews the reader's leases: ``"auto"`` (the default, as for
    ``Worker``) from a renewer process beside the reader's where one can run, so a
    busy driver does not starve the renewals, else in a thread, with one warning;
    ``"process"`` insists; ``"thread"`` renews in the reader's own process.
    Credentials come from the *driver's* environment: the reader's process runs
    there; executors never call the queue service.
    """
    source = as_source(source, queue)
    if partitions is None:
        try:
            partitions = max(1, int(spark.sparkContext.defaultParallelism))
        except Exception:  # Spark Connect has no SparkContext
            partitions = 1
    options = stream_options(
        source,
        config=config,
        max_messages_per_batch=max_messages_per_batch,
        partitions=partitions,
        receive_concurrency=receive_concurrency,
        poll_seconds=poll_seconds,
        fill_seconds=fill_seconds,
        log_level=log_level,
        prefetch=prefetch,
        renewer=renewer,
    )
    register(spark)
    return spark.readStream.format(FORMAT).options(**options.to_options()).load()
