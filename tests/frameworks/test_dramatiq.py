"""leasekeeper.dramatiq with real ``dramatiq`` worker processes on moto's server,
through a counting proxy, at a 3-second visibility timeout: the scenarios of
tests/frameworks/scenarios.py."""

from __future__ import annotations

import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.conftest import VISIBILITY
from tests.frameworks.dramatiq_broker import NOOP, RUN, make_broker, message
from tests.frameworks.scenarios import LongTasks, Setting, ShortTasks
from tests.frameworks.sqs_proxy import CountingProxy
from tests.frameworks.workers import WorkerProcess, WorkerSet

pytestmark = pytest.mark.slow


class DramatiqRig:
    name = "dramatiq"
    ready = "Worker process is ready for action."
    own_reads = 0  # SQSBroker sends its visibility_timeout on every receive
    # Actors run in threads of the worker process, next to the renewal thread: one
    # that holds the GIL for seconds needs the renewals in a process of their own.
    gil_renewer = "process"
    failure_lines = ("planned failure of fail", "Retries exceeded for message")
    # A receive returns what is there, up to the prefetch: the queue is filled first.
    sends_while_consumed = False

    def __init__(self, moto_endpoint: str) -> None:
        self.broker = make_broker(moto_endpoint.split("://", 1)[-1])

    def send(self, queue: str, label: str, seconds: float = 0.0, **options: bool) -> None:
        self.broker.declare_queue(queue)  # dramatiq-sqs makes it at the first enqueue
        if seconds or options:
            self.broker.enqueue(message(queue, RUN, label, seconds, **options))
        else:
            self.broker.enqueue(message(queue, NOOP, label))

    def send_noops(self, queue: str, labels: list[str]) -> None:
        # SendMessageBatch, ten at a time, as SQSBroker.enqueue encodes each one.
        self.send(queue, labels[0])
        sqs_queue = self.broker.queues[queue]
        for start in range(1, len(labels), 10):
            sqs_queue.send_messages(
                Entries=[
                    {
                        "Id": str(index),
                        "MessageBody": base64.b64encode(
                            message(queue, NOOP, label).encode()
                        ).decode(),
                    }
                    for index, label in enumerate(labels[start : start + 10])
                ]
            )

    def start(
        self,
        workers: WorkerSet,
        name: str,
        *,
        endpoint: str,
        queue: str,
        journal_path: Path,
        leases: bool,
        concurrency: int,
        renewer: str | None = None,
    ) -> WorkerProcess:
        env = {
            "LK_ENDPOINT": endpoint,
            "LK_QUEUE": queue,
            "LK_VISIBILITY": str(VISIBILITY),
            "LK_LEASES": "1" if leases else "0",
            "LK_JOURNAL": str(journal_path),
            "LK_RENEWER": renewer or "",
        }
        command = [
            "dramatiq",
            "tests.frameworks.dramatiq_app",
            "--processes=1",
            f"--threads={concurrency}",
            "--log-file={log}",
        ]
        return workers.start(name, command, env)

    def label(self, body: str) -> str:
        return str(json.loads(base64.b64decode(body))["args"][0])


def test_long_tasks_run_once_killed_workers_tasks_come_back_short_tasks_cost_no_more(
    proxy: CountingProxy, workers: WorkerSet, sqs: Any, moto_endpoint: str, tmp_path: Path
) -> None:
    setting = Setting(proxy, workers, sqs, tmp_path / "journal")
    rig = DramatiqRig(moto_endpoint)
    long_tasks = LongTasks(rig, setting)
    # dramatiq-sqs receives its whole prefetch (2 x threads) whenever its buffer is
    # empty and a slot is free, so the batches are the same with or without leasekeeper.
    short_tasks = ShortTasks(rig, setting, tasks=200, concurrency=4)
    # Both at once: the short tasks are sent, and run, while the long ones run.
    long_tasks.begin()
    with ThreadPoolExecutor(1) as sender:
        sent = sender.submit(short_tasks.begin)
        long_tasks.finish()
        sent.result()
    cost = short_tasks.finish()
    print(f"\n{cost}; failover after SIGKILL {long_tasks.failover:.2f}s")
