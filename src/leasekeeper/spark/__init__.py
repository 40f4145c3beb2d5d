"""leasekeeper on Spark: drain a backlog with Spark executors, under leases.

::

    from leasekeeper.spark import SQSSource, drain

    drain(spark, SQSSource(queue_url), handler, output="s3://bucket/drain/", partitions=64)

Modules: ``sources`` (the picklable queue sources and the one place they become
backends) and ``draining`` (``drain``/``run_drain``). ``import leasekeeper.spark``
works without PySpark installed. See docs/spark.md.
"""

from __future__ import annotations

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
from leasekeeper.spark.sources import (
    AzureQueueSource,
    MNSSource,
    Source,
    SQSSource,
    build_backend,
)

__all__ = [
    "COLUMNS",
    "AzureQueueSource",
    "DrainReport",
    "DrainResult",
    "Handler",
    "MNSSource",
    "SQSSource",
    "Source",
    "build_backend",
    "drain",
    "run_drain",
]
