"""What ``read_stream``'s renewals cost the reader: its ``StreamDriver`` on moto, with
its leases renewed in a thread of the reader's process (``renewer="thread"``) or from
a renewer process beside it (``"auto"``, the default), A/B in one run.

``python -m benchmarks.stream_renewals [--rounds N] [--backlog N] [--batch N]
[--hold S] [--lean-moto] [--hog]``

No Spark: this process plays the reader's part as Spark drives it - ``latestOffset``
takes a batch, ``partitions`` plans its rows, the batch "runs" for ``--hold`` seconds
(Spark's job and sink; by default two visibility timeouts, so every message is
renewed at least once), and the next ``latestOffset`` deletes it - until the
backlog is done. Measured per message, from ``getrusage``: the CPU of this process
(the reader's: receives, rows, deletes, and with the thread its renewals) and of
its renewer process (reaped by the time it is read), less what a renewer process
costs to start and stop with nothing to renew (measured apart, once a round), and
the wall time; from moto's journal, the extend calls. ``--hog`` runs the rounds
beside a process spinning on a core, and counts the leases a starved reader loses
(a lapse, or its message received again: "superseded").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.bench_stream import fill
from benchmarks.common import MOTO_ENV, sqs_client
from benchmarks.moto_journal import LEAN_MOTO, journaled_moto, mark, read

VISIBILITY = 2.0  # the stream scenario's (tests/spark/test_stream.py)


def cpu(who: int) -> float:
    used = resource.getrusage(who)
    return used.ru_utime + used.ru_stime


@contextlib.contextmanager
def hog(on: bool) -> Iterator[None]:
    """A process spinning on a core while the block runs (``on``)."""
    spinning = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if on else None
    try:
        yield
    finally:
        if spinning is not None:
            spinning.kill()
            spinning.wait()


def start_up(endpoint: str) -> float:
    """CPU seconds of a renewer process started (until it serves) and closed, with
    nothing to renew: what each query's reader pays once."""
    from leasekeeper import LeaseManager
    from leasekeeper.backends.sqs import SQSBackend

    client = sqs_client(endpoint)
    url: str = client.create_queue(QueueName=f"start-{time.monotonic_ns()}")["QueueUrl"]
    children = cpu(resource.RUSAGE_CHILDREN)
    LeaseManager(SQSBackend(client, url), renewer="process").close()
    used = cpu(resource.RUSAGE_CHILDREN) - children
    client.delete_queue(QueueUrl=url)
    return used


def one_stream(
    client: Any, endpoint: str, journal: Path, renewer: str, args: argparse.Namespace
) -> dict[str, Any]:
    from leasekeeper import LeaseConfig
    from leasekeeper.spark import SQSSource
    from leasekeeper.spark.stream_driver import StreamDriver
    from leasekeeper.spark.stream_options import StreamOptions

    url: str = client.create_queue(
        QueueName=f"renewals-{time.monotonic_ns()}",
        Attributes={"VisibilityTimeout": str(int(VISIBILITY))},
    )["QueueUrl"]
    fill(client, url, args.backlog)
    config = LeaseConfig(visibility_timeout=VISIBILITY, timer_interval=0.2, minimal_life=0.5)
    options = StreamOptions(
        source=SQSSource(url, region="us-east-1", endpoint_url=endpoint),
        config=config,
        max_messages_per_batch=args.batch,
        receive_concurrency=1,  # moto's ReceiveMessage takes no lock
        poll_seconds=1.0,
        renewer=renewer,  # type: ignore[arg-type]
    )
    begin = mark(journal)
    own, children, wall = cpu(resource.RUSAGE_SELF), cpu(resource.RUSAGE_CHILDREN), time.monotonic()
    driver = StreamDriver(options)
    start = {"batch": 0}
    done = 0
    while done < args.backlog:
        end = driver.latest_offset(start)
        if end == start:
            continue
        rows = [row for part in driver.plan(start, end) for row in part]
        done += len(rows)
        time.sleep(args.hold)  # the batch runs through Spark and the sink
        start = end
    driver.latest_offset(start)  # deletes the last batch
    counts = driver.counts
    driver.stop()
    driver.shutdown_threads()
    wall = time.monotonic() - wall
    reader = cpu(resource.RUSAGE_SELF) - own
    renewer_cpu = cpu(resource.RUSAGE_CHILDREN) - children  # the renewer, reaped at stop
    requests = read(journal, begin)
    extends = [r for r in requests if r.action.startswith("ChangeMessageVisibility")]
    client.delete_queue(QueueUrl=url)
    return {
        "renewer": renewer,
        "reader_ms": reader * 1000 / args.backlog,
        "renewer_ms": renewer_cpu * 1000 / args.backlog,
        "wall_s": wall,
        "extend_calls": len(extends),
        "extended": sum(r.messages for r in extends),
        # A lapse (the reader's process starved) is a lost lease: rule 5 on SQS, or
        # "superseded" when the reader's own prefetcher received the message again.
        "lost": counts.lost,
        "deleted": counts.deleted,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.stream_renewals", description=__doc__
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=600)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--hold", type=float, default=2 * VISIBILITY)
    parser.add_argument("--lean-moto", action="store_true")
    parser.add_argument("--hog", action="store_true", help="beside a process spinning on a core")
    args = parser.parse_args()
    os.environ.update(MOTO_ENV)  # where the renewer process finds its credentials
    if args.lean_moto:
        os.environ[LEAN_MOTO] = "1"
    journal = Path(tempfile.mkdtemp(prefix="leasekeeper-bench-renewals-")) / "journal.txt"
    with journaled_moto(journal) as endpoint, hog(args.hog):
        client = sqs_client(endpoint)
        for n in range(args.rounds):
            starting = start_up(endpoint)
            print(f"round {n + 1}: a renewer process's start and stop {starting:.2f} s of CPU")
            for renewer in ("thread", "auto"):
                got = one_stream(client, endpoint, journal, renewer, args)
                if renewer != "thread":
                    got["renewer_ms"] -= starting * 1000 / args.backlog
                print(
                    f"round {n + 1}, {renewer}: CPU a message {got['reader_ms']:.2f} ms "
                    f"in the reader + {got['renewer_ms']:.2f} ms in its renewer process "
                    f"(start-up aside) = {got['reader_ms'] + got['renewer_ms']:.2f} ms; "
                    f"{got['extend_calls']} "
                    f"extend calls ({got['extended']} extends) for {args.backlog}; "
                    f"{got['wall_s']:.1f} s; leases lost {got['lost']}, deleted {got['deleted']}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
