"""Measure 12: ``drain`` and ``read_stream`` on a Spark standalone cluster.

One run starts moto's server with a journal of every request it answers (when it
came, when it was answered, its action: ``benchmarks/moto_journal.py``) and a
standalone cluster of two workers with 2 cores each, from PySpark's own launcher
(tests/spark/cluster.py). Two applications run on it in turn: one with a single
executor (one worker's worth of cores) and one with an executor on each worker.
Each first warms its executors' Python workers with a small drain and query.

Rates come from the journal (``work``): throughput is messages over the time
from a run's first receive to its last delete, the work itself; the steady rate
is what a run sustains while it receives (up to its last receive, plus the
service's time for the deletes it still owed then). What comes before the first
receive (Spark jobs and Python workers starting, the reader's process) is
reported apart as start-up, and what comes after the last delete (drain's idle
wait, the stream's last empty batch, reading the result) as the end.

- **Scaling**: the same backlog of I/O-bound work with one worker and with two.
  ``drain``: handlers that wait ``JOB_SECONDS`` each (a call to another
  service), partitions = the application's cores. ``read_stream``: a UDF that
  waits ``ROW_SECONDS`` a row, partitions = cores, ``Trigger.AvailableNow``.
  moto serves one request at a time (and its ReceiveMessage grows slower with
  the queue's depth), so the work is chosen to make the executors, not the
  queue service, the limit.
- **Against the bare loop**: a boto3 loop that receives 10 and deletes them in
  one batch call, on the same server, with the same backlog, run right before
  each; steady rates compared. ``drain`` with one partition and a handler that does nothing (one
  partition: partitions share moto's one request at a time); ``read_stream``
  with its default batch settings and one receive at a time, a sink of its rows.
  SQS calls per message: every request moto answered during the run.

Targets: 2 workers >= 1.7x one worker; >= 90 % of the bare loop; <= 0.25 SQS
calls a message.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchmarks.bench_stream import depth, fill
from benchmarks.common import (
    MOTO_ENV,
    REPO_ROOT,
    BenchResult,
    Context,
    Row,
    fmt,
    fmt_ratio,
    ratio,
    sqs_client,
)
from benchmarks.moto_journal import Request, journaled_moto, mark, read
from leasekeeper import LeaseConfig, Message

NAME = "cluster"
TITLE = "12. Spark on a standalone cluster: scaling, and each partition against a bare loop"
WORKERS = 2
CORES = 2  # per worker, and per executor
JOB_SECONDS = 4.0  # the drain scaling run's handler: an I/O-bound job
ROW_SECONDS = 0.5  # the stream scaling run's UDF, per row
STREAM_BATCH = 50  # max_messages_per_batch against the bare loop (see run)
SCALED_BATCH = 40  # max_messages_per_batch of the stream scaling runs
SCALING_TARGET = 1.7
BARE_TARGET = 0.9
CALLS_TARGET = 0.25
CONFIG = LeaseConfig(visibility_timeout=60, release_delay=60)


# ---------------------------------------------------------------------- handlers


def nothing(message: Message) -> None:
    return None


def job(message: Message) -> None:
    """An I/O-bound job: waits JOB_SECONDS (a call to another service)."""
    time.sleep(JOB_SECONDS)


def row_job(body: str) -> float:
    """The stream's I/O-bound UDF: waits ROW_SECONDS."""
    time.sleep(ROW_SECONDS)
    return time.time()


# ---------------------------------------------------------------------- the queue side


def work(requests: list[Request], count: int) -> dict[str, Any]:
    """A run's calls, from the journal, by action, and two rates.

    ``rate``: ``count`` messages over the time from the run's first receive to its
    last delete: the whole of the work, start-up left out.

    ``steady``: what the run sustains while it receives, its pipeline full. The
    messages it received, over the time from its first receive to its last, plus
    the service's time for the deletes it still owed at that last receive (what a
    reader that deletes a batch or two later than it receives - as a stream does,
    at the sink's commit - would have spent on them had more messages come). The
    owed deletes are timed at the run's own mean time per deleted message.
    """
    actions = Counter(r.action for r in requests)
    receives = [r for r in requests if r.action == "ReceiveMessage" and r.messages]
    deletes = [r for r in requests if r.action.startswith("DeleteMessage")]
    first = min(r.began for r in receives)
    last_receive = max(r.ended for r in receives)
    last_delete = max(r.ended for r in deletes)
    received = sum(r.messages for r in receives)
    deleted = sum(r.messages for r in deletes)
    owed = received - sum(r.messages for r in deletes if r.ended <= last_receive)
    per_delete = sum(r.ended - r.began for r in deletes) / max(1, deleted)
    window = last_receive - first + owed * per_delete
    calls = sum(actions.values())
    # How much of the run the server spent answering it (overlapping requests once).
    busy, until = 0.0, first
    for r in sorted(receives + deletes, key=lambda r: r.began):
        busy += max(0.0, r.ended - max(r.began, until))
        until = max(until, r.ended)
    return {
        "first_receive": first,
        "last_receive": last_receive,
        "last_delete": last_delete,
        "rate": count / (last_delete - first) if last_delete > first else None,
        "steady": received / window if window > 0 else None,
        "received": received,
        "deleted": deleted,
        "owed_at_last_receive": owed,
        "service_busy": busy / (last_delete - first) if last_delete > first else None,
        "receive_seconds": sum(r.ended - r.began for r in receives) / len(receives),
        "calls": calls,
        "calls_per_message": calls / count,
        "actions": dict(actions),
    }


def queue(client: Any, name: str, count: int) -> str:
    url: str = client.create_queue(
        QueueName=name, Attributes={"VisibilityTimeout": str(int(CONFIG.visibility_timeout))}
    )["QueueUrl"]
    fill(client, url, count)
    return url


def bare_loop(client: Any, count: int, journal: Path) -> dict[str, Any]:
    """boto3 alone: receive 10, delete them in one batch call, until the queue is empty."""
    url = queue(client, f"bare-{time.monotonic_ns()}", count)
    begin = mark(journal)
    got = 0
    while True:
        # The very request leasekeeper's SQS backend sends (moto's ReceiveMessage
        # costs more when it is asked for the attributes).
        messages = client.receive_message(
            QueueUrl=url,
            MaxNumberOfMessages=10,
            WaitTimeSeconds=0,
            VisibilityTimeout=int(CONFIG.visibility_timeout),
            MessageSystemAttributeNames=["All"],
            MessageAttributeNames=["All"],
        ).get("Messages", [])
        if not messages:
            break
        got += len(messages)
        client.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )
    figures = work(read(journal, begin), count)
    figures.update(messages=count, completed=got, left=depth(client, url))
    return figures


# ---------------------------------------------------------------------- the cluster side


@contextmanager
def cluster(root: Path) -> Iterator[Any]:
    from tests.spark.cluster import StandaloneCluster

    running = StandaloneCluster(root, workers=WORKERS, cores=CORES, memory="2g").start()
    try:
        yield running
    finally:
        running.stop()


@contextmanager
def application(running: Any, executors: int) -> Iterator[Any]:
    """A SparkSession on ``running`` with ``executors`` executors of CORES cores."""
    from pyspark.sql import SparkSession
    from tests import toolchain
    from tests.spark.cluster import application_conf, wait_until

    home = toolchain.java_home()
    if home is not None:
        os.environ["JAVA_HOME"] = str(home)
    os.environ.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", **MOTO_ENV)
    conf = application_conf(
        app_name=f"leasekeeper-bench-{executors}",
        executor_cores=CORES,
        executors=executors,
        # The handlers below are this module's: executors import it by name.
        executor_env={**MOTO_ENV, "PYTHONPATH": str(REPO_ROOT)},
    )
    builder = SparkSession.builder.master(running.master_url)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        tracker = spark.sparkContext._jsc.sc().statusTracker()
        wait_until(
            lambda: len(tracker.getExecutorInfos()) - 1 >= executors,
            300,
            f"{executors} executor(s)",
            running.logs,
        )
        yield spark
    finally:
        spark.stop()


def source(url: str, endpoint: str) -> Any:
    from leasekeeper.spark import SQSSource

    return SQSSource(url, region="us-east-1", endpoint_url=endpoint)


def time_drain(
    spark: Any,
    client: Any,
    endpoint: str,
    journal: Path,
    where: Path,
    *,
    count: int,
    partitions: int,
    handler: Any,
) -> dict[str, Any]:
    from leasekeeper.spark import run_drain

    url = queue(client, f"drain-{time.monotonic_ns()}", count)
    output = where / f"drain-{time.monotonic_ns()}"
    begin = mark(journal)
    called = time.time()
    result = run_drain(
        spark,
        source(url, endpoint),
        handler,
        output=str(output),
        partitions=partitions,
        config=CONFIG,
        batch_size=10,
        idle_seconds=2,
    )
    ended = time.time()
    figures = work(read(journal, begin), count)
    figures.update(
        messages=count,
        completed=result.report.completed,
        left=depth(client, url),
        seconds=ended - called,
        start_up=figures["first_receive"] - called,
        end=ended - figures["last_delete"],
    )
    rows = spark.read.parquet(str(output)).select("task", "started_at").collect()
    per_task: dict[int, list[float]] = {}
    for row in rows:
        per_task.setdefault(row["task"], []).append(row["started_at"].timestamp())
    figures["per_partition"] = sorted(len(times) for times in per_task.values())
    return figures


def time_stream(
    spark: Any,
    client: Any,
    endpoint: str,
    journal: Path,
    where: Path,
    *,
    count: int,
    partitions: int,
    slow: bool,
    per_batch: int | None = None,
    prefetch: int | None = None,
) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from leasekeeper.spark import read_stream

    url = queue(client, f"stream-{time.monotonic_ns()}", count)
    out = where / f"stream-{time.monotonic_ns()}"
    options: dict[str, Any] = {} if per_batch is None else {"max_messages_per_batch": per_batch}
    frame = read_stream(
        spark,
        source(url, endpoint),
        config=CONFIG,
        partitions=partitions,
        receive_concurrency=1,  # moto's ReceiveMessage takes no lock: one at a time
        prefetch=prefetch,
        **options,
    )
    columns = ["id", "received_at"]
    if slow:  # a column of the sink: a UDF whose result nothing uses is never run
        frame = frame.withColumn("handled", F.udf(row_job, "double")("body"))
        columns.append("handled")
    begin = mark(journal)
    called = time.time()
    query = (
        frame.select(*columns)
        .writeStream.format("parquet")
        .option("checkpointLocation", str(out / "_checkpoint"))
        .trigger(availableNow=True)
        .start(str(out / "sink"))
    )
    query.awaitTermination()
    ended = time.time()
    figures = work(read(journal, begin), count)
    rows = spark.read.parquet(str(out / "sink")).select("id").collect()
    figures.update(
        messages=count,
        completed=len({row["id"] for row in rows}),
        rows=len(rows),
        left=depth(client, url),
        seconds=ended - called,
        start_up=figures["first_receive"] - called,
        end=ended - figures["last_delete"],
        batches=sum(1 for p in query.recentProgress if p["numInputRows"]),
    )
    return figures


def warm_up(
    spark: Any, client: Any, endpoint: str, journal: Path, where: Path, *, cores: int
) -> None:
    """The executors' Python workers start (imports) before anything is timed."""
    time_drain(spark, client, endpoint, journal, where, count=20, partitions=cores, handler=nothing)
    time_stream(
        spark, client, endpoint, journal, where, count=20, partitions=cores, slow=True, per_batch=10
    )


# ---------------------------------------------------------------------- the reader alone

RECEIVE_SECONDS = 0.02  # the modelled service's round trip per receive
SPARK_BATCH_SECONDS = 0.2  # what Spark takes to plan, run and commit a batch, modelled


def reader_alone(count: int, prefetch: int | None) -> dict[str, Any]:
    """read_stream's driver side with Spark modelled: a StreamDriver on a MemoryQueue
    whose receives take RECEIVE_SECONDS (one at a time; other calls are free), and a
    loop that takes a batch, waits SPARK_BATCH_SECONDS as Spark would run it, and
    commits it. What receiving ahead does for a service whose cost does not depend
    on how many messages are in flight (SQS's does not; moto's does)."""
    from leasekeeper.backends.base import ForwardingBackend
    from leasekeeper.backends.memory import MemoryQueue
    from leasekeeper.spark import SQSSource
    from leasekeeper.spark.stream_driver import StreamDriver
    from leasekeeper.spark.stream_options import StreamOptions

    class RoundTrips(ForwardingBackend):
        def receive(
            self, max_messages: int = 1, wait_seconds: float = 0.0, visibility_timeout: Any = None
        ) -> list[Message]:
            time.sleep(RECEIVE_SECONDS)
            return super().receive(max_messages, 0.0, visibility_timeout)

    queue = MemoryQueue(60)
    queue.send_many([f"job-{n}" for n in range(count)])
    options = StreamOptions(
        source=SQSSource("https://sqs.us-east-1.amazonaws.com/1/modelled"),
        config=CONFIG,
        max_messages_per_batch=STREAM_BATCH,
        receive_concurrency=1,
        poll_seconds=0.0,
        prefetch=prefetch,
    )
    driver = StreamDriver(options, backend=RoundTrips(queue))
    driver.prepare_available_now()  # ends when the backlog is done
    begun = time.monotonic()
    start: Any = {"batch": 0}
    batches = 0
    try:
        while True:
            end = driver.latest_offset(start)
            if end == start:
                break
            driver.plan(start, end)
            time.sleep(SPARK_BATCH_SECONDS)  # Spark runs the batch; the sink commits it
            driver.commit(end)
            start, batches = end, batches + 1
        seconds = time.monotonic() - begun
    finally:
        driver.stop()
        driver.shutdown_threads()
    return {"rate": count / seconds, "batches": batches, "left": len(queue)}


# ---------------------------------------------------------------------- the measure


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    backlog = ctx.pick(200, 400)  # against the bare loop
    scaled = ctx.pick(120, 200)  # the scaling runs
    rounds = ctx.pick(1, 2)  # against the bare loop: the best of each, as this machine is shared
    where = Path(tempfile.mkdtemp(prefix="leasekeeper-bench-cluster-"))
    figures: dict[str, Any] = {"backlog": backlog, "scaled": scaled, "rounds": rounds}
    journal = where / "moto-journal.txt"
    with journaled_moto(journal) as endpoint, cluster(where / "cluster") as running:
        client = sqs_client(endpoint)

        def drain(count: int, partitions: int, handler: Any) -> dict[str, Any]:
            return time_drain(
                spark,
                client,
                endpoint,
                journal,
                where,
                count=count,
                partitions=partitions,
                handler=handler,
            )

        def stream(count: int, partitions: int, **options: Any) -> dict[str, Any]:
            return time_stream(
                spark,
                client,
                endpoint,
                journal,
                where,
                count=count,
                partitions=partitions,
                **options,
            )

        for executors in (1, WORKERS):
            cores = CORES * executors
            with application(running, executors) as spark:
                warm_up(spark, client, endpoint, journal, where, cores=cores)
                if executors == 1:
                    runs: dict[str, list[dict[str, Any]]] = {}
                    for _ in range(rounds):  # interleaved, so that a slow spell hits both
                        runs.setdefault("bare_drain", []).append(
                            bare_loop(client, backlog, journal)
                        )
                        runs.setdefault("drain_one_partition", []).append(
                            drain(backlog, 1, nothing)
                        )
                        runs.setdefault("bare_stream", []).append(
                            bare_loop(client, backlog, journal)
                        )
                        runs.setdefault("stream_one_receiver", []).append(
                            stream(backlog, cores, slow=False, per_batch=STREAM_BATCH)
                        )
                        # The same, receiving only when Spark asks for a batch.
                        runs.setdefault("stream_not_ahead", []).append(
                            stream(backlog, cores, slow=False, per_batch=STREAM_BATCH, prefetch=0)
                        )
                    for name, tries in runs.items():
                        figures[name] = max(tries, key=lambda r: r["steady"] or 0.0)
                        figures[name]["steady_of_rounds"] = [r["steady"] for r in tries]
                figures[f"drain_{executors}"] = drain(scaled, cores, job)
                figures[f"stream_{executors}"] = stream(
                    scaled, cores, slow=True, per_batch=SCALED_BATCH
                )
    for name, prefetch in (("reader_ahead", None), ("reader_not_ahead", 0)):
        figures[name] = reader_alone(ctx.pick(500, 1000), prefetch)
    result.figures = figures
    _rows(result, figures)
    return result


def _complete(*runs: dict[str, Any]) -> str:
    missing = [
        {k: r[k] for k in ("messages", "completed", "left")}
        for r in runs
        if r["completed"] != r["messages"] or r["left"] != 0
    ]
    return f"incomplete: {missing}" if missing else ""


def _apart(one: dict[str, Any], two: dict[str, Any] | None = None) -> str:
    runs = [one] if two is None else [one, two]
    return (
        "start-up "
        + " / ".join(fmt(r["start_up"], "s") for r in runs)
        + (", end " + " / ".join(fmt(r["end"], "s") for r in runs))
    )


def _rows(result: BenchResult, f: dict[str, Any]) -> None:
    for name, what in (
        ("drain", f"{f['scaled']} jobs of {JOB_SECONDS:g} s (I/O-bound)"),
        ("stream", f"{f['scaled']} messages, a UDF of {ROW_SECONDS:g} s a row (I/O-bound)"),
    ):
        one, two = f[f"{name}_1"], f[f"{name}_{WORKERS}"]
        scale = ratio(two["rate"], one["rate"])
        label = "drain" if name == "drain" else "read_stream"
        result.rows.append(
            Row(
                measure=(
                    f"{label} throughput, 1 vs {WORKERS} workers ({CORES} cores each), {what}, moto"
                ),
                leasekeeper=f"{WORKERS} workers: {fmt(two['rate'], 'msg/s')}",
                baselines=f"1 worker: {fmt(one['rate'], 'msg/s')}",
                ratio=fmt_ratio(scale, f"{WORKERS} workers / 1"),
                target=f">= {SCALING_TARGET}x",
                met=scale is not None and scale >= SCALING_TARGET,
                note=_complete(one, two) or _apart(one, two),
            )
        )
    for name, run_figures, bare, what in (
        ("drain, one partition", f["drain_one_partition"], f["bare_drain"], "no-op handler"),
        (
            "read_stream, one receiver",
            f["stream_one_receiver"],
            f["bare_stream"],
            f"batches of up to {STREAM_BATCH} ({f['stream_one_receiver']['batches']} batches), "
            "Trigger.AvailableNow",
        ),
    ):
        share = ratio(run_figures["steady"], bare["steady"])
        result.rows.append(
            Row(
                measure=(
                    f"{name} vs a bare boto3 loop (receive 10, delete 10), {f['backlog']} "
                    f"messages, {what}, same moto server"
                ),
                leasekeeper=_rates(run_figures),
                baselines=f"bare loop {_rates(bare)}",
                ratio=fmt_ratio(share, "of the bare loop"),
                target=f">= {BARE_TARGET:.0%} of the bare loop",
                met=share is not None and share >= BARE_TARGET,
                note=_complete(run_figures) or _apart(run_figures),
            )
        )
        per = run_figures["calls_per_message"]
        result.rows.append(
            Row(
                measure=f"SQS calls per message, {name.split(',')[0]}, {f['backlog']} messages",
                leasekeeper=f"{per:.3f} ({_actions(run_figures['actions'])})",
                baselines=f"bare loop {bare['calls_per_message']:.3f}",
                target=f"<= {CALLS_TARGET}",
                met=per <= CALLS_TARGET,
            )
        )
    ahead, not_ahead = f["stream_one_receiver"], f["stream_not_ahead"]
    gain = ratio(ahead["steady"], not_ahead["steady"])
    result.rows.append(
        Row(
            measure=(
                f"read_stream receiving ahead (prefetch {STREAM_BATCH}) vs only when Spark asks "
                f"(prefetch=0), one receiver, {f['backlog']} messages, same moto server"
            ),
            leasekeeper=_rates(ahead),
            baselines=f"prefetch=0: {_rates(not_ahead)}",
            ratio=fmt_ratio(gain, "receiving ahead / not"),
            note=_complete(ahead, not_ahead),
        )
    )
    ahead, not_ahead = f["reader_ahead"], f["reader_not_ahead"]
    gain = ratio(ahead["rate"], not_ahead["rate"])
    result.rows.append(
        Row(
            measure=(
                "read_stream's reader alone, Spark modelled (a batch takes "
                f"{SPARK_BATCH_SECONDS:g} s), a queue whose receive takes "
                f"{RECEIVE_SECONDS * 1000:g} ms whatever is in flight, batches of "
                f"{STREAM_BATCH}"
            ),
            leasekeeper=(
                f"receiving ahead: {fmt(ahead['rate'], 'msg/s')} ({ahead['batches']} batches)"
            ),
            baselines=(
                f"prefetch=0: {fmt(not_ahead['rate'], 'msg/s')} ({not_ahead['batches']} batches); "
                f"the receives' own limit {fmt(10 / RECEIVE_SECONDS, 'msg/s')}"
            ),
            ratio=fmt_ratio(gain, "receiving ahead / not"),
            note="" if ahead["left"] == not_ahead["left"] == 0 else "incomplete",
        )
    )
    result.notes.append(
        f"against the bare loop: the best of {f['rounds']} interleaved rounds each; "
        "throughput (scaling): messages over the time from a run's first receive to its "
        "last delete; steady (bare loop rows): messages over the time from the first "
        "receive to the last plus moto's time for the deletes still owed then (moto's "
        "journal); "
        "moto serves one request at a time, and its ReceiveMessage grows slower with "
        "the queue's depth, so the bare loop is the limit there and partitions share "
        "it; the scaling runs use I/O-bound work so that the executors are the limit. "
        "moto's ReceiveMessage walks every message in the queue, in flight included, for "
        "each one it returns: a reader that holds messages until the sink commits (a "
        "stream, with its batches and what it leases ahead) pays for them on every "
        "receive there, which SQS does not charge"
    )


def _rates(figures: dict[str, Any]) -> str:
    return (
        f"{fmt(figures['steady'], 'msg/s')} steady (whole run {fmt(figures['rate'], 'msg/s')}; "
        f"{figures['owed_at_last_receive']} deletes owed at the last receive; moto busy "
        f"{figures['service_busy']:.0%} of the run, {fmt(figures['receive_seconds'] * 1000, 'ms')} "
        "a ReceiveMessage)"
    )


def _actions(actions: dict[str, int]) -> str:
    return ", ".join(f"{n} {action}" for action, n in sorted(actions.items()))
