"""Measure 13: one worker on two queues against one worker a queue (SQS on moto).

Two queues of no-op jobs are drained on one moto server in a process of its own:
by one ``Worker([a, b], ...)`` of 8 handler threads (weights 1:1), and by two
one-queue workers of 4 threads each (the same threads in all, but two managers,
two renewers, two receive loops). Each run is timed from start to the last
completion (no idle wait counted). Then the case an empty queue must not spoil:
the heavier queue (weight 3) empty, the other full - its drain rate against a
one-queue worker's on the same backlog (goal: at least half as fast).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from benchmarks.common import (
    BenchResult,
    Context,
    Row,
    fmt,
    fmt_ratio,
    moto_server,
    ratio,
    run_child,
    sqs_client,
)

NAME = "queues"
TITLE = "13. Several queues in one worker (SQS on moto)"
THREADS = 8


def _fill(admin: Any, name: str, jobs: int) -> str:
    url: str = admin.create_queue(QueueName=name)["QueueUrl"]
    for start in range(0, jobs, 10):
        admin.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "MessageBody": "x"} for i in range(start, min(jobs, start + 10))
            ],
        )
    return url


def _drain(workers: list[Any], jobs: int) -> float:
    """Start ``workers``, wait until they completed ``jobs`` in all; the seconds it took."""
    started = time.monotonic()
    for worker in workers:
        worker.start()
    give_up = started + 600
    while sum(w.stats.completed for w in workers) < jobs and time.monotonic() < give_up:
        time.sleep(0.01)
    took = time.monotonic() - started
    for worker in workers:
        worker.stop(30)
    return took


def trial(mode: str, jobs: int) -> dict[str, Any]:
    from leasekeeper import Worker
    from leasekeeper.backends.sqs import SQSBackend

    options: dict[str, Any] = {"visibility_timeout": 30, "renewer": "thread", "wait_seconds": 1}
    with moto_server() as endpoint:
        admin = sqs_client(endpoint)
        if mode in {"heavy-empty", "one-queue"}:
            empty = SQSBackend(sqs_client(endpoint), _fill(admin, "empty", 0))
            busy = SQSBackend(sqs_client(endpoint), _fill(admin, "busy", jobs))
            queues: Any = [empty, busy] if mode == "heavy-empty" else busy
            weights = {"weights": [3, 1]} if mode == "heavy-empty" else {}
            worker = Worker(queues, lambda m: None, concurrency=THREADS, **weights, **options)
            took = _drain([worker], jobs)
            return {"completed": worker.stats.completed, "rate": jobs / took}
        a = SQSBackend(sqs_client(endpoint), _fill(admin, "a", jobs))
        b = SQSBackend(sqs_client(endpoint), _fill(admin, "b", jobs))
        if mode == "two-queue":
            workers = [Worker([a, b], lambda m: None, concurrency=THREADS, **options)]
        else:
            workers = [
                Worker(q, lambda m: None, concurrency=THREADS // 2, **options) for q in (a, b)
            ]
        took = _drain(workers, 2 * jobs)
        return {
            "completed": sum(w.stats.completed for w in workers),
            "rate": 2 * jobs / took,
            "threads": threading.active_count(),
        }


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    jobs = ctx.pick(300, 1000)
    data = {
        mode: run_child("benchmarks.bench_queues:trial", mode=mode, jobs=jobs)
        for mode in ("two-queue", "two-workers", "heavy-empty", "one-queue")
    }
    result.figures = data
    errors = [d["error"] for d in data.values() if "error" in d]
    if errors:
        result.error = errors[0]
        return result
    both, apart = data["two-queue"], data["two-workers"]
    result.rows.append(
        Row(
            measure=f"drain two queues of {jobs:,} no-op jobs, {THREADS} handler threads in all",
            leasekeeper=f"one worker, two queues: {fmt(both['rate'], 'msg/s')}",
            baselines=f"two one-queue workers: {fmt(apart['rate'], 'msg/s')}",
            ratio=fmt_ratio(ratio(both["rate"], apart["rate"]), "of their rate"),
        )
    )
    empty, alone = data["heavy-empty"], data["one-queue"]
    share = empty["rate"] / max(alone["rate"], 1e-9)
    result.rows.append(
        Row(
            measure=f"drain {jobs:,} jobs beside an empty queue of weight 3 (1:3)",
            leasekeeper=f"{fmt(empty['rate'], 'msg/s')}",
            baselines=f"one-queue worker: {fmt(alone['rate'], 'msg/s')}",
            ratio=f"{share:.2f} of its rate",
            target=">= 0.5 of a one-queue worker's rate",
            met=share >= 0.5 and empty["completed"] >= jobs,
        )
    )
    return result
