"""Measure 9: API calls per message for a Worker running short jobs on SQS.

SQS bills per request. A ``Worker`` runs 2,000 no-op jobs (concurrency 8) off a
moto server in its own process; every request the worker's boto3 client sends is
counted (botocore's ``before-call`` event), receives, deletes and extends alike.
Compared in one run: the worker as it is - coalesced deletes, a slot freed once
its delete is queued, free slots gathered before a receive, a prefetched batch
while handlers are quick - and the loop it replaced ("one by one", ``old_loop``
below: receive as many as threads are free, each handler thread completing its
own lease with one delete call). Goal: at most 0.25 calls a message.
"""

from __future__ import annotations

import time
from collections import Counter
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

NAME = "worker_calls"
TITLE = "9. API calls per message (Worker, short jobs, SQS)"
TARGET = 0.25
CONCURRENCY = 8


def old_loop(backend: Any, jobs: int) -> int:
    """The receive loop before coalescing, as Worker had it: receive as many as
    threads are free, lease the batch, each handler completes its own lease."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from leasekeeper import LeaseManager

    manager = LeaseManager(backend, renewer="thread", visibility_timeout=30)
    slots = threading.Condition()
    running = 0
    done = 0

    def handle(lease: Any) -> None:
        nonlocal running, done
        try:
            lease.complete()
        except Exception:  # moto lost a delete (it is not thread-safe): it comes back
            pass
        else:
            with slots:
                done += 1
        finally:
            with slots:
                running -= 1
                slots.notify_all()

    # Bounded: a message moto hands out twice must not keep the loop waiting for ever.
    give_up = time.monotonic() + 300
    with ThreadPoolExecutor(CONCURRENCY) as pool:
        while done < jobs and time.monotonic() < give_up:
            with slots:
                while running >= CONCURRENCY:
                    slots.wait()
                free = CONCURRENCY - running
            messages = backend.receive(max_messages=min(10, free), wait_seconds=1)
            leases = [manager.register(m) for m in messages]
            with slots:
                running += len(leases)
            for lease in leases:
                pool.submit(handle, lease)
    manager.close()
    return done


def trial(mode: str, jobs: int) -> dict[str, Any]:
    from leasekeeper import Worker
    from leasekeeper.backends.sqs import SQSBackend

    with moto_server() as endpoint:
        admin = sqs_client(endpoint)
        url = admin.create_queue(QueueName="calls")["QueueUrl"]
        for start in range(0, jobs, 10):
            admin.send_message_batch(
                QueueUrl=url,
                Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(start, start + 10)],
            )
        client = sqs_client(endpoint)
        calls: Counter[str] = Counter()

        def count(model: Any, **_: Any) -> None:
            calls[model.name] += 1

        client.meta.events.register("before-call.sqs", count)
        backend = SQSBackend(client, url)
        started = time.monotonic()
        if mode == "legacy":
            completed = old_loop(backend, jobs)
        else:
            worker = Worker(
                backend, lambda message: None, concurrency=CONCURRENCY, visibility_timeout=30
            )
            completed = worker.run(until_idle=2.0).completed
            started += 2.0  # the idle wait at the end is no work
        took = time.monotonic() - started
        work = calls["ReceiveMessage"] + calls["DeleteMessageBatch"] + calls["DeleteMessage"]
        work += calls["ChangeMessageVisibilityBatch"] + calls["ChangeMessageVisibility"]
        return {
            "completed": completed,
            "calls": dict(calls),
            "per_message": work / max(1, completed),
            "rate": completed / max(took, 1e-9),
        }


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    jobs = ctx.pick(500, 2000)
    data = {
        m: run_child("benchmarks.bench_worker_calls:trial", mode=m, jobs=jobs)
        for m in ("now", "legacy")
    }
    result.figures = data
    now, legacy = data["now"], data["legacy"]
    if "error" in now or "error" in legacy:
        result.error = now.get("error") or legacy.get("error")
        return result
    result.rows.append(
        Row(
            measure=f"API calls per message, {jobs:,} no-op jobs, concurrency {CONCURRENCY} (moto)",
            leasekeeper=(
                f"{now['per_message']:.3f} ({now['calls'].get('ReceiveMessage', 0):,} receives, "
                f"{now['calls'].get('DeleteMessageBatch', 0):,} deletes); "
                f"{fmt(now['rate'], 'msg/s')}"
            ),
            baselines=(
                f"one by one: {legacy['per_message']:.3f} "
                f"({legacy['calls'].get('ReceiveMessage', 0):,} receives, "
                f"{legacy['calls'].get('DeleteMessageBatch', 0):,} deletes); "
                f"{fmt(legacy['rate'], 'msg/s')}"
            ),
            ratio=fmt_ratio(ratio(legacy["per_message"], now["per_message"]), "fewer calls"),
            target=f"<= {TARGET:g} calls a message",
            met=now["per_message"] <= TARGET and now["completed"] == jobs,
        )
    )
    return result
