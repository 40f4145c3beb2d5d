"""Drain a queue with Spark executors, under leases, writing each outcome before deleting.

::

    from leasekeeper.spark import SQSSource, drain

    result = drain(spark, SQSSource(queue_url), handler, output="s3://bucket/drain/",
                   partitions=64)
    result.where("status = 'completed'").count()

Each Spark task builds the backend from a small picklable *source* (credentials
come from the executor's environment or the cloud SDK's usual chain, never from
the pickled spec), receives batches, leases every message with one LeaseManager
per Python worker process (reused across tasks), runs ``handler(message)`` on a
small thread pool, and then, per batch:

1. writes one row per message to ``output`` as a Parquet file (written under a
   hidden name, then renamed into place), and only then
2. deletes the messages whose handler succeeded.

So a message is deleted only after its row is durable. Steps 1 and 2 of a batch
run on a thread of their own while the task receives and handles the next batch
(a task holds at most two batches), so the output's writes and the service's
round trips overlap instead of adding up. A handler that raises has
its message released (``release_delay``, growing with the receive count through
``release_backoff``) and a ``released`` row with the error. On a FIFO queue
(``backend.fifo``) a batch's message groups run one message at a time, in order; a
message that does not end well goes back with the later ones of its group (their
rows: ``released``, "held back"), and a group's deletes are sent in order. When an executor or a
Python worker dies mid-message, its leases lapse after one short visibility
timeout and another task takes the message over. Delivery is at least once:
handlers must be idempotent. The returned DataFrame keeps one row per message id,
the completed row winning over earlier released/lost rows.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, as_completed, wait
from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import LeaseError, LeaseLost, LeaseTooShort
from leasekeeper.lease import Lease, LeaseState
from leasekeeper.manager import LeaseManager
from leasekeeper.receiving.groups import GroupKey, Groups, in_waves, is_ordered
from leasekeeper.spark.sources import Source, as_source, build_backend

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger("leasekeeper.spark")

Handler = Callable[[Message], Any]
Renewer = Literal["auto", "process", "thread"]

COLUMNS = (
    "id",
    "status",
    "receive_count",
    "attempts",
    "started_at",
    "duration_s",
    "extensions",
    "error",
    "output",
)

# ---------------------------------------------------------------------- executor side

# One backend and LeaseManager per (source, config) per Python worker process,
# reused by every task that process runs. Guarded by _process_lock.
_process_lock = threading.Lock()
_process_state: dict[tuple[Any, LeaseConfig, str], tuple[Backend, LeaseManager]] = {}


def _forget_after_fork() -> None:
    # A forked worker inherits the dict but not the scheduler threads behind it.
    global _process_lock  # noqa: PLW0603 - a lock a dead parent thread may hold
    _process_lock = threading.Lock()
    _process_state.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)


def _process_manager(
    source: Source, config: LeaseConfig, renewer: Renewer
) -> tuple[Backend, LeaseManager]:
    key = (source, config, renewer)
    with _process_lock:
        found = _process_state.get(key)
        if found is None or found[1].closed:
            for idle in [k for k, (_, m) in _process_state.items() if not m.leases()]:
                _process_state.pop(idle)[1].close()  # earlier drains' idle managers
            backend = build_backend(source)
            found = (backend, LeaseManager(backend, config, renewer=renewer))
            _process_state[key] = found
        return found


@dataclass(frozen=True)
class _TaskSpec:
    run_id: str
    source: Any
    handler: Handler
    output: str
    config: LeaseConfig
    batch_size: int
    concurrency: int
    idle_seconds: float
    quota: int | None  # messages this task may take (max_messages split across tasks)
    renewer: Renewer


@dataclass
class _TaskTally:
    task: int
    attempt: int
    taken: int = 0
    completed: int = 0
    released: int = 0
    lost: int = 0
    abandoned: int = 0
    seconds: float = 0.0
    statuses: dict[str, int] = field(default_factory=dict)


def _row(
    *,
    spec: _TaskSpec,
    lease: Lease,
    status: str,
    started: float,
    duration: float,
    error: str | None,
    output: str | None,
    task: int,
    attempt: int,
) -> dict[str, Any]:
    message = lease.message
    return {
        "run_id": spec.run_id,
        "task": task,
        "task_attempt": attempt,
        "id": message.id,
        "status": status,
        "receive_count": message.receive_count,
        "started_at": started,
        "duration_s": duration,
        "extensions": lease.extensions,
        "error": error,
        "output": output,
    }


def _run_handler(
    spec: _TaskSpec, lease: Lease, task: int, attempt: int, release: bool = True
) -> tuple[dict[str, Any], bool]:
    """Run the handler for one leased message. Returns its row and whether to delete.
    ``release``: release it if the handler raises (else its caller does)."""
    started = time.time()
    t0 = time.monotonic()
    error: str | None = None
    output: str | None = None
    status = "completed"
    try:
        result = spec.handler(lease.message)
        try:
            output = json.dumps(result)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"handler output is not JSON-serialisable: {exc}") from exc
    except Exception as exc:
        status = "released"
        error = f"{type(exc).__name__}: {exc}"
        try:
            if release:
                lease.release()
        except LeaseError as release_error:
            log.warning("release of message %r failed: %s", lease.id, release_error)
    duration = time.monotonic() - t0
    if status == "completed" and lease.is_lost:
        status = "abandoned" if lease.state is LeaseState.ABANDONED else "lost"
        error = lease.reason
    if lease.state is LeaseState.LOST and status == "released":
        status, error = "lost", lease.reason
    row = _row(
        spec=spec,
        lease=lease,
        status=status,
        started=started,
        duration=duration,
        error=error,
        output=output,
        task=task,
        attempt=attempt,
    )
    return row, status == "completed" or (status == "abandoned" and lease.visible_for() > 0)


def _handle_batch(
    spec: _TaskSpec,
    manager: LeaseManager,
    pool: ThreadPoolExecutor,
    leases: list[Lease],
    *,
    ordered: bool,
    task: int,
    attempt: int,
) -> list[tuple[dict[str, Any], bool]]:
    """The handler run on a batch's leases on ``pool``: each one's row and whether to
    delete it, in order. On a FIFO queue a group one at a time, in order (``Groups``),
    groups in parallel; one that does not end well is released with the later ones of
    its group in one call, and those get a ``released`` row, unhandled (held back)."""
    groups: Groups[int] = Groups()
    results: dict[int, tuple[dict[str, Any], bool]] = {}

    def key(index: int) -> GroupKey | None:
        group = leases[index].message.group
        return None if group is None or not ordered else ("", group)

    def start(index: int) -> Future[tuple[dict[str, Any], bool]]:
        # A FIFO group's failed message goes back with the rest of its group (below).
        return pool.submit(_run_handler, spec, leases[index], task, attempt, key(index) is None)

    running = {start(i): i for i in range(len(leases)) if groups.add(key(i), i)}
    while running:
        finished, _ = wait(running, return_when=FIRST_COMPLETED)
        for future in finished:
            index = running.pop(future)
            row, delete = results[index] = future.result()
            if key(index) is None:
                continue
            if delete:  # ended well: the group's next
                following = groups.done(key(index))
                if following is not None:
                    running[start(following)] = following
                continue
            rest = groups.drop(key(index))
            for later in rest:
                results[later] = (_held_back_row(spec, leases[later], row, task, attempt), False)
            _hold_back(manager, leases[index], row, [leases[later] for later in rest])
    return [results[index] for index in range(len(leases))]


def _hold_back(manager: LeaseManager, lease: Lease, row: dict[str, Any], rest: list[Lease]) -> None:
    """``lease`` of a FIFO group did not end well (``row``): release the later ``rest`` with
    it, in one call - after the failure policy's delay if it failed, else at once."""
    failed = row["status"] == "released" and lease.state is LeaseState.ACTIVE
    leases = [lease, *rest] if failed else rest
    if not leases:
        return
    delay = manager.failures.delay_for(lease, None) if failed else 0.0
    errors = manager.release_many(leases, delay)
    if failed and errors[0] is not None:
        log.warning("release of message %r failed: %s", lease.id, errors[0])
        if lease.state is LeaseState.LOST:
            row["status"], row["error"] = "lost", lease.reason


def _held_back_row(
    spec: _TaskSpec, lease: Lease, before: dict[str, Any], task: int, attempt: int
) -> dict[str, Any]:
    """The row of a message released unhandled behind ``before`` (its group's)."""
    return _row(
        spec=spec,
        lease=lease,
        status="released",
        started=time.time(),
        duration=0.0,
        error=f"held back: message {before['id']} before it in its group was {before['status']}",
        output=None,
        task=task,
        attempt=attempt,
    )


def _write_rows(output: str, name: str, rows: list[dict[str, Any]]) -> None:
    """Write rows as one Parquet file, atomically: hidden name first, then rename."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyarrow import fs as pafs

    schema = pa.schema(
        [
            ("run_id", pa.string()),
            ("task", pa.int32()),
            ("task_attempt", pa.int32()),
            ("id", pa.string()),
            ("status", pa.string()),
            ("receive_count", pa.int64()),
            ("started_at", pa.timestamp("us", tz="UTC")),
            ("duration_s", pa.float64()),
            ("extensions", pa.int64()),
            ("error", pa.string()),
            ("output", pa.string()),
        ]
    )
    columns = {f.name: [row[f.name] for row in rows] for f in schema}
    columns["started_at"] = [int(t * 1_000_000) for t in columns["started_at"]]
    table = pa.Table.from_pydict(columns, schema=schema)
    filesystem, root = pafs.FileSystem.from_uri(output)
    filesystem.create_dir(root, recursive=True)
    hidden = f"{root}/.{name}.tmp"  # Spark's reader ignores dot files
    pq.write_table(table, hidden, filesystem=filesystem)
    filesystem.move(hidden, f"{root}/{name}")


def _finish(
    spec: _TaskSpec,
    manager: LeaseManager,
    name: str,
    leases: list[Lease],
    results: list[tuple[dict[str, Any], bool]],
) -> dict[str, int]:
    """One handled batch: its rows written (durable), and only then the deletes of the
    messages whose handler succeeded, in batch calls. Returns the statuses' counts."""
    rows = [row for row, _ in results]
    if rows:
        _write_rows(spec.output, name, rows)
    done = [lease for lease, (_, delete) in zip(leases, results, strict=True) if delete]
    # A FIFO group's deletes in order: one wave a position in the group, and a group
    # whose delete failed has its later messages released, not deleted.
    failed_groups: set[str] = set()
    held_back: list[Lease] = []
    by_group = attrgetter("message.group")
    for wave in in_waves(done, by_group) if is_ordered(manager.backend) else [done]:
        held_back += [lease for lease in wave if lease.message.group in failed_groups]
        sent = [lease for lease in wave if lease.message.group not in failed_groups]
        for lease, error in zip(sent, manager.complete_many(sent) if sent else [], strict=True):
            if error is None:
                continue
            if lease.message.group is not None:
                failed_groups.add(lease.message.group)
            if isinstance(error, LeaseLost):
                # The row says completed; another task may redo the message and
                # write its own completed row, which the result deduplicates.
                log.warning("delete after a written row failed: %s", error)
            else:
                log.warning("delete failed (the message will reappear): %s", error)
    if held_back:  # done, but behind a message of their group that is not gone: again
        manager.release_many(held_back, 0.0)
    statuses: dict[str, int] = {}
    for row in rows:
        statuses[row["status"]] = statuses.get(row["status"], 0) + 1
    return statuses


def _run_task(spec: _TaskSpec, task: int) -> dict[str, Any]:
    """One Spark task: receive, lease, handle, write, delete, until idle or quota.

    A batch's rows are written and its messages deleted on a thread of their own
    while the next batch is received and handled, so a task holds at most two
    batches: the service's round trips and the output's writes overlap."""
    from pyspark import TaskContext

    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    backend, manager = _process_manager(spec.source, spec.config, spec.renewer)
    manager.start()  # a renewer process renews before the first receive
    ordered = is_ordered(backend)  # a FIFO queue: each message group in order
    tally = _TaskTally(task, attempt)
    begun = time.monotonic()
    idle_since = begun
    batch_no = 0
    poll = min(spec.idle_seconds, 1.0)
    held: list[Lease] = []  # leases of batches not finished yet
    finishing: Future[dict[str, int]] | None = None

    def settle() -> None:
        # Wait for the batch being finished; add up its statuses.
        nonlocal finishing
        if finishing is not None:
            for status, count in finishing.result().items():
                tally.statuses[status] = tally.statuses.get(status, 0) + count
            finishing = None

    with (
        ThreadPoolExecutor(spec.concurrency, thread_name_prefix="leasekeeper-drain") as pool,
        ThreadPoolExecutor(1, thread_name_prefix="leasekeeper-drain-finish") as finisher,
    ):
        try:
            while spec.quota is None or tally.taken < spec.quota:
                want = min(spec.batch_size, getattr(backend, "max_receive", spec.batch_size))
                if spec.quota is not None:
                    want = min(want, spec.quota - tally.taken)
                messages = backend.receive(
                    max_messages=want,
                    wait_seconds=poll,
                    visibility_timeout=spec.config.visibility_timeout,
                )
                if not messages:
                    if time.monotonic() - idle_since >= spec.idle_seconds:
                        break
                    continue
                idle_since = time.monotonic()
                tally.taken += len(messages)
                leases = []
                for message in messages:
                    try:
                        leases.append(manager.register(message))
                    except LeaseTooShort as exc:
                        log.warning("%s; left for another task", exc)
                held = [*held, *leases]  # a new list: the one being finished is its own
                results = _handle_batch(
                    spec, manager, pool, leases, ordered=ordered, task=task, attempt=attempt
                )
                settle()  # one batch finishing at a time: a task holds at most two
                held = list(leases)
                name = f"part-{spec.run_id}-{task:05d}-{attempt}-{batch_no:06d}.parquet"
                batch_no += 1
                finishing = finisher.submit(_finish, spec, manager, name, leases, results)
            settle()
            held = []
        finally:
            # A task that fails (its output cannot be written, the service refuses...)
            # lets the batch being finished end, then hands back what it still holds
            # rather than leave the process's manager renewing it.
            if finishing is not None:
                with contextlib.suppress(Exception):
                    finishing.result()
            unfinished = [lease for lease in held if lease.state is LeaseState.ACTIVE]
            if unfinished:
                manager.release_many(unfinished, 0)
    tally.completed = tally.statuses.get("completed", 0)
    tally.released = tally.statuses.get("released", 0)
    tally.lost = tally.statuses.get("lost", 0)
    tally.abandoned = tally.statuses.get("abandoned", 0)
    tally.seconds = time.monotonic() - begun
    return {k: v for k, v in tally.__dict__.items() if k != "statuses"}


# ---------------------------------------------------------------------- driver side


@dataclass(frozen=True)
class DrainReport:
    """Totals of one drain, from the deduplicated result."""

    run_id: str
    completed: int
    released: int
    lost: int
    abandoned: int
    tasks: int
    seconds: float

    @property
    def throughput(self) -> float:
        """Completed messages per second of wall time."""
        return self.completed / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class DrainResult:
    frame: DataFrame
    report: DrainReport


def check_drain_args(
    partitions: int,
    batch_size: int,
    concurrency: int,
    idle_seconds: float,
    max_messages: int | None,
    *,
    renewer: object = "auto",
) -> None:
    if renewer not in ("auto", "process", "thread"):
        raise ValueError(f"renewer must be 'auto', 'process' or 'thread', got {renewer!r}")
    for name, value in (
        ("partitions", partitions),
        ("batch_size", batch_size),
        ("concurrency", concurrency),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    if not (
        isinstance(idle_seconds, (int, float)) and math.isfinite(idle_seconds) and idle_seconds > 0
    ):
        raise ValueError(f"idle_seconds must be a finite number > 0, got {idle_seconds!r}")
    if max_messages is not None and (
        isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1
    ):
        raise ValueError(f"max_messages must be None or an integer >= 1, got {max_messages!r}")


def run_drain(
    spark: SparkSession,
    source: Source | str | None = None,
    handler: Handler | None = None,
    *,
    output: str,
    queue: str | None = None,
    partitions: int | None = None,
    config: LeaseConfig | None = None,
    batch_size: int = 10,
    concurrency: int | None = None,
    idle_seconds: float = 5.0,
    max_messages: int | None = None,
    renewer: Renewer = "auto",
) -> DrainResult:
    """``drain`` that also returns the totals (see ``drain``)."""
    source = as_source(source, queue)
    if not callable(handler):
        raise TypeError(f"handler must be callable, got {type(handler).__name__}")
    if not callable(getattr(source, "build", None)):
        raise TypeError(f"source must be SQSSource, MNSSource or AzureQueueSource, got {source!r}")
    sc = spark.sparkContext
    partitions = partitions if partitions is not None else sc.defaultParallelism
    concurrency = concurrency if concurrency is not None else batch_size
    check_drain_args(
        partitions, batch_size, concurrency, idle_seconds, max_messages, renewer=renewer
    )
    if config is None:
        # Failed messages wait out at least one idle period, so a drain does not spin
        # on a poison message; each further failure doubles the wait.
        config = LeaseConfig(release_delay=max(10.0, 2 * idle_seconds), release_backoff=2.0)
    run_id = uuid.uuid4().hex[:12]
    quotas: list[int | None] = [None] * partitions
    if max_messages is not None:
        share, extra = divmod(max_messages, partitions)
        quotas = [share + (1 if i < extra else 0) for i in range(partitions)]
    specs = [
        _TaskSpec(
            run_id,
            source,
            handler,
            output,
            config,
            batch_size,
            concurrency,
            float(idle_seconds),
            quota,
            renewer,
        )
        for quota in quotas
    ]
    log.info("drain %s: %d task(s) on %r, output %s", run_id, partitions, source, output)
    begun = time.monotonic()
    rdd = sc.parallelize(range(partitions), partitions)

    def task_of(index: int, _items: Iterable[int]) -> Iterable[dict[str, Any]]:
        return [_run_task(specs[index], index)]

    jobs = rdd.mapPartitionsWithIndex(task_of)
    tallies: list[dict[str, Any]] = []
    # One Spark job per task, from driver threads, so each task's counts are logged
    # as it finishes rather than all at the end.
    with ThreadPoolExecutor(partitions, thread_name_prefix="leasekeeper-drain-driver") as pool:
        futures = [pool.submit(sc.runJob, jobs, list, [i]) for i in range(partitions)]
        for future in as_completed(futures):
            for tally in future.result():
                tallies.append(tally)
                log.info(
                    "drain %s: task %d (attempt %d) took %d: %d completed, %d released, "
                    "%d lost, %d abandoned in %.1fs",
                    run_id,
                    tally["task"],
                    tally["attempt"],
                    tally["taken"],
                    tally["completed"],
                    tally["released"],
                    tally["lost"],
                    tally["abandoned"],
                    tally["seconds"],
                )
    frame = _result_frame(spark, output, run_id)
    counts = {
        row["status"]: row["n"]
        for row in frame.groupBy("status").count().withColumnRenamed("count", "n").collect()
    }
    report = DrainReport(
        run_id=run_id,
        completed=counts.get("completed", 0),
        released=counts.get("released", 0),
        lost=counts.get("lost", 0),
        abandoned=counts.get("abandoned", 0),
        tasks=len(tallies),
        seconds=time.monotonic() - begun,
    )
    log.info(
        "drain %s done: %d completed, %d released, %d lost, %d abandoned in %.1fs (%.1f/s)",
        run_id,
        report.completed,
        report.released,
        report.lost,
        report.abandoned,
        report.seconds,
        report.throughput,
    )
    return DrainResult(frame, report)


def drain(
    spark: SparkSession,
    source: Source | str | None = None,
    handler: Handler | None = None,
    *,
    output: str,
    queue: str | None = None,
    partitions: int | None = None,
    config: LeaseConfig | None = None,
    batch_size: int = 10,
    concurrency: int | None = None,
    idle_seconds: float = 5.0,
    max_messages: int | None = None,
    renewer: Renewer = "auto",
) -> DataFrame:
    """Drain the queue ``queue=URL`` names (any URL ``leasekeeper.connect`` takes),
    or ``source`` (``backend.spec()``, ``SQSSource``...), with ``partitions`` Spark
    tasks running ``handler(message)``.

    ``handler``'s return value must be JSON-serialisable (stored as a string
    column). Each task stops when the queue has been empty for ``idle_seconds``,
    or when it has taken its share of ``max_messages``. ``concurrency`` handler
    threads run per task (default: ``batch_size``). ``config`` is the LeaseConfig
    of the executors' managers; by default failed messages are released for
    ``max(10, 2 * idle_seconds)`` seconds, doubling per receive.

    On a FIFO queue each message group's order is kept: see docs/guide.md,
    "Ordered (FIFO) queues".

    ``renewer="auto"`` (the default) renews from a process beside each Python worker
    where one can run (else a thread, one warning): a GIL-bound handler or a busy
    worker starves no renewal, and a killed worker's messages go back at once;
    ``"process"`` insists, ``"thread"`` renews in the worker (docs/spark.md).

    Returns a DataFrame read from ``output`` with one row per message id of this
    run: id, status (completed / released / lost / abandoned), receive_count,
    attempts (rows this run wrote for the id), started_at, duration_s,
    extensions, error, output.
    """
    return run_drain(
        spark,
        source,
        handler,
        output=output,
        queue=queue,
        partitions=partitions,
        config=config,
        batch_size=batch_size,
        concurrency=concurrency,
        idle_seconds=idle_seconds,
        max_messages=max_messages,
        renewer=renewer,
    ).frame


def _result_frame(spark: SparkSession, output: str, run_id: str) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    from pyspark.sql.types import (
        DoubleType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    try:
        rows = spark.read.parquet(output).where(F.col("run_id") == run_id)
    except Exception as exc:  # nothing was written: an empty queue
        if "PATH_NOT_FOUND" not in str(exc) and "UNABLE_TO_INFER_SCHEMA" not in str(exc):
            raise
        schema = StructType(
            [
                StructField("id", StringType()),
                StructField("status", StringType()),
                StructField("receive_count", LongType()),
                StructField("attempts", LongType()),
                StructField("started_at", TimestampType()),
                StructField("duration_s", DoubleType()),
                StructField("extensions", LongType()),
                StructField("error", StringType()),
                StructField("output", StringType()),
            ]
        )
        return spark.createDataFrame([], schema)
    by_id = Window.partitionBy("id")
    best_first = by_id.orderBy((F.col("status") == "completed").desc(), F.col("started_at").desc())
    return (
        rows.withColumn("attempts", F.count(F.lit(1)).over(by_id))
        .withColumn("_rank", F.row_number().over(best_first))
        .where(F.col("_rank") == 1)
        .select(*COLUMNS)
    )
