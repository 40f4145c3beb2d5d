"""Measure 13: what an SQS worker costs in CPU, and the lean call path that cuts it.

Two parts, each in fresh processes beside one moto server:

- **Worker CPU per 1,000 messages** (the issue-31 scenario): a ``Worker`` runs
  2,000 no-op messages off moto (concurrency 8, batches of 10), on each renewer
  (thread, process) with the lean path on and off (``SQSBackend(fast_path=)``),
  and a bare boto3 loop (receive 10, delete them in one batch) on the same
  server. CPU is the worker process's, user and system, the renewer process's
  included (it is a child, reaped at ``stop``: ``os.times()`` counts it), from
  before the worker is built to after it stopped. msgs/s from ``start`` to the
  last completion. Each variant runs twice, interleaved (A B C ... A B C).
- **Per call, the candidates** for the lean path: CPU microseconds per
  ReceiveMessage (10 messages) and per ChangeMessageVisibilityBatch (10 entries)
  through the boto3 client, through the lean path as shipped (its own SigV4
  signer and keep-alive HTTP client, the stdlib's json), and with one part
  swapped: botocore's ``SigV4Auth`` for its signer, ``http.client`` for its HTTP
  client, and where installed awscrt's SigV4 signer, orjson for json.
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks.common import (
    MOTO_ENV,
    BenchResult,
    Context,
    CountingHandler,
    Row,
    fmt,
    moto_server,
    run_child,
    sqs_client,
    wait_completed,
)

NAME = "sqs_path"
TITLE = "14. Worker CPU per 1,000 messages on SQS (lean call path)"
CONCURRENCY = 8
# The outside check: at most 1.5x fanferro's 0.23-0.26 s a thousand messages.
TARGET_CPU = 0.35
VARIANTS = ("thread+lean", "thread+boto3", "process+lean", "process+boto3", "bare boto3")


def _fill(endpoint: str, jobs: int) -> str:
    import uuid

    admin = sqs_client(endpoint)
    url: str = admin.create_queue(QueueName=f"cpu-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    for start in range(0, jobs, 10):
        admin.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "MessageBody": "x"} for i in range(start, start + 10)],
        )
    return url


def _cpu() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def worker_trial(endpoint: str, variant: str, jobs: int) -> dict[str, Any]:
    """One variant over ``jobs`` no-op messages: CPU seconds and msgs/s."""
    os.environ.update(MOTO_ENV)  # the renewer process builds its client from them
    url = _fill(endpoint, jobs)
    client = sqs_client(endpoint)
    if variant == "bare boto3":
        cpu0, t0 = _cpu(), time.monotonic()
        done = 0
        while done < jobs:
            got = client.receive_message(
                QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=30
            ).get("Messages", [])
            if got:
                client.delete_message_batch(
                    QueueUrl=url,
                    Entries=[
                        {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                        for i, m in enumerate(got)
                    ],
                )
                done += len(got)
        return {"cpu": _cpu() - cpu0, "seconds": time.monotonic() - t0, "completed": done}

    from leasekeeper import Worker
    from leasekeeper.backends.sqs import SQSBackend

    renewer, path = variant.split("+")
    cpu0 = _cpu()
    backend = SQSBackend(client, url, fast_path=path == "lean")
    handler = CountingHandler(jobs)
    worker = Worker(
        backend,
        handler,
        concurrency=CONCURRENCY,
        batch_size=10,
        wait_seconds=1,
        visibility_timeout=30,
        renewer=renewer,  # type: ignore[arg-type]
    )
    t0 = time.monotonic()
    worker.start()
    wait_completed(worker, handler, timeout=300)
    took = time.monotonic() - t0
    worker.stop(timeout=30)
    return {
        "cpu": _cpu() - cpu0,
        "seconds": took,
        "completed": worker.stats.completed,
        "lean": backend.lean is not None,
    }


def call_trial(endpoint: str, calls: int) -> dict[str, Any]:
    """CPU microseconds a call, through the client and the lean path's candidates."""
    from benchmarks.sqs_candidates import candidates

    url = _fill(endpoint, 10)
    client = sqs_client(endpoint)
    receive = {
        "QueueUrl": url,
        "MaxNumberOfMessages": 10,
        "VisibilityTimeout": 0,  # the same ten come back every time
        "MessageAttributeNames": ["All"],
        "MessageSystemAttributeNames": ["All"],
    }
    got = client.receive_message(**receive)["Messages"]
    change = {
        "QueueUrl": url,
        "Entries": [
            {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"], "VisibilityTimeout": 0}
            for i, m in enumerate(got)
        ],
    }
    out: dict[str, Any] = {}
    for name, call in candidates(client).items():
        figures = {}
        for operation, params in (
            ("ReceiveMessage", receive),
            ("ChangeMessageVisibilityBatch", change),
        ):
            for _ in range(20):  # warm: connections, caches
                call(operation, params)
            cpu0 = time.process_time()
            for _ in range(calls):
                answer = call(operation, params)
            figures[operation] = (time.process_time() - cpu0) / calls * 1e6
            if operation == "ReceiveMessage" and len(answer.get("Messages", [])) != 10:
                raise RuntimeError(f"{name}: ReceiveMessage answered {answer!r:.200}")
        out[name] = figures
    return out


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    jobs = ctx.pick(500, 2000)
    rounds = 2
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with moto_server() as endpoint:
        for _ in range(rounds):  # A B C D E, A B C D E: the same hour for each
            for variant in VARIANTS:
                runs[variant].append(
                    run_child(
                        "benchmarks.bench_sqs_path:worker_trial",
                        endpoint=endpoint,
                        variant=variant,
                        jobs=jobs,
                    )
                )
        calls = run_child(
            "benchmarks.bench_sqs_path:call_trial", endpoint=endpoint, calls=ctx.pick(100, 400)
        )
    result.figures = {"worker": runs, "calls": calls}
    errors = [r["error"] for rs in runs.values() for r in rs if "error" in r]
    if errors or "error" in calls:
        result.error = errors[0] if errors else calls["error"]
        return result

    def per_thousand(variant: str) -> list[float]:
        return [r["cpu"] / r["completed"] * 1000 for r in runs[variant]]

    def rate(variant: str) -> list[float]:
        return [r["completed"] / r["seconds"] for r in runs[variant]]

    def show(variant: str) -> str:
        cpu = ", ".join(f"{v:.2f}" for v in per_thousand(variant))
        msgs = ", ".join(fmt(v, "msg/s", 0) for v in rate(variant))
        return f"{cpu} s; {msgs}"

    bare = show("bare boto3")
    for renewer in ("process", "thread"):
        lean, boto3 = f"{renewer}+lean", f"{renewer}+boto3"
        best = min(per_thousand(lean))
        result.rows.append(
            Row(
                measure=(
                    f"worker CPU s / 1,000 msgs and msgs/s, {renewer} renewer, lean path on "
                    f"({jobs:,} no-op msgs, concurrency {CONCURRENCY}, batches of 10, moto; "
                    "two runs)"
                ),
                leasekeeper=show(lean),
                baselines=f"lean path off: {show(boto3)}; bare boto3 loop: {bare}",
                ratio=(
                    f"{min(per_thousand(boto3)) / best:.2f}x less CPU than off" if best else "-"
                ),
                target=f"<= {TARGET_CPU} s / 1,000 msgs" if renewer == "process" else "",
                met=max(per_thousand(lean)) <= TARGET_CPU if renewer == "process" else None,
            )
        )
    client = calls.get("boto3 client", {})
    for name, figures in calls.items():
        if name == "boto3 client" or not isinstance(figures, dict):
            continue
        result.rows.append(
            Row(
                measure=f"CPU us per call, lean path candidate: {name}",
                leasekeeper=", ".join(f"{op} {us:.0f}" for op, us in figures.items()),
                baselines="boto3 client: "
                + ", ".join(f"{op} {us:.0f}" for op, us in client.items()),
                ratio=", ".join(
                    f"{client[op] / us:.1f}x" for op, us in figures.items() if op in client and us
                ),
            )
        )
    return result
