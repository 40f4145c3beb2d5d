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
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
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


class LeasekeeperStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """The streaming reader; its driver-side work is ``StreamDriver``'s."""

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
        return driver

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
        driver = self._driver
        if driver is not None and driver.stop():
            driver.shutdown_threads()


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
        return LeasekeeperStreamReader(StreamOptions.parse(self.options))
