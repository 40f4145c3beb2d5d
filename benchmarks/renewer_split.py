"""Where a process-renewer worker's CPU goes: the worker and its renewer process apart.

    .venv/bin/python -m benchmarks.renewer_split [JOBS] [--renewer process|thread] [--lean-moto]

A `Worker` (concurrency 8, batches of 10, no-op handler, the lean SQS path) runs
JOBS no-op messages (default 500) off a fresh moto server (``--lean-moto``: the
journaling one without moto's recounts of the whole queue, ``moto_journal``'s
``LEASEKEEPER_BENCH_LEAN_MOTO``, where moto answers fast enough that the worker's
costs show). Printed: the renewer
process's CPU until it serves (its start-up), its CPU per message during the run
and over 5 idle seconds after it, the worker process's own CPU per message, and
voluntary plus involuntary context switches per message on each side (all threads),
read from /proc. Not part of `benchmarks.run`: a diagnostic for issue 31, whose
figures docs/performance.md (measure 14) quotes.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import tempfile
import time
from pathlib import Path

from benchmarks.bench_sqs_path import _fill
from benchmarks.common import MOTO_ENV, CountingHandler, moto_server, sqs_client, wait_completed
from benchmarks.moto_journal import LEAN_MOTO, journaled_moto

IDLE_SECONDS = 5.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` (all its threads), from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def context_switches(pid: int) -> int:
    """Context switches so far, every thread of ``pid`` counted."""
    total = 0
    for path in glob.glob(f"/proc/{pid}/task/*/status"):
        with open(path) as status:
            total += sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("jobs", nargs="?", type=int, default=500)
    parser.add_argument("--renewer", choices=["process", "thread"], default="process")
    parser.add_argument(
        "--lean-moto", action="store_true", help="moto without its recounts of the whole queue"
    )
    args = parser.parse_args()
    jobs: int = args.jobs
    os.environ.update(MOTO_ENV)  # the renewer process builds its client from them
    server: contextlib.AbstractContextManager[str]
    if args.lean_moto:  # the server, a child, takes it from its environment
        os.environ[LEAN_MOTO] = "1"
        server = journaled_moto(Path(tempfile.mkdtemp(prefix="leasekeeper-split-")) / "journal")
    else:
        server = moto_server()
    from leasekeeper import Worker
    from leasekeeper.backends.sqs import SQSBackend

    with server as endpoint:
        url = _fill(endpoint, jobs)
        backend = SQSBackend(sqs_client(endpoint), url)
        handler = CountingHandler(jobs)
        worker = Worker(
            backend,
            handler,
            concurrency=8,
            batch_size=10,
            wait_seconds=1,
            visibility_timeout=30,
            renewer=args.renewer,
        )
        worker.start()
        child = int(worker.manager.renewer_pid) if args.renewer == "process" else 0
        me = os.getpid()
        started = cpu_seconds(child) if child else 0.0
        switches = (context_switches(child) if child else 0, context_switches(me))
        mine, begun, done_before = time.process_time(), time.monotonic(), worker.stats.completed
        wait_completed(worker, handler, timeout=600)
        took = time.monotonic() - begun
        counted = jobs - done_before
        ran = (cpu_seconds(child) - started) if child else 0.0
        mine = time.process_time() - mine
        after = (context_switches(child) if child else 0, context_switches(me))
        time.sleep(IDLE_SECONDS)
        idle = (cpu_seconds(child) - started - ran) if child else 0.0
        worker.stop(timeout=30)
    per = 1e6 / counted
    print(f"{counted} messages at {counted / took:.0f} msg/s, renewer={args.renewer}")
    print(
        f"worker process: {mine * per:.0f} us CPU a message, "
        f"{(after[1] - switches[1]) / counted:.1f} context switches a message"
    )
    if child:
        print(
            f"renewer process: start-up {started:.3f} s CPU; {ran * per:.0f} us CPU a message, "
            f"{(after[0] - switches[0]) / counted:.1f} context switches a message; "
            f"{idle * 1000 / IDLE_SECONDS:.1f} ms CPU a second idle"
        )


if __name__ == "__main__":
    main()
