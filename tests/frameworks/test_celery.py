"""leasekeeper.celery with real ``celery worker`` processes (prefork) on moto's server,
through a counting proxy, at a 3-second visibility timeout: the scenarios of
tests/frameworks/scenarios.py."""

from __future__ import annotations

import ast
import base64
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.celery_app import NOOP, RUN, make_app
from tests.frameworks.conftest import VISIBILITY
from tests.frameworks.scenarios import LongTasks, Setting, ShortTasks
from tests.frameworks.sqs_proxy import CountingProxy
from tests.frameworks.workers import WorkerProcess, WorkerSet

pytestmark = pytest.mark.slow


class CeleryRig:
    name = "celery"
    ready = "ready."  # "celery@host ready."
    own_reads = 1  # kombu sends no VisibilityTimeout on receive: the queue's is read
    gil_renewer = None  # prefork: tasks run in children, renewals in the parent
    failure_lines = ("planned failure of fail",)
    # With prefetch 1, every receive returns one message whenever the queue fills.
    sends_while_consumed = True

    def __init__(self, moto_endpoint: str, *, prefetch: int, poll: float = 0.1) -> None:
        self.moto = moto_endpoint.split("://", 1)[-1]
        self.prefetch = prefetch  # Celery's prefetch multiplier
        self.poll = poll  # kombu's polling interval while the prefetch buffer is full
        self._senders: dict[str, Any] = {}

    def send(self, queue: str, label: str, seconds: float = 0.0, **options: bool) -> None:
        sender = self._senders.get(queue)
        if sender is None:
            # kombu makes the queue, with a VisibilityTimeout of VISIBILITY, at the first.
            sender = self._senders[queue] = make_app(self.moto, queue, VISIBILITY)
        if seconds or options:
            sender.send_task(RUN, args=(label, seconds), kwargs=options)
        else:
            sender.send_task(NOOP, args=(label,))

    def send_noops(self, queue: str, labels: list[str]) -> None:
        for label in labels:
            self.send(queue, label)

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
        assert renewer is None, "the consumer process renews (docs/celery.md)"
        env = {
            "LK_ENDPOINT": endpoint,
            "LK_QUEUE": queue,
            "LK_VISIBILITY": str(VISIBILITY),
            "LK_LEASES": "1" if leases else "0",
            "LK_PREFETCH": str(self.prefetch),
            "LK_POLL": str(self.poll),
            "LK_JOURNAL": str(journal_path),
        }
        command = [
            "celery",
            "-A",
            "tests.frameworks.celery_app",
            "worker",
            "--loglevel=INFO",
            "--pool=prefork",
            f"--concurrency={concurrency}",
            f"--hostname={name}@%h",
            "--logfile={log}",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ]
        return workers.start(name, command, env)

    def label(self, body: str) -> str:
        envelope = json.loads(base64.b64decode(body))
        return str(ast.literal_eval(envelope["headers"]["argsrepr"])[0])


def test_long_tasks_run_once_killed_workers_tasks_come_back_short_tasks_cost_no_more(
    proxy: CountingProxy, workers: WorkerSet, sqs: Any, moto_endpoint: str, tmp_path: Path
) -> None:
    setting = Setting(proxy, workers, sqs, tmp_path / "journal")
    long_tasks = LongTasks(CeleryRig(moto_endpoint, prefetch=2), setting)
    # One child and a prefetch of 1: every receive returns one message, with or without
    # leasekeeper, so the two runs make the same calls but for leasekeeper's own. (A
    # full prefetch buffer makes kombu wait its polling interval before the next
    # receive: 10 ms, not 100, or the tasks queue up behind it.)
    short_tasks = ShortTasks(
        CeleryRig(moto_endpoint, prefetch=1, poll=0.01), setting, tasks=200, concurrency=1
    )
    # Both at once: the short tasks are sent, and run, while the long ones run.
    long_tasks.begin()
    with ThreadPoolExecutor(1) as sender:
        sent = sender.submit(short_tasks.begin)
        long_tasks.finish()
        sent.result()
    cost = short_tasks.finish()
    print(f"\n{cost}; failover after SIGKILL {long_tasks.failover:.2f}s")
