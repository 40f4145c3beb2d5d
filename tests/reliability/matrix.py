"""The fault matrix: one simulated fleet run per (fault kind, rate, queue) on a ManualClock.

A run sends ``messages`` jobs into a MemoryQueue (behind a ``QueueSpy`` and a
``FaultyBackend``). Our consumer receives up to ``concurrency`` at a time, leases
each with a LeaseManager and "works" on it for 1-30 minutes of simulated time;
9 in 10 jobs succeed (complete), 1 in 10 fail (release, sometimes with a delay).
A handler that sees ``lease.lost`` stops without completing; one whose complete
fails transiently tries again on the next step, and releases after three tries.
A competing consumer polls the queue every step: a message under an active lease
must never reach it; re-deliveries (after a loss, a release, a dropped receive)
it processes itself. A run ends when every message is deleted; the
``InvariantChecker`` is consulted after every step and after ``close()``.

``python -m tests.reliability.figures`` prints every case's figures as a table.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from leasekeeper import BackendError, Lease, LeaseLost, LeaseManager, Message
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import Faults, FaultyBackend, ManualClock
from tests.reliability.invariants import InvariantChecker, QueueSpy, leasekeeper_threads

VISIBILITY = 30.0
TICK = 1.0
STEP = 10.0  # seconds of simulated time between the consumers' turns
SPIKE = 15.0  # a latency spike longer than the extend threshold (10 s)

KINDS = (
    "none",
    "retry",
    "throttle",
    "exception",
    "malformed",
    "lost",
    "fatal",
    "capped",
    "stale",
    "dropped",
    "latency",
    "spike",
)
TIMING_KINDS = ("latency", "spike")  # faults that may exceed the budget on purpose
RATES = (0.05, 0.3)


@dataclass(frozen=True)
class QueueShape:
    rotate: bool
    batch: int

    @property
    def name(self) -> str:
        return f"{'rotating' if self.rotate else 'fixed'}-b{self.batch}"


QUEUES = (
    QueueShape(rotate=False, batch=10),
    QueueShape(rotate=True, batch=10),
    QueueShape(rotate=True, batch=1),
    QueueShape(rotate=False, batch=1),
)


@dataclass(frozen=True)
class Case:
    kind: str
    rate: float
    queue: QueueShape
    messages: int = 30
    concurrency: int = 10
    seed: int = 1

    @property
    def id(self) -> str:
        return f"{self.kind}-{self.rate:g}-{self.queue.name}"


def faults_for(kind: str, rate: float) -> dict[str, Faults]:
    """Which operations a fault kind hits in the matrix."""
    ops = ("extend", "delete", "release")
    if kind == "none":
        return {}
    if kind in ("retry", "lost", "fatal", "stale", "throttle", "exception", "malformed"):
        faults = {op: Faults(**{kind: rate}) for op in ops}
        if kind in ("throttle", "exception"):
            faults["receive"] = Faults(**{kind: rate})
        return faults
    if kind == "capped":
        return {"extend": Faults(capped=rate)}
    if kind == "dropped":
        return {"receive": Faults(lost=rate)}
    if kind == "latency":  # every call slow, within the budget: 0.25 s / 1.5 s
        return {op: Faults(latency=rate * 5) for op in (*ops, "receive")}
    if kind == "spike":
        return {op: Faults(spike=rate, spike_latency=SPIKE) for op in (*ops, "receive")}
    raise ValueError(kind)


@dataclass
class Figures:
    case: str
    sim_hours: float = 0.0
    lease_hours: float = 0.0
    leases: int = 0
    extend_calls: int = 0
    extended: int = 0
    extend_errors: int = 0
    retries: int = 0
    lost: int = 0
    abandoned: int = 0
    capped: int = 0
    lapses: int = 0
    margin_warnings: int = 0
    completed: int = 0
    released: int = 0
    exposures: int = 0
    stolen_while_active: int = 0
    redelivered: int = 0  # processed by the competing consumer
    duplicates: int = 0  # messages whose handler succeeded more than once
    injected: int = 0
    inner_lost: int = 0
    wall_seconds: float = 0.0
    by_kind: dict[str, int] = field(default_factory=dict)


@dataclass
class Job:
    lease: Lease
    finish_at: float
    succeed: bool
    delay: float
    tries: int = 0


@dataclass
class Run:
    """Everything a finished run leaves for the test to assert on."""

    case: Case
    clock: ManualClock
    queue: MemoryQueue
    spy: QueueSpy
    faulty: FaultyBackend
    manager: LeaseManager
    checker: InvariantChecker
    figures: Figures
    sent: list[str]
    threads_before: set[threading.Thread]
    finished: bool


def run_case(case: Case, *, max_hours: float = 24.0) -> Run:
    started = time.perf_counter()
    rng = random.Random(case.seed)
    clock = ManualClock()
    queue = MemoryQueue(
        VISIBILITY, clock=clock, rotate_receipts=case.queue.rotate, max_batch=case.queue.batch
    )
    spy = QueueSpy(queue)
    faulty = FaultyBackend(spy, seed=case.seed, clock=clock, **faults_for(case.kind, case.rate))  # type: ignore[arg-type]
    checker = InvariantChecker(
        spy, tick=TICK, faulty=faulty, timing_faults=case.kind in TIMING_KINDS
    )
    threads_before = leasekeeper_threads()
    manager = checker.attach(
        LeaseManager(
            faulty,
            clock=clock,
            visibility_timeout=VISIBILITY,
            timer_interval=TICK,
            minimal_life=2.0,
            on_lost=checker.on_lost,
            jitter_seed=case.seed,  # the retry jitter: a run is reproducible
        )
    )
    sent = [queue.send(f"job {i}") for i in range(case.messages)]
    ours: set[str] = set()  # ids our consumer ever received
    jobs: list[Job] = []
    redelivered = 0
    start = clock.now()
    end = start + max_hours * 3600
    steps = 0

    while len(queue) and clock.now() < end:
        now = clock.now()
        for job in list(jobs):
            if _step_job(job, now, checker):
                jobs.remove(job)
        # The competing consumer goes first: re-deliveries are its to process.
        redelivered += _compete(queue, ours, checker)
        if len(jobs) < case.concurrency:
            try:
                got = faulty.receive(
                    max_messages=min(case.queue.batch, case.concurrency - len(jobs)),
                    visibility_timeout=VISIBILITY,
                )
            except Exception:
                got = []
            checker.stolen(got)  # our own receive must not see an actively leased message
            for message in got:
                ours.add(message.id)
                lease = checker.track(manager.register(message))
                succeed = rng.random() >= 0.1
                jobs.append(
                    Job(
                        lease,
                        finish_at=clock.now() + rng.uniform(60, 30 * 60),
                        succeed=succeed,
                        delay=rng.choice((0.0, 0.0, 60.0)),
                    )
                )
        clock.advance(STEP)
        steps += 1
        checker.check(full=steps % 30 == 0)

    for job in jobs:  # out of time: the run failed; end what is left
        job.lease.release()
    manager.close()
    faulty.close()
    checker.check_closed(release=True, threads_before=threads_before)
    calls_at_close = dict(spy.calls)
    clock.advance(3600)  # nothing may touch the queue after close()
    if dict(spy.calls) != calls_at_close:
        checker.violations.append("(5) the queue was called after close()")

    stats = manager.stats()
    figures = Figures(
        case=case.id,
        sim_hours=(clock.now() - start - 3600) / 3600,
        lease_hours=sum(_held(lease, clock) for lease in checker.leases) / 3600,
        leases=stats.registered,
        extend_calls=stats.extend_calls,
        extended=stats.extended,
        extend_errors=stats.extend_errors,
        retries=stats.retries,
        lost=stats.lost,
        abandoned=stats.abandoned,
        capped=stats.capped,
        lapses=stats.lapses,
        margin_warnings=stats.margin_warnings,
        completed=stats.completed,
        released=stats.released,
        exposures=len(spy.exposures),
        stolen_while_active=len(checker.stolen_while_active),
        redelivered=redelivered,
        duplicates=sum(1 for times in checker.successes.values() if len(times) > 1),
        injected=faulty.injected(),
        inner_lost=spy.inner_lost(),
        wall_seconds=time.perf_counter() - started,
        by_kind=faulty.counts,
    )
    return Run(
        case,
        clock,
        queue,
        spy,
        faulty,
        manager,
        checker,
        figures,
        sent,
        threads_before,
        finished=not len(queue),
    )


def _held(lease: Lease, clock: ManualClock) -> float:
    # How long the lease was held: registration to the last known deadline.
    return max(0.0, min(lease.visible_until, clock.now()) - lease.registered_at)


def _step_job(job: Job, now: float, checker: InvariantChecker) -> bool:
    """Advance one simulated handler; True when it is done."""
    lease = job.lease
    if lease.is_lost:
        return True  # the handler checks lease.lost and stops: not ours any more
    if job.finish_at > now:
        return False
    try:
        if not job.succeed:
            lease.release(job.delay)
            return True
        if job.tries == 0:
            checker.succeeded(lease.id)
        job.tries += 1
        lease.complete()
    except LeaseLost:
        return True
    except BackendError:
        if job.tries < 3:
            return False  # try the delete again on the next step
        lease.release()  # give up: another consumer gets it
    return True


def _compete(queue: MemoryQueue, ours: set[str], checker: InvariantChecker) -> int:
    """The competing consumer's turn: process re-deliveries, hand fresh ones back."""
    got: list[Message] = queue.receive(max_messages=10, visibility_timeout=VISIBILITY)
    checker.stolen(got)
    fresh = [m.handle for m in got if m.id not in ours]
    redelivered = [m for m in got if m.id in ours]
    for start in range(0, len(fresh), queue.max_batch):
        queue.release(fresh[start : start + queue.max_batch], 0.0)
    for message in redelivered:
        checker.succeeded(message.id)
        queue.delete([message.handle])
    return len(redelivered)


def all_cases(**overrides: Any) -> list[Case]:
    return [
        Case(kind, rate, shape, **overrides)
        for kind in KINDS
        for rate in (RATES if kind != "none" else (0.0,))
        for shape in QUEUES
    ]
