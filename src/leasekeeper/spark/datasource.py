"""The PySpark Data Source of ``read_stream``: the format ``"leasekeeper"``.

The only module of ``leasekeeper.spark`` that needs PySpark (>= 4.2: the
two-argument ``latestOffset`` and ``Trigger.AvailableNow``) at import.

PySpark builds a ``LeasekeeperStreamReader`` in three places: in the query's
long-lived reader process on the driver (which calls ``initialOffset``,
``latestOffset``, ``partitions``, ``commit`` and ``stop``), in a short-lived
planner process that pickles it for executors, and, unpickled, on executors
(which call only ``read``). So ``__init__`` only parses options; the
``StreamDriver`` (backend, LeaseManager, threads) is built by the first
driver-side call, and is never pickled. Executors emit the rows the driver put
into each ``QueueRows`` partition: they need no credentials and make no call to
the queue service.

With one partition a micro-batch (``partitions`` 1) the reader is a
``SimpleDataSourceStreamReader`` instead (``LeasekeeperRowsReader``): its rows go
to Spark with the batch's plan, from the reader's process, and Spark keeps them in
its block manager; no executor starts a Python worker to emit them. Spark then
does the least work per micro-batch (a third less of its CPU a message than with
two partitions on a 2-core machine, most of it the single task's doing; see
docs/performance.md, measure 11), at the price of one task a batch: a split
into several tasks is the executors' Python workers' job.
"""

from __future__ import annotations

import atexit
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.errors import PySparkNotImplementedError
from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
    SimpleDataSourceStreamReader,
)
from pyspark.sql.streaming.datasource import (
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from leasekeeper.spark.stream_driver import StreamDriver, install_sigterm_handler
from leasekeeper.spark.stream_options import StreamOptions
from leasekeeper.spark.stream_rows import SCHEMA, Row

FORMAT = "leasekeeper"


class QueueRows(InputPartition):
    """One Spark partition of a micro-batch: the rows, made on the driver."""

    def __init__(self, rows: list[Row]) -> None:
        super().__init__(None)
        self.rows = rows

    def __repr__(self) -> str:  # never the bodies
        return f"QueueRows(<{len(self.rows)} rows>)"


class DriverHolder:
    """What both readers share: the options, and the ``StreamDriver`` built on first
    use in the reader's process (never pickled)."""

    def __init__(self, options: StreamOptions) -> None:
        self.options = options
        self._driver: StreamDriver | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {"options": self.options, "_driver": None}

    def _started(self) -> StreamDriver:
        driver = self._driver
        if driver is None:
            self.options.apply_log_level()
            driver = self._driver = StreamDriver(self.options)
            install_sigterm_handler(lambda: self._driver)
            # PySpark's wrapper of a simple reader has no stop() to pass on: a reader
            # process that ends without SIGTERM releases what it holds at its exit.
            atexit.register(self._stop)
        return driver

    def _stop(self) -> None:
        driver = self._driver
        if driver is not None and driver.stop():
            driver.shutdown_threads()


class LeasekeeperStreamReader(DriverHolder, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader; its driver-side work is ``StreamDriver``'s."""

    def initialOffset(self) -> dict[str, int]:
        return self._started().initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_batch)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # ReadAllAvailable (Trigger.Once, or a caller's choice) is capped at
        # max_messages_per_batch too: a queue has no end to read up to.
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        offset: dict[str, Any] = self._started().latest_offset(start, max_rows)
        return offset

    def prepareForTriggerAvailableNow(self) -> None:
        self._started().prepare_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return [QueueRows(rows) for rows in self._started().plan(start, end)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, QueueRows):
            raise TypeError(f"not a leasekeeper partition: {type(partition).__name__}")
        return iter(partition.rows)

    def commit(self, end: dict[str, Any]) -> None:
        self._started().commit(end)

    def stop(self) -> None:
        self._stop()


class LeasekeeperRowsReader(
    DriverHolder, SimpleDataSourceStreamReader, SupportsTriggerAvailableNow
):
    """The reader of one partition a micro-batch: each batch's rows are made when Spark
    asks for its end offset and go to Spark with its plan (PySpark's wrapper keeps
    them until the batch is committed)."""

    def initialOffset(self) -> dict[str, int]:
        return self._started().initial_offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self._started().prepare_available_now()

    def read(self, start: dict[str, Any]) -> tuple[Iterator[tuple[Any, ...]], dict[str, Any]]:
        driver = self._started()
        end: dict[str, Any] = driver.latest_offset(start)
        if end == start:
            return iter(()), start
        return iter([row for part in driver.plan(start, end) for row in part]), end

    def readBetweenOffsets(
        self, start: dict[str, Any], end: dict[str, Any]
    ) -> Iterator[tuple[Any, ...]]:
        # Only a batch not held here is read this way (a replay after a restart, on an
        # executor): as in the other reader, it has no rows; its messages come back.
        return iter(())

    def commit(self, end: dict[str, Any]) -> None:
        self._started().commit(end)


class LeasekeeperDataSource(DataSource):
    """``spark.readStream.format("leasekeeper")``: a queue as a streaming source.
    Options: see ``leasekeeper.spark.stream_options``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        StreamOptions.parse(self.options)  # a bad option fails load(), not the query
        return SCHEMA

    def streamReader(self, schema: StructType) -> LeasekeeperStreamReader:
        options = StreamOptions.parse(self.options)
        if options.partitions == 1:  # PySpark asks simpleStreamReader instead
            raise PySparkNotImplementedError(
                errorClass="NOT_IMPLEMENTED", messageParameters={"feature": "streamReader"}
            )
        return LeasekeeperStreamReader(options)

    def simpleStreamReader(self, schema: StructType) -> LeasekeeperRowsReader:
        return LeasekeeperRowsReader(StreamOptions.parse(self.options))
