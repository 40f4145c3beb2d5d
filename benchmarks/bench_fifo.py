"""Measure 15: the cost of ordering - a FIFO queue's groups through a Worker (SQS on moto).

A ``Worker`` of 8 handler threads (its default renewer: a renewer process) drains
800 no-op messages: 8 message groups of 100, sent round-robin (as 8 producers'
streams arrive), once from a FIFO queue - each group one message at a time, in
order, the next started once the one before is deleted - and once from a standard
queue with the same MessageGroupIds (a "fair" queue: the groups order nothing).
The ratio of their rates is what keeping order costs. Then one group of 200 on a
FIFO queue: a single group is sequential, so its time a message is the loop's
latency for one message - handed to a thread, handled, deleted, answered, the next
handed out. Each run is timed from ``start`` to its last completion and checks
every group came out in order.

moto here is the lean one (``moto_journal``, ``LEASEKEEPER_BENCH_LEAN_MOTO=1``):
stock moto rescans the whole queue for each message it hands out, which sets the
rate of every client on a backlog of 800 and hides what the worker does.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.common import (
    MOTO_ENV,
    BenchResult,
    Context,
    Row,
    fmt,
    run_child,
    sqs_client,
)
from benchmarks.moto_journal import LEAN_MOTO, journaled_moto

NAME = "fifo"
TITLE = "15. Ordered (FIFO) queues: the cost of ordering (SQS on moto)"
THREADS = 8


def _fill(endpoint: str, fifo: bool, groups: int, each: int) -> str:
    admin = sqs_client(endpoint)
    name = f"order-{uuid.uuid4().hex[:8]}" + (".fifo" if fifo else "")
    attributes = {"FifoQueue": "true", "ContentBasedDeduplication": "true"} if fifo else {}
    url: str = admin.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
    bodies = [f"g{group}:{index}" for index in range(each) for group in range(groups)]
    for start in range(0, len(bodies), 10):
        admin.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(n), "MessageBody": body, "MessageGroupId": body.split(":")[0]}
                for n, body in enumerate(bodies[start : start + 10])
            ],
        )
    return url


def trial(fifo: bool, groups: int, each: int) -> dict[str, Any]:
    """One drain in this (fresh) process; its rate and whether every group kept order."""
    from leasekeeper import Message, Worker
    from leasekeeper.backends.sqs import SQSBackend

    os.environ.update(MOTO_ENV)  # the renewer process builds its client from them
    os.environ[LEAN_MOTO] = "1"  # the server, a child, takes it from its environment
    jobs = groups * each
    seen: dict[str, list[int]] = {}
    lock = threading.Lock()
    done = threading.Event()

    def handle(message: Message) -> None:
        group, index = str(message.body).split(":")
        with lock:
            seen.setdefault(group, []).append(int(index))
            if sum(map(len, seen.values())) >= jobs:
                done.set()

    journal = Path(tempfile.mkdtemp(prefix="leasekeeper-fifo-")) / "journal"
    with journaled_moto(journal) as endpoint:
        url = _fill(endpoint, fifo, groups, each)
        worker = Worker(
            SQSBackend(sqs_client(endpoint), url),
            handle,
            concurrency=THREADS,
            visibility_timeout=30,
        )
        started = time.monotonic()
        worker.start()
        done.wait(600)
        while worker.stats.completed < jobs and time.monotonic() < started + 600:
            time.sleep(0.005)
        took = time.monotonic() - started
        worker.stop(30)
    in_order = all(indexes == sorted(indexes) for indexes in seen.values())
    return {
        "completed": worker.stats.completed,
        "rate": jobs / took,
        "seconds": took,
        "ms_a_message": 1000 * took / jobs,
        "in_order": in_order,
        "renewer": worker.manager.renewer.name,
    }


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    each, single = ctx.pick(30, 100), ctx.pick(60, 200)
    data = {
        "fifo": run_child("benchmarks.bench_fifo:trial", fifo=True, groups=8, each=each),
        "standard": run_child("benchmarks.bench_fifo:trial", fifo=False, groups=8, each=each),
        "one group": run_child("benchmarks.bench_fifo:trial", fifo=True, groups=1, each=single),
    }
    result.figures = data
    errors = [d["error"] for d in data.values() if "error" in d]
    if errors:
        result.error = errors[0]
        return result
    fifo, standard, alone = data["fifo"], data["standard"], data["one group"]
    result.rows.append(
        Row(
            measure=f"8 groups x {each} no-op messages, a Worker of {THREADS} threads "
            f"({fifo['renewer']} renewer)",
            leasekeeper=f"FIFO, each group in order: {fmt(fifo['rate'], 'msg/s')}",
            baselines=f"standard queue, same groups: {fmt(standard['rate'], 'msg/s')}",
            ratio=f"{fifo['rate'] / max(standard['rate'], 1e-9):.2f} of its rate",
        )
    )
    result.rows.append(
        Row(
            measure=f"one group of {single} on a FIFO queue (sequential: the loop's latency)",
            leasekeeper=f"{alone['ms_a_message']:.1f} ms a message ({fmt(alone['rate'], 'msg/s')})",
        )
    )
    if not (fifo["in_order"] and alone["in_order"]):
        result.notes.append("a FIFO group came out of order: a bug")
    for name, figures in data.items():
        expected = 8 * each if name != "one group" else single
        if figures["completed"] != expected:
            result.notes.append(f"{name}: {figures['completed']} of {expected} completed")
    return result
