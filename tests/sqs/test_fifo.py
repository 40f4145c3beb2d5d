"""FIFO queues on moto, through the public API, as a user runs them: Worker (its default
renewer: a renewer process), AsyncWorker and ``leasekeeper worker`` keep each message
group's order; a failure holds its group back; standard queues run a group's
messages side by side. (moto models FIFO queues: a group handed out in order, and
held back while any of it is in flight.)"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from leasekeeper import Message, Worker
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.sqs import SQSBackend
from tests.services import CHILD_ENV
from tests.sqs.conftest import make_client

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

JOB = 0.1  # seconds a job takes


def fill(client: Any, url: str, groups: str, each: int) -> None:
    """``each`` messages a group, "a:0" ..., sent a group after another (as a producer
    of each group's events would), in batches."""
    bodies = [f"{group}:{index}" for group in groups for index in range(each)]
    for start in range(0, len(bodies), 10):
        client.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(n), "MessageBody": body, "MessageGroupId": body.split(":")[0]}
                for n, body in enumerate(bodies[start : start + 10])
            ],
        )


def depth(client: Any, url: str) -> int:
    found = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(found["ApproximateNumberOfMessages"]) + int(
        found["ApproximateNumberOfMessagesNotVisible"]
    )


class Journal:
    """Every handler run's start and end, in order, as the checks need them."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.events: list[tuple[str, str, int, float]] = []  # (begin|end, group, index, t)
        self.tries: Counter[str] = Counter()
        self.active: Counter[str] = Counter()
        self.most_of_a_group = 0
        self.most_groups = 0

    def begin(self, message: Message) -> tuple[str, int]:
        group, index = str(message.body).split(":")
        with self.lock:
            self.events.append(("begin", group, int(index), time.monotonic()))
            self.tries[str(message.body)] += 1
            self.active[group] += 1
            self.most_of_a_group = max(self.most_of_a_group, self.active[group])
            self.most_groups = max(self.most_groups, sum(1 for n in self.active.values() if n))
        return group, int(index)

    def end(self, message: Message, ok: bool = True) -> None:
        group, index = str(message.body).split(":")
        with self.lock:
            self.active[group] -= 1
            if ok:
                self.events.append(("end", group, int(index), time.monotonic()))

    def done(self, group: str) -> list[int]:
        return [i for kind, g, i, _ in self.events if kind == "end" and g == group]

    def began(self, group: str) -> list[int]:
        return [i for kind, g, i, _ in self.events if kind == "begin" and g == group]


def test_a_worker_keeps_each_group_in_order_and_runs_groups_side_by_side(
    make_queue: Any, moto_endpoint: str
) -> None:
    client = make_client(moto_endpoint)
    url = make_queue(30, fifo=True)
    fill(client, url, "abcd", 20)
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        time.sleep(JOB)
        journal.end(message)

    worker = Worker(SQSBackend(make_client(moto_endpoint), url), handle, concurrency=8)
    assert worker.manager.renewer.name == "process"  # the default, as users run it
    started = time.monotonic()
    stats = worker.run(until_idle=2)
    took = time.monotonic() - started - 2  # the idle wait at the end is no work
    assert {group: journal.done(group) for group in "abcd"} == {g: list(range(20)) for g in "abcd"}
    assert journal.most_of_a_group == 1 and journal.most_groups >= 2
    assert took < 80 * JOB  # faster than one at a time
    assert (stats.completed, stats.failed, stats.lost, stats.held_back) == (80, 0, 0, 0)
    assert depth(client, url) == 0


def test_a_failure_holds_its_group_back_until_its_retry(
    make_queue: Any, moto_endpoint: str
) -> None:
    client = make_client(moto_endpoint)
    url = make_queue(30, fifo=True)
    fill(client, url, "ab", 10)
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        time.sleep(JOB / 4)
        if message.body == "a:3" and journal.tries["a:3"] == 1:
            journal.end(message, ok=False)
            raise ValueError("the first try of a:3 fails")
        journal.end(message)

    worker = Worker(
        SQSBackend(make_client(moto_endpoint), url), handle, concurrency=8, release_delay=0.5
    )
    stats = worker.run(until_idle=3)
    # Nothing later of a started before a:3's successful retry; b was not held up.
    assert journal.began("a") == [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9]
    assert journal.done("a") == journal.done("b") == list(range(10))
    assert journal.tries["a:3"] == 2 and journal.most_of_a_group == 1
    assert [journal.tries[f"b:{i}"] for i in range(10)] == [1] * 10
    assert stats.failed == 1 and stats.held_back >= 1 and stats.completed == 20
    assert depth(client, url) == 0


def test_a_groups_waiting_messages_are_renewed_through_long_jobs(
    make_queue: Any, moto_endpoint: str
) -> None:
    client = make_client(moto_endpoint)
    url = make_queue(2, fifo=True)
    fill(client, url, "g", 3)
    journal = Journal()

    def handle(message: Message) -> None:
        journal.begin(message)
        time.sleep(2.5)  # longer than the visibility timeout
        journal.end(message)

    worker = Worker(
        SQSBackend(make_client(moto_endpoint), url),
        handle,
        concurrency=4,
        visibility_timeout=2,
        timer_interval=0.2,
        minimal_life=0.5,
        extend_threshold=1.2,
    )
    stats = worker.run(until_idle=2)
    # The third waited 5 s behind the others, leased and renewed all along: run once.
    assert journal.done("g") == [0, 1, 2] and set(journal.tries.values()) == {1}
    assert (stats.received, stats.completed, stats.lost) == (3, 3, 0)
    assert worker.manager.stats().lost == 0 and depth(client, url) == 0


def test_an_async_worker_keeps_each_group_in_order(make_queue: Any, moto_endpoint: str) -> None:
    client = make_client(moto_endpoint)
    url = make_queue(30, fifo=True)
    fill(client, url, "abc", 8)
    journal = Journal()

    async def handle(message: Message) -> None:
        journal.begin(message)
        await asyncio.sleep(JOB / 2)
        if message.body == "c:4" and journal.tries["c:4"] == 1:
            journal.end(message, ok=False)
            raise ValueError("the first try of c:4 fails")
        journal.end(message)

    worker = AsyncWorker(
        SQSBackend(make_client(moto_endpoint), url), handle, concurrency=8, release_delay=0.5
    )
    stats = asyncio.run(worker.run(until_idle=3))
    assert {group: journal.done(group) for group in "abc"} == {g: list(range(8)) for g in "abc"}
    assert journal.began("c") == [0, 1, 2, 3, 4, 4, 5, 6, 7]
    assert journal.most_of_a_group == 1 and journal.most_groups >= 2
    assert (stats.completed, stats.failed) == (24, 1) and depth(client, url) == 0


HANDLER = """\
import json, os, time

def note(*event):
    with open(os.environ["JOURNAL"], "a") as out:
        out.write(json.dumps(event) + "\\n")

def handle(message):
    group, index = message.body.split(":")
    note("begin", group, int(index))
    time.sleep(0.05)
    if message.body == "b:2" and message.receive_count == 1:
        note("failed", group, int(index))
        raise ValueError("the first try of b:2 fails")
    note("end", group, int(index))
"""


def test_the_worker_command_keeps_each_group_in_order(
    make_queue: Any, moto_endpoint: str, tmp_path: Path
) -> None:
    client = make_client(moto_endpoint)
    url = make_queue(30, fifo=True)
    fill(client, url, "ab", 6)
    (tmp_path / "ordered.py").write_text(HANDLER)
    journal = tmp_path / "journal.jsonl"
    flags = ["--concurrency", "8", "--until-idle", "3", "--release-delay", "0.5"]
    flags += ["--status-every", "60"]  # its last line, at the end: the figures
    result = subprocess.run(
        [sys.executable, "-m", "leasekeeper", "worker", "ordered:handle", "--sqs", url, *flags],
        cwd=tmp_path,
        env={**CHILD_ENV, "PATH": "/usr/bin:/bin", "AWS_ENDPOINT_URL_SQS": moto_endpoint}
        | {"JOURNAL": str(journal)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in journal.read_text().splitlines()]
    began = {g: [i for kind, group, i in events if kind == "begin" and group == g] for g in "ab"}
    done = {g: [i for kind, group, i in events if kind == "end" and group == g] for g in "ab"}
    assert done == {"a": list(range(6)), "b": list(range(6))}
    assert began["b"] == [0, 1, 2, 2, 3, 4, 5]  # nothing of b after b:2 before its retry
    active: Counter[str] = Counter()
    for kind, group, _ in events:  # never two of a group at once
        active[group] += 1 if kind == "begin" else -1
        assert active[group] <= 1
    assert depth(client, url) == 0
    # The status line counts the groups (never by id).
    assert re.search(r"done 12, failed 1, lost 0, groups waiting 0, held back \d+", result.stderr)


def test_a_standard_queue_runs_one_groups_messages_side_by_side(
    make_queue: Any, moto_endpoint: str
) -> None:
    client = make_client(moto_endpoint)
    url = make_queue(30)  # standard: MessageGroupId names a tenant ("fair" queues)
    for index in range(4):
        client.send_message(QueueUrl=url, MessageBody=f"t:{index}", MessageGroupId="t")
    together = threading.Barrier(4)
    groups: list[str | None] = []

    def handle(message: Message) -> None:
        groups.append(message.group)
        together.wait(30)  # all four at once, or broken (and failed)

    worker = Worker(SQSBackend(make_client(moto_endpoint), url), handle, concurrency=4)
    stats = worker.run(until_idle=2)
    assert (stats.completed, stats.failed) == (4, 0) and groups == ["t"] * 4


def test_the_fifo_example_runs_on_an_sqs_fifo_queue(make_queue: Any, moto_endpoint: str) -> None:
    from tests.core.test_fifo_example import check_orders, run_example

    url = make_queue(30, fifo=True)
    check_orders(
        run_example({**CHILD_ENV, "QUEUE_URL": url, "AWS_ENDPOINT_URL_SQS": moto_endpoint})
    )
