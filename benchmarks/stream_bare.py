"""``read_stream`` against a bare boto3 loop on one local Spark session, A/B-ready.

``python -m benchmarks.stream_bare [--rounds N] [--backlog N] [--fill-seconds S]
[--variant NAME:key=value,...]... [--json PATH]``

Measure 12's "against the bare loop" row for the stream without the standalone
cluster (the reader runs in the driver's process either way; executors only
emit its rows): moto's server with its journal (``benchmarks/moto_journal.py``),
one ``local[2]`` session, a warm-up query, then N interleaved rounds of a bare
loop (receive 10, delete them in one batch call) and ``read_stream`` (one
receive at a time, batches of up to 50, ``Trigger.AvailableNow``, a Parquet
sink), each on a fresh queue of the same backlog. Rates are measure 12's
``steady`` (``bench_cluster.work``); each round prints the ratio of the two,
measured in the same run, and where the stream's time went: per micro-batch,
Spark's own timings (``latestOffset``: the reader's wait for a batch;
``walCommit``: the offset log and the commit of the batch before, its deletes;
``addBatch``: the batch's job), and from the journal the messages the reader
held (received, not yet deleted), moto's mean time per ReceiveMessage, and
the CPU time per message of moto's process, Spark's JVM, Spark's Python
processes (the reader's among them) and this process (on Linux, from /proc).
moto's ReceiveMessage costs CPU in proportion to every message in the queue,
hidden ones included (it recounts the queue's attributes for each message it
hands out), so what the reader holds makes each of its receives dearer.
``--lean-moto`` takes those recounts out (``moto_journal.without_attribute_scans``,
and ``with_a_quick_clock``): then moto answers many times faster and the rates are
the reader's and Spark's.

To compare two versions of ``leasekeeper``, run this once per version,
alternated, with ``PYTHONPATH`` naming the other version's ``src`` first. To
compare ``read_stream`` arguments in one run, name each with ``--variant``
(e.g. ``--variant p2: --variant p1:partitions=1``): each round runs them in
turn after its bare loop.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.bench_cluster import CONFIG, STREAM_BATCH, bare_loop, queue, source, work
from benchmarks.bench_stream import depth, spark_session
from benchmarks.common import MOTO_ENV, sqs_client
from benchmarks.moto_journal import LEAN_MOTO, Request, journaled_moto, mark, read


def held(requests: list[Request]) -> tuple[float, int]:
    """Mean and most messages held (received, not deleted), request by request."""
    received = deleted = 0
    counts = []
    for request in sorted(requests, key=lambda r: r.ended):
        if request.action == "ReceiveMessage":
            received += request.messages
        elif request.action.startswith("DeleteMessage"):
            deleted += request.messages
        counts.append(received - deleted)
    return (sum(counts) / len(counts), max(counts)) if counts else (0.0, 0)


def cpu_seconds() -> dict[str, float] | None:
    """CPU seconds used so far, by group: ``moto`` (its server process), ``jvm``
    (Spark's JVM, but for its JIT compiler threads: ``jit``), ``python`` (Spark's
    Python processes: workers and the stream's reader), ``renewer`` (the reader's
    renewer process) and ``bench`` (this process: the bare loop's client); reaped
    processes count in their parent's group. None off Linux."""
    stats: dict[int, list[str]] = {}
    commands: dict[int, bytes] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            commands[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes()
            stats[int(stat.parent.name)] = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
    me = os.getpid()
    if me not in stats:
        return None
    children: dict[int, list[int]] = {}
    for pid, fields in stats.items():
        children.setdefault(int(fields[1]), []).append(pid)
    tick = os.sysconf("SC_CLK_TCK")
    used = dict.fromkeys(CPU_GROUPS, 0.0)
    todo = [me]
    while todo:
        pid = todo.pop()
        todo += children.get(pid, [])
        fields, command = stats[pid], commands.get(pid, b"")
        seconds = sum(int(field) for field in fields[11:15]) / tick  # own and reaped
        if pid == me:
            group = "bench"
        elif b"benchmarks.moto_journal" in command:
            group = "moto"
        elif b"leasekeeper.renewers._main" in command:
            group = "renewer"  # the reader's renewer process, while it lives
        elif command.split(b"\0", 1)[0].endswith(b"java"):
            group = "jvm"
            jit = _jit_seconds(pid, tick)
            used["jit"] += jit
            seconds -= jit
        else:
            group = "python"
        used[group] += seconds
    return used


def _jit_seconds(pid: int, tick: int) -> float:
    """CPU seconds of a JVM's JIT compiler threads (named "C1/C2 CompilerThread")."""
    total = 0.0
    for task in Path(f"/proc/{pid}/task").glob("[0-9]*"):
        try:
            if not (task / "comm").read_text().startswith(("C1 Compiler", "C2 Compiler")):
                continue
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


# jvm: Spark's JVM without its JIT compiler threads (jit); renewer: the reader's
# renewer process (renewer="auto"), until it exits (then its parent's, python)
CPU_GROUPS = ("moto", "jvm", "jit", "python", "renewer", "bench")


def measured(run: Callable[[], dict[str, Any]], count: int) -> dict[str, Any]:
    """``run()``'s figures, with the CPU milliseconds per message of each group."""
    before = cpu_seconds()
    figures = run()
    after = cpu_seconds()
    if before is not None and after is not None:
        figures["cpu_ms_per_message"] = {
            group: (after[group] - before[group]) * 1000 / count for group in CPU_GROUPS
        }
    return figures


def stream(
    spark: Any,
    client: Any,
    endpoint: str,
    journal: Path,
    where: Path,
    *,
    count: int,
    fill_seconds: float = 2.0,
    options: dict[str, Any] | None = None,
) -> Any:
    from leasekeeper.spark import read_stream

    url = queue(client, f"stream-{time.monotonic_ns()}", count)
    out = where / f"stream-{time.monotonic_ns()}"
    arguments: dict[str, Any] = {
        "partitions": 2,
        "receive_concurrency": 1,  # moto's ReceiveMessage takes no lock: one at a time
        "max_messages_per_batch": STREAM_BATCH,
        "fill_seconds": fill_seconds,
    }
    arguments.update(options or {})
    frame = read_stream(spark, source(url, endpoint), config=CONFIG, **arguments)
    begin = mark(journal)
    query = (
        frame.select("id", "received_at")
        .writeStream.format("parquet")
        .option("checkpointLocation", str(out / "_checkpoint"))
        .trigger(availableNow=True)
        .start(str(out / "sink"))
    )
    query.awaitTermination()
    requests = read(journal, begin)
    figures = work(requests, count)
    ids = {row["id"] for row in spark.read.parquet(str(out / "sink")).select("id").collect()}
    figures.update(
        short_receives=sum(
            1 for r in requests if r.action == "ReceiveMessage" and 0 < r.messages < 10
        ),
        completed=len(ids),
        left=depth(client, url),
        held=held(requests),
        batches=[
            (p["numInputRows"], {k: v for k, v in p["durationMs"].items() if v})
            for p in query.recentProgress
        ],
    )
    return figures


def variant(text: str) -> tuple[str, dict[str, Any]]:
    """``NAME:key=value,key=value`` (values as Python literals) -> (NAME, arguments)."""
    name, _, pairs = text.partition(":")
    arguments: dict[str, Any] = {}
    for pair in filter(None, pairs.split(",")):
        key, _, value = pair.partition("=")
        arguments[key.strip()] = ast.literal_eval(value.strip())
    return name, arguments


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.stream_bare", description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backlog", type=int, default=400)
    parser.add_argument(
        "--fill-seconds", type=float, default=2.0, help="read_stream's fill_seconds (default 2)"
    )
    parser.add_argument(
        "--variant",
        type=variant,
        action="append",
        help="NAME:key=value,... read_stream arguments of one stream per round (repeat it "
        "for several, run in turn after each round's bare loop; default: one, as measured)",
    )
    parser.add_argument(
        "--lean-moto",
        action="store_true",
        help="moto without its recounts of the whole queue and its slow clock (moto_journal's "
        "LEASEKEEPER_BENCH_LEAN_MOTO)",
    )
    parser.add_argument("--json", type=Path, help="write every round's figures there")
    args = parser.parse_args()
    variants: list[tuple[str, dict[str, Any]]] = args.variant or [("stream", {})]
    import leasekeeper

    print(f"leasekeeper from {Path(leasekeeper.__file__).parent}", flush=True)
    os.environ.update(MOTO_ENV)
    if args.lean_moto:  # the server, a child, takes it from its environment
        os.environ[LEAN_MOTO] = "1"
    where = Path(tempfile.mkdtemp(prefix="leasekeeper-bench-stream-bare-"))
    journal = where / "moto-journal.txt"
    rounds = []
    with journaled_moto(journal) as endpoint, spark_session() as spark:
        client = sqs_client(endpoint)
        for _, options in variants:  # warm-up, each variant's way through Spark
            stream(spark, client, endpoint, journal, where, count=20, options=options)
        for n in range(args.rounds):
            bare = measured(lambda: bare_loop(client, args.backlog, journal), args.backlog)
            figures: dict[str, Any] = {"bare": bare}
            for name, options in variants:
                streamed = measured(
                    lambda options=options: stream(  # type: ignore[misc]
                        spark,
                        client,
                        endpoint,
                        journal,
                        where,
                        count=args.backlog,
                        fill_seconds=args.fill_seconds,
                        options=options,
                    ),
                    args.backlog,
                )
                share = streamed["steady"] / bare["steady"]
                figures[name] = streamed | {"ratio": share}
                print(
                    f"round {n + 1}, {name}: read_stream {streamed['steady']:.1f} msg/s steady "
                    f"({len(streamed['batches'])} batches, held {streamed['held'][0]:.0f} on "
                    f"average, at most {streamed['held'][1]}; "
                    f"{streamed['receive_seconds'] * 1000:.0f} ms a ReceiveMessage; "
                    f"{streamed['completed']}/{args.backlog} in the sink, "
                    f"{streamed['left']} left) / bare loop {bare['steady']:.1f} msg/s "
                    f"({bare['receive_seconds'] * 1000:.0f} ms a ReceiveMessage) = {share:.2f}x; "
                    f"calls {_actions(streamed)}; "
                    f"CPU ms a message: stream {_ms(streamed)}; bare {_ms(bare)}",
                    flush=True,
                )
                for rows, durations in streamed["batches"]:
                    print(f"    batch of {rows}: {durations}", flush=True)
            rounds.append(figures)
    if args.json is not None:
        args.json.write_text(json.dumps(rounds, default=str, indent=1))


def _actions(figures: dict[str, Any]) -> str:
    """Calls by action, and the receives that returned fewer than ten."""
    actions = ", ".join(f"{n} {action}" for action, n in sorted(figures["actions"].items()))
    return f"{actions} ({figures['short_receives']} receives of fewer than 10)"


def _ms(figures: dict[str, Any]) -> str:
    cpu = figures.get("cpu_ms_per_message")
    if cpu is None:
        return "?"
    return ", ".join(f"{group} {cpu[group]:.1f}" for group in CPU_GROUPS if cpu[group] >= 0.05)


if __name__ == "__main__":
    main()
