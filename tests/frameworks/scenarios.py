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
# A killed worker's task starts elsewhere within: the timeout, after the last renewal
# (which the scenario waits for, so at worst right before the SIGKILL); one scheduler
# tick (framework_config's timer_interval at 3 s); the other worker's long poll (1 s:
# moto, unlike SQS, does not end a long poll when a message becomes visible again);
# and the hand-over to the task, on a loaded machine.
FAILOVER_BUDGET = VISIBILITY + 0.5 + 1.0 + 1.5
LEASE_LINE = "leasekeeper: renewing the messages of queue"


class Rig(Protocol):
    """What a scenario needs of one framework."""

    name: str
    ready: str  # the line a worker logs when it consumes
    own_reads: int  # GetQueueAttributes leasekeeper makes per queue
    # The renewer under which a task may hold its GIL for seconds without stopping
    # the renewals (None: the default one, where tasks run in other processes).
    gil_renewer: str | None
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
        renewer: str | None = None,
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


class LongTasks:
    """Three long-running tasks of a leased worker run once each - one that waits in
    the prefetch buffer, one that holds its GIL (in C, for its last 10 s), one that
    raises - while the same long task on a plain
    worker runs more than once; meanwhile, of a pair of leased workers, the one that
    runs a task is SIGKILLed and the other runs it within the timeout.

    ``begin()`` sends the tasks and starts the workers; ``finish()`` waits, kills,
    and checks. Another scenario may run in between."""

    def __init__(self, rig: Rig, setting: Setting) -> None:
        self.rig = rig
        self.setting = setting
        self.leased = new_queue_name(f"{rig.name}-leased")
        self.plain = new_queue_name(f"{rig.name}-plain")
        self.pair_queue = new_queue_name(f"{rig.name}-kill")
        self.failover = 0.0  # seconds from the SIGKILL to the task's start elsewhere

    def begin(self) -> None:
        rig, setting = self.rig, self.setting
        rig.send(self.leased, "long", LONG, busy=True)  # holds its GIL
        rig.send(self.leased, "fail", LONG, fail=True)
        # Received with the other two (moto answers in the order sent), it waits in the
        # prefetch buffer while they take both slots.
        rig.send(self.leased, "waiter", 0.1)
        rig.send(self.plain, "plain-long", LONG)
        rig.send(self.pair_queue, "warm-up")  # makes the queue
        common = {"endpoint": setting.proxy.endpoint, "journal_path": setting.path}
        workers = setting.workers
        self.worker = rig.start(
            workers,
            "leased",
            queue=self.leased,
            leases=True,
            concurrency=2,
            renewer=rig.gil_renewer,
            **common,
        )
        self.control = rig.start(
            workers, "plain", queue=self.plain, leases=False, concurrency=2, **common
        )
        self.pair = [
            rig.start(workers, name, queue=self.pair_queue, leases=True, concurrency=1, **common)
            for name in ("first", "second")
        ]

    def finish(self) -> None:
        rig, setting = self.rig, self.setting
        proxy, sqs = setting.proxy, setting.sqs
        # The killed worker, while the long tasks run.
        for member in self.pair:
            member.wait_ready(rig.ready)
        wait_for("the warm-up task", lambda: queue_is_empty(sqs, self.pair_queue))
        rig.send(self.pair_queue, "victim", VISIBILITY + 1)
        wait_for("the victim to start", lambda: setting.starts("victim"))
        started_on = setting.starts("victim")[0].worker
        first = next(member for member in self.pair if member.name == started_on)
        other = next(member for member in self.pair if member is not first)
        # Killed after its lease was renewed: without the renewal the message would be
        # visible again by now, and the other worker would have taken it.
        wait_for("a renewal of the victim", lambda: Traffic(proxy, self.pair_queue).renewals())
        first.kill()
        killed_at = time.time()
        wait_for("the victim to start again", lambda: len(setting.starts("victim")) >= 2)
        again = setting.starts("victim")[1]
        assert again.worker == other.name
        # The renewals never hid it any longer than the timeout SQS applies.
        self.failover = again.at - killed_at
        assert self.failover <= FAILOVER_BUDGET, self.failover

        def done() -> bool:
            entries = journal.read(setting.path)
            return (
                journal.count(entries, "end", "long") >= 1
                and journal.count(entries, "fail", "fail") >= 1
                and journal.count(entries, "end", "waiter") >= 1
                and journal.count(entries, "end", "victim") >= 1
                and journal.count(entries, "start", "plain-long") >= 2
                and queue_is_empty(sqs, self.leased)
                and queue_is_empty(sqs, self.pair_queue)
            )

        wait_for("every task to end and the leased queues to empty", done, timeout=120)
        self.control.kill()
        assert stop_all([self.worker, other]) == [0, 0]
        self.check(other)

    def check(self, other: WorkerProcess) -> None:
        proxy = self.setting.proxy
        entries = journal.read(self.setting.path)
        # With leasekeeper each task ran once, the one that waited in the buffer
        # included; without, the long task was delivered again while it ran.
        for label in ("long", "fail", "waiter"):
            assert journal.count(entries, "start", label) == 1, (label, entries)
        started = {e.label: e.at for e in entries if e.event == "start"}
        assert started["waiter"] > max(started["long"], started["fail"]) + 2 * VISIBILITY
        assert journal.count(entries, "start", "plain-long") >= 2, entries
        assert journal.count(entries, "start", "victim") == 2
        assert journal.count(entries, "end", "victim") == 1

        traffic = Traffic(proxy, self.leased)
        assert sorted(traffic.received().values()) == [1, 1, 1], "each message received once"
        receipts = {
            label: receipt
            for label, (receipt,) in traffic.receipts_by_label(self.rig.label).items()
        }
        assert set(receipts) == {"long", "fail", "waiter"}
        # Renewed to the timeout SQS applies: the waiter while it waited, the long task
        # while it held its GIL (the renewals run in another process).
        assert {renewal.timeout for renewal in traffic.renewals()} == {VISIBILITY}
        for label in ("long", "waiter", "fail"):
            assert len(traffic.renewals_of(receipts[label])) >= 2, label
        # The task that raised is handled by the framework's own rules (deleted), and
        # no message is renewed after its delete.
        assert set(traffic.deleted_at()) == set(receipts.values())
        assert traffic.renewed_after_delete() == []
        assert Traffic(proxy, self.pair_queue).renewed_after_delete() == []

        assert LEASE_LINE in self.worker.log_text()
        assert_clean_log(self.worker, *self.rig.failure_lines)
        assert_clean_log(other)


class ShortTasks:
    """``tasks`` short tasks cost no more SQS calls per task with leasekeeper than
    without, but for its renewals (and the attribute read it needs): the rig's worker
    receives the same batches either way. ``begin()`` and ``finish()`` as for
    ``LongTasks``."""

    def __init__(self, rig: Rig, setting: Setting, *, tasks: int, concurrency: int) -> None:
        self.rig = rig
        self.setting = setting
        self.tasks = tasks
        self.concurrency = concurrency
        self.leased = new_queue_name(f"{rig.name}-short")
        self.plain = new_queue_name(f"{rig.name}-short-plain")

    def begin(self) -> None:
        if self.rig.sends_while_consumed:
            # The workers start while the tasks are sent: that takes as long again.
            self.start_workers()
        for queue in (self.leased, self.plain):
            self.rig.send_noops(queue, [f"{queue}-{index}" for index in range(self.tasks)])
        if not self.rig.sends_while_consumed:
            self.start_workers()

    def start_workers(self) -> None:
        for queue, leases in ((self.leased, True), (self.plain, False)):
            self.rig.start(
                self.setting.workers,
                queue,
                endpoint=self.setting.proxy.endpoint,
                queue=queue,
                journal_path=self.setting.path,
                leases=leases,
                concurrency=self.concurrency,
            )

    def finish(self) -> str:
        """Wait, check; a line that says what it cost."""
        tasks, leased, plain, sqs = self.tasks, self.leased, self.plain, self.setting.sqs

        def ended(queue: str) -> int:
            return sum(
                1 for e in journal.read(self.setting.path) if e.label.startswith(f"{queue}-")
            )

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
        with_leases = Traffic(self.setting.proxy, leased)
        without = Traffic(self.setting.proxy, plain)
        for traffic in (with_leases, without):
            received = traffic.received()
            assert len(received) == tasks and set(received.values()) == {1}, "each received once"

        calls = with_leases.per_task_calls()
        renewal_calls = calls.pop("ChangeMessageVisibilityBatch", 0)
        reads = sum(
            1
            for call in with_leases.calls
            if call.action == "GetQueueAttributes"
            # leasekeeper reads them all once (SQSBackend.queue_attributes)
            and call.request.get("AttributeNames") in (["VisibilityTimeout"], ["All"])
        )
        assert reads == self.rig.own_reads  # the queue's VisibilityTimeout, at its first message
        calls -= Counter({"GetQueueAttributes": reads})
        baseline = without.per_task_calls()
        assert calls - baseline == Counter(), (calls, baseline)
        total = sum(with_leases.per_task_calls().values())
        assert total <= sum(baseline.values()) + renewal_calls + reads
        return (
            f"{self.rig.name}, {tasks} short tasks: {total / tasks:.3f} SQS calls per task "
            f"with leasekeeper ({renewal_calls} renewal calls, {reads} attribute read), "
            f"{sum(baseline.values()) / tasks:.3f} without"
        )
