"""The scenarios of issue 23, written once and run for each framework by its rig
(tests/frameworks/test_celery.py, test_dramatiq.py): real worker processes on moto's
server through the counting proxy, a 3-second visibility timeout, and in each
scenario the control (the same work on plain workers) at the same time, on a queue
of its own.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from tests.frameworks import journal
from tests.frameworks.conftest import VISIBILITY, new_queue_name, queue_is_empty
from tests.frameworks.sqs_proxy import CountingProxy
from tests.frameworks.traffic import Traffic
from tests.frameworks.workers import (
    WorkerProcess,
    WorkerSet,
    stop_all,
    unexpected_records,
    wait_for,
)

LONG = 4 * VISIBILITY  # a task that runs 4x the timeout
LEASE_LINE = "leasekeeper: renewing the messages of queue"


class Rig(Protocol):
    """What a scenario needs of one framework."""

    name: str
    ready: str  # the line a worker logs when it consumes
    own_reads: int  # GetQueueAttributes leasekeeper makes per queue
    gil_holding_tasks: bool  # may a task hold its GIL without stopping the renewals?
    failure_lines: tuple[str, ...]  # what a task that raises logs (expected)
    # Do its receives return the same batches when the queue fills while consumed?
    sends_while_consumed: bool

    def send(self, queue: str, label: str, seconds: float = 0.0, **options: bool) -> None:
        """Send the ``run`` task (``busy``, ``fail``), or a no-op when ``seconds`` is 0
        and no option is given; straight to moto, not through the proxy."""

    def send_noops(self, queue: str, labels: list[str]) -> None:
        """Send a no-op task for each label, as fast as the framework allows."""

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
    ) -> WorkerProcess: ...

    def label(self, body: str) -> str:
        """The first argument of the task whose SQS message body this is."""


@dataclass
class Setting:
    proxy: CountingProxy
    workers: WorkerSet
    sqs: Any
    path: Path  # the journal

    def started(self, label: str) -> int:
        return journal.count(journal.read(self.path), "start", label)

    def starts(self, label: str) -> list[journal.Entry]:
        return [e for e in journal.read(self.path) if e.event == "start" and e.label == label]


def assert_clean_log(worker: WorkerProcess, *expected: str) -> None:
    """No warning, error or traceback in the worker's log but the ``expected`` ones,
    and nothing from leasekeeper on its console."""
    unexpected = unexpected_records(worker.log_text(), expected)
    assert not unexpected, f"{worker.name} logged:\n" + "".join(unexpected)
    console = worker.console()
    assert "Traceback" not in console and "leasekeeper" not in console, console


def long_tasks_and_a_killed_worker(rig: Rig, setting: Setting) -> None:
    """Three long-running tasks of a leased worker run once each - one that waits in
    the prefetch buffer, one that holds its GIL (where the framework runs tasks out of
    the renewer's process), one that raises - while the same long task on a plain
    worker runs more than once; meanwhile, of a pair of leased workers, the one that
    runs a task is SIGKILLed and the other runs it within the timeout."""
    proxy, workers, sqs = setting.proxy, setting.workers, setting.sqs
    leased = new_queue_name(f"{rig.name}-leased")
    plain = new_queue_name(f"{rig.name}-plain")
    pair_queue = new_queue_name(f"{rig.name}-kill")
    rig.send(leased, "long", LONG, busy=rig.gil_holding_tasks)
    rig.send(leased, "fail", LONG, fail=True)
    rig.send(plain, "plain-long", LONG)
    rig.send(pair_queue, "warm-up")  # makes the queue
    common = {"endpoint": proxy.endpoint, "journal_path": setting.path}
    worker = rig.start(workers, "leased", queue=leased, leases=True, concurrency=2, **common)
    control = rig.start(workers, "plain", queue=plain, leases=False, concurrency=2, **common)
    pair = [
        rig.start(workers, name, queue=pair_queue, leases=True, concurrency=1, **common)
        for name in ("first", "second")
    ]

    wait_for("both leased slots busy", lambda: setting.started("long") and setting.started("fail"))
    # Both slots are busy now: this one waits in the prefetch buffer for about LONG s.
    rig.send(leased, "waiter", 0.1)

    # The killed worker, while the long tasks run.
    for member in pair:
        member.wait_ready(rig.ready)
    wait_for("the warm-up task", lambda: queue_is_empty(sqs, pair_queue))
    rig.send(pair_queue, "victim", VISIBILITY + 1)
    wait_for("the victim to start", lambda: setting.starts("victim"))
    first = next(member for member in pair if member.name == setting.starts("victim")[0].worker)
    other = next(member for member in pair if member is not first)
    # Killed after its lease was renewed: without the renewal the message would be
    # visible again by now, and the other worker would have taken it.
    wait_for("a renewal of the victim", lambda: Traffic(proxy, pair_queue).renewals())
    first.kill()
    killed_at = time.time()
    wait_for("the victim to start again", lambda: len(setting.starts("victim")) >= 2)
    again = setting.starts("victim")[1]
    assert again.worker == other.name
    # Back within the timeout SQS applies plus a scheduler tick (and the receive and
    # hand-over on the other worker): the renewals never hid it any longer.
    assert again.at - killed_at <= VISIBILITY + 2.0, again.at - killed_at

    def done() -> bool:
        entries = journal.read(setting.path)
        return (
            journal.count(entries, "end", "long") >= 1
            and journal.count(entries, "fail", "fail") >= 1
            and journal.count(entries, "end", "waiter") >= 1
            and journal.count(entries, "end", "victim") >= 1
            and journal.count(entries, "start", "plain-long") >= 2
            and queue_is_empty(sqs, leased)
            and queue_is_empty(sqs, pair_queue)
        )

    wait_for("every task to end and the leased queues to empty", done, timeout=120)
    control.kill()
    assert stop_all([worker, other]) == [0, 0]

    entries = journal.read(setting.path)
    # With leasekeeper each task ran once, the one that waited in the buffer included;
    # without, the long task was delivered again while it ran.
    for label in ("long", "fail", "waiter"):
        assert journal.count(entries, "start", label) == 1, (label, entries)
    assert journal.count(entries, "start", "plain-long") >= 2, entries
    assert journal.count(entries, "start", "victim") == 2
    assert journal.count(entries, "end", "victim") == 1

    traffic = Traffic(proxy, leased)
    assert sorted(traffic.received().values()) == [1, 1, 1], "each message received once"
    receipts = {label: r for label, (r,) in traffic.receipts_by_label(rig.label).items()}
    assert set(receipts) == {"long", "fail", "waiter"}
    # Renewed to the timeout SQS applies: the waiter while it waited, the long task
    # (holding its GIL where it runs in a process of its own) while it ran.
    assert {renewal.timeout for renewal in traffic.renewals()} == {VISIBILITY}
    for label in ("long", "waiter", "fail"):
        assert len(traffic.renewals_of(receipts[label])) >= 2, label
    # The task that raised is handled by the framework's own rules (deleted), and no
    # message is renewed after its delete.
    assert set(traffic.deleted_at()) == set(receipts.values())
    assert traffic.renewed_after_delete() == []
    assert Traffic(proxy, pair_queue).renewed_after_delete() == []

    assert LEASE_LINE in worker.log_text()
    assert_clean_log(worker, *rig.failure_lines)
    assert_clean_log(other)


def start_pair(rig: Rig, setting: Setting, leased: str, plain: str, concurrency: int) -> None:
    for queue, leases in ((leased, True), (plain, False)):
        rig.start(
            setting.workers,
            queue,
            endpoint=setting.proxy.endpoint,
            queue=queue,
            journal_path=setting.path,
            leases=leases,
            concurrency=concurrency,
        )


def short_tasks(rig: Rig, setting: Setting, *, tasks: int = 200, concurrency: int = 1) -> None:
    """``tasks`` short tasks cost no more SQS calls per task with leasekeeper than
    without, but for its renewals (and the attribute read it needs): the rig's worker
    receives the same batches either way."""
    proxy, sqs = setting.proxy, setting.sqs
    leased = new_queue_name(f"{rig.name}-short")
    plain = new_queue_name(f"{rig.name}-short-plain")
    if rig.sends_while_consumed:
        # The workers start while the tasks are sent: that takes as long again.
        start_pair(rig, setting, leased, plain, concurrency)
    for queue in (leased, plain):
        rig.send_noops(queue, [f"{queue}-{index}" for index in range(tasks)])
    if not rig.sends_while_consumed:
        start_pair(rig, setting, leased, plain, concurrency)

    def ended(queue: str) -> int:
        return sum(1 for e in journal.read(setting.path) if e.label.startswith(f"{queue}-"))

    wait_for(
        f"{tasks} tasks on each queue",
        lambda: (
            ended(leased) == tasks
            and ended(plain) == tasks
            and queue_is_empty(sqs, leased)
            and queue_is_empty(sqs, plain)
        ),
        timeout=240,
    )
    with_leases, without = Traffic(proxy, leased), Traffic(proxy, plain)
    for traffic in (with_leases, without):
        received = traffic.received()
        assert len(received) == tasks and set(received.values()) == {1}, "each received once"

    calls = with_leases.per_task_calls()
    renewal_calls = calls.pop("ChangeMessageVisibilityBatch", 0)
    reads = sum(
        1
        for call in with_leases.calls
        if call.action == "GetQueueAttributes"
        and call.request.get("AttributeNames") == ["VisibilityTimeout"]
    )
    assert reads == rig.own_reads  # the queue's VisibilityTimeout, at its first message
    calls -= Counter({"GetQueueAttributes": reads})
    baseline = without.per_task_calls()
    assert calls - baseline == Counter(), (calls, baseline)
    total = sum(with_leases.per_task_calls().values())
    assert total <= sum(baseline.values()) + renewal_calls + reads
    print(
        f"\n{rig.name}, {tasks} short tasks: {total / tasks:.3f} SQS calls per task with "
        f"leasekeeper ({renewal_calls} renewal calls, {reads} attribute read), "
        f"{sum(baseline.values()) / tasks:.3f} without"
    )
