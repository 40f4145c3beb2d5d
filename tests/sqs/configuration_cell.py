"""One cell of the configuration matrix (tests/sqs/test_configurations.py), in a
process of its own so that its environment - keys, profiles, endpoints - is the
one a user's program would have, and cells can run side by side.

``python -m tests.sqs.configuration_cell '<json>'``: builds the queue the way the
cell's row says (``build``), runs one job through the cell's entry point with the
cell's renewer, and prints ``{"renewer": ...}`` as its last line. ``handle`` is the
job: it notes that it ran (its body, the cell's name, a line in ``$MATRIX_RUNS``)
and takes 3 s, at a 2 s visibility timeout. The ``leasekeeper worker`` cells run it by name.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

JOB_SECONDS = 3.0
TIMING: dict[str, Any] = {
    "visibility_timeout": 2.0,
    "timer_interval": 0.2,
    "minimal_life": 0.5,
}


def handle(message: Any) -> None:
    with open(os.environ["MATRIX_RUNS"], "a") as runs:
        runs.write(f"{message.body}\n")
    time.sleep(JOB_SECONDS)


async def handle_async(message: Any) -> None:
    with open(os.environ["MATRIX_RUNS"], "a") as runs:
        runs.write(f"{message.body}\n")
    await asyncio.sleep(JOB_SECONDS)


def build(cell: dict[str, Any]) -> Any:
    """The backend, built as the cell's row says a user builds it."""
    import boto3
    from botocore.config import Config

    import leasekeeper
    from leasekeeper.backends.sqs import SQSBackend

    how, url = cell["build"], cell["url"]
    config = Config(connect_timeout=2, read_timeout=30, retries={"max_attempts": 2})
    if how == "client":  # boto3.client("sqs", **cell["client"])
        return SQSBackend(boto3.client("sqs", config=config, **cell["client"]), url)
    if how == "profile":  # a profile of the shared config file, chosen in code
        session = boto3.Session(profile_name=cell["profile"])
        return SQSBackend(session.client("sqs", config=config), url)
    return leasekeeper.connect(url)  # "connect"


def renewer_beside(pid: int) -> str:
    """ "process" when a renewer process is a child of ``pid`` (a Spark executor's
    Python worker), else "thread"."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            text = status.read_text()
            cmdline = (status.parent / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = next((line.split()[1] for line in text.splitlines() if line.startswith("PPid")), "")
        if ppid == str(pid) and b"leasekeeper.renewers._main" in cmdline:
            return "process"
    return "thread"


def drained_by(message: Any) -> str:
    handle(message)
    return renewer_beside(os.getpid())


def run(cell: dict[str, Any]) -> dict[str, Any]:
    from leasekeeper import LeaseManager, Worker
    from leasekeeper.aio import AsyncWorker

    entry, renewer = cell["entry"], cell["renewer"]
    backend = build(cell)
    if entry == "receive":
        with LeaseManager(backend, renewer=renewer, **TIMING) as manager:
            name = manager.renewer.name
            done = 0
            deadline = time.monotonic() + 30
            while not done and time.monotonic() < deadline:
                for held in manager.receive(max_messages=1, wait_seconds=1):
                    with held:
                        handle(held.message)
                    done += 1
        return {"renewer": name}
    if entry == "worker":
        worker = Worker(backend, handle, renewer=renewer, concurrency=2, wait_seconds=1, **TIMING)
        name = worker.manager.renewer.name
        worker.run(until_idle=1.5)
        return {"renewer": name}
    if entry == "async":
        aworker = AsyncWorker(
            backend, handle_async, renewer=renewer, concurrency=2, wait_seconds=1, **TIMING
        )
        name = aworker.manager.renewer.name
        asyncio.run(aworker.run(until_idle=1.5))
        return {"renewer": name}
    raise ValueError(f"no entry point {entry!r}")


def spark_drains(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each cell drained by Spark local[2] in one session (its executors have this
    process's environment)."""
    from pyspark.sql import SparkSession

    from leasekeeper import LeaseConfig
    from leasekeeper.backends.spec import spec_of
    from leasekeeper.spark import drain

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("leasekeeper-configurations")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    answers = []
    try:
        for cell in cells:
            source: Any = {"queue": cell["url"]}
            if cell["build"] != "connect":  # the spec of the backend the user built
                source = {"source": spec_of(build(cell))}
            rows = drain(
                spark,
                handler=drained_by,
                output=cell["output"],
                partitions=1,
                batch_size=1,
                idle_seconds=2.0,
                renewer=cell["renewer"],
                config=LeaseConfig(**TIMING),
                **source,
            ).collect()
            ran = {json.loads(row.output) for row in rows if row.status == "completed"}
            answers.append({"renewer": ",".join(sorted(ran)), "rows": len(rows)})
    finally:
        spark.stop()
    return answers


def main(argv: list[str]) -> int:
    cell = json.loads(argv[1])
    if cell.get("entry") == "spark":
        print(json.dumps(spark_drains(cell["cells"])))
    else:
        print(json.dumps(run(cell)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
