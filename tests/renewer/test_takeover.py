"""A renewer process that dies is replaced, and the new one takes over its leases.

On every backend a renewer process serves (SQS on moto, MNS on the local server,
Azure on Azurite, Redis Streams): the renewer is SIGKILLed (as the OOM killer does)
while the worker holds leases - one renewed already (on MNS and Azure its receipt
has rotated: the worker must hand on the newest), one still held back - and
another consumer, asking all along, never receives their messages; both complete
once, none is lost, and a new renewer renews them. Only a lease whose deadline
passed before the takeover is lost; a stale receipt handed on is refused by the
service, never kept. Timings are bounds for a loaded machine, never asserted
durations.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

import leasekeeper
from leasekeeper import LeaseLost, LeaseManager, LeaseState, LostReason, Worker
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.azure import AzureQueueBackend
from leasekeeper.backends.contract import Backend, Message
from tests.contract.conftest import made_subject

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

BACKENDS = ("sqs-moto", "mns-local", "azure-azurite", "redis")
VISIBILITY = 6.0  # the leases': renewed when 3 s remain, held back 2.5 s at first
# Room for a loaded machine: the new renewer starts (imports its SDK) and makes its
# first calls - to a local service as loaded as it - within the 3 s a lease has left.
TIMING: dict[str, Any] = {
    "visibility_timeout": VISIBILITY,
    "extend_threshold": 3.0,
    "timer_interval": 0.5,
    "minimal_life": 1.0,
}
JOB_VISIBILITY = 4.0  # issue 47's check: a 9 s job at a 4 s visibility


@dataclass
class Queue:
    """A queue, the backend a manager leases on, and another consumer of it."""

    name: str
    backend: Backend
    other: Backend  # another consumer: receives what becomes visible
    send: Callable[[str], object]
    rotates: bool

    def receive(self, n: int) -> list[Message]:
        got: list[Message] = []
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            got += self.backend.receive(
                max_messages=n - len(got), wait_seconds=1, visibility_timeout=VISIBILITY
            )
        assert len(got) == n, f"received {len(got)} of {n}"
        return got

    def others_get(self, seconds: float) -> list[Message]:
        """What the other consumer receives first while it asks for ``seconds`` (no
        more once it got something): none, or the messages of one receive."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            got = self.other.receive(
                max_messages=10, wait_seconds=0.5, visibility_timeout=VISIBILITY
            )
            if got:
                return got
        return []


@pytest.fixture(params=BACKENDS)
def queue(request: pytest.FixtureRequest, renewer_env: None) -> Iterator[Queue]:
    name = request.param
    if name == "redis":
        import redis

        url: str = request.getfixturevalue("redis_url")
        stream = f"takeover-{uuid.uuid4().hex[:12]}"
        address = f"{url}?stream={stream}&group=g"
        backend = leasekeeper.connect(address, consumer="a", visibility_timeout=int(VISIBILITY))
        other = leasekeeper.connect(address, consumer="b", visibility_timeout=int(VISIBILITY))
        admin = redis.Redis.from_url(url)
        try:
            send = lambda body: admin.xadd(stream, {"body": body})  # noqa: E731
            yield Queue(name, backend, other, send, False)
        finally:
            admin.delete(stream)
            admin.close()
        return
    with made_subject(name, request) as subject:
        backend = subject.backend
        if isinstance(backend, AzureQueueBackend):
            # Leased in a process, the queue without the subject's client_factory (code
            # a renewer process cannot call: such a backend renews in a thread).
            backend = AzureQueueBackend(backend.queue_client)
            subject.cleanup.append(backend.close)
        yield Queue(name, backend, backend, subject.send, backend.rotates_receipts)


class Competitor:
    """Another consumer, asking (from a thread, once started) for what is visible."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.received: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="competitor", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            got = self.queue.other.receive(
                max_messages=10, wait_seconds=0.5, visibility_timeout=VISIBILITY
            )
            self.received += [m.id for m in got]

    def start(self) -> None:
        self._thread.start()

    def __enter__(self) -> Competitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(30)


def kill_renewer(manager: LeaseManager) -> int:
    """SIGKILL the manager's renewer process (as the OOM killer does); its pid."""
    pid = manager.renewer_pid
    assert pid not in (0, os.getpid())
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def manager_on(queue: Queue, lost: list[Any]) -> LeaseManager:
    return LeaseManager(
        queue.backend,
        renewer="process",
        on_lost=lambda lease, reason: lost.append((lease, reason)),
        **TIMING,
    )


def test_a_killed_renewer_s_leases_are_taken_over_and_none_is_lost(
    queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    """One lease renewed already (its receipt rotated where receipts do), one still
    held back when the renewer is killed: the other consumer receives neither in two
    visibility timeouts, both are renewed by the new renewer and complete once."""
    caplog.set_level(logging.WARNING, logger="leasekeeper.renewer")
    for n in range(2):
        queue.send(f"job {n}")
    lost: list[Any] = []
    manager = manager_on(queue, lost)
    try:
        [first] = queue.receive(1)
        renewed = manager.register(first)
        wait_for(lambda: renewed.extensions >= 1, 20, "the first renewal")
        if queue.rotates:  # the worker was told the newest receipt
            assert renewed.receipt != first.receipt
        [second] = queue.receive(1)
        held = manager.register(second)  # held back there: its first renewal is 3 s away
        dead = kill_renewer(manager)
        assert queue.others_get(2 * VISIBILITY) == []
        assert manager.renewer_pid not in (0, dead)
        assert renewed.state is held.state is LeaseState.ACTIVE
        assert held.extensions >= 1, "the held lease was not renewed by the new renewer"
        extended = renewed.extensions
        wait_for(lambda: renewed.extensions > extended, 20, "a renewal by the new renewer")
        assert manager.complete_many([renewed, held]) == [None, None]
        stats = manager.stats()
        assert (stats.lost, stats.lost_reasons) == (0, {})
        assert lost == []
        assert manager.renewer.replaced == 1  # type: ignore[attr-defined]
    finally:
        manager.close()
    assert queue.others_get(1.0) == [], "a completed message came back"
    [line] = [r.getMessage() for r in caplog.records if "took over" in r.getMessage()]
    assert f"took over 2 lease(s) from renewer process {dead}" in line and "s after it died" in line


def test_a_request_the_dead_renewer_never_answered_is_asked_of_the_new_one(
    queue: Queue,
) -> None:
    """A complete and a release sent as the renewer dies wait for the new renewer and
    are done there: the one message deleted, the other back on the queue."""
    for n in range(2):
        queue.send(f"job {n}")
    lost: list[Any] = []
    manager = manager_on(queue, lost)
    try:
        leases = [manager.register(m) for m in queue.receive(2)]
        wait_for(lambda: all(lease.extensions >= 1 for lease in leases), 20, "renewals")
        kill_renewer(manager)
        leases[0].complete()  # asked of the dead renewer or the new one: done once
        leases[1].release(0)
        assert [lease.state for lease in leases] == [LeaseState.COMPLETED, LeaseState.RELEASED]
        back = queue.others_get(VISIBILITY)
        assert [m.id for m in back] == [leases[1].id]
        assert lost == [] and manager.stats().lost == 0
    finally:
        manager.close()


@pytest.mark.parametrize("queue", ["sqs-moto", "mns-local", "azure-azurite"], indirect=True)
def test_only_a_lease_whose_deadline_passed_before_the_takeover_is_lost(
    queue: Queue,
) -> None:
    """A renewer that stopped renewing (SIGSTOP) and was then killed: the lease whose
    deadline passed meanwhile is lost (``renewer_died``); the other, with time left,
    is taken over and completes. (Not on Redis: a message's invisibility there is the
    group's, one length for all.)"""
    for n in range(2):
        queue.send(f"job {n}")
    lost: list[Any] = []
    manager = manager_on(queue, lost)
    [short] = queue.receive(1)
    [long] = queue.backend.receive(max_messages=1, wait_seconds=1, visibility_timeout=30)
    stopped = 0
    try:
        doomed, kept = manager.register(short), manager.register(long)
        stopped = manager.renewer_pid
        os.kill(stopped, signal.SIGSTOP)
        wait_for(lambda: doomed.visible_for() == 0, 20, "the short lease's deadline")
        time.sleep(0.2)
        os.kill(stopped, signal.SIGKILL)
        os.kill(stopped, signal.SIGCONT)
        wait_for(lambda: doomed.state is not LeaseState.ACTIVE, 60, "the takeover")
        assert doomed.state is LeaseState.LOST
        assert doomed.lost_reason is LostReason.RENEWER_DIED
        assert "deadline passed" in (doomed.reason or "")
        wait_for(lambda: len(lost) == 1, 10, "on_lost")  # (on the notifier thread)
        assert [lease for lease, _ in lost] == [doomed]
        with pytest.raises(LeaseLost):
            doomed.complete()
        assert kept.state is LeaseState.ACTIVE
        kept.complete()
        stats = manager.stats()
        assert (stats.lost, stats.lost_reasons) == (1, {"renewer_died": 1})
    finally:
        manager.close()


@pytest.mark.parametrize("queue", ["mns-local", "azure-azurite"], indirect=True)
def test_a_stale_receipt_handed_on_is_refused_never_kept(queue: Queue) -> None:
    """Where receipts rotate, a renewer may die between an extend's answer and its
    notice to the worker: the receipt the worker hands on is then stale. Made so
    here by extending the message with it out of band while the renewer is stopped:
    the new renewer's extend is refused, the lease is lost (``rejected``), and the
    message is neither deleted nor released by it: it comes back at the deadline
    the out-of-band extend set."""
    queue.send("job")
    lost: list[Any] = []
    manager = manager_on(queue, lost)
    try:
        [message] = queue.receive(1)
        lease = manager.register(message)
        stopped = manager.renewer_pid
        os.kill(stopped, signal.SIGSTOP)
        [outcome] = queue.backend.extend([lease.handle()], 8.0)  # the unreported extend
        assert outcome.kind == "ok" and outcome.receipt not in (None, lease.receipt)
        os.kill(stopped, signal.SIGKILL)
        os.kill(stopped, signal.SIGCONT)
        wait_for(lambda: lease.state is not LeaseState.ACTIVE, 30, "the lease's end")
        assert (lease.state, lease.lost_reason) == (LeaseState.LOST, LostReason.REJECTED)
        wait_for(lambda: len(lost) == 1, 10, "on_lost")  # (on the notifier thread)
        assert [reported for reported, _ in lost] == [lease]
        back = queue.others_get(20)
        assert [m.id for m in back] == [message.id], "the message was deleted or lost"
        assert back[0].receive_count == 2
    finally:
        manager.close()


JOB = 9.0  # seconds: over two visibility timeouts
KILL_AT = 1.0  # seconds into the job


def between_renewals(queue: Queue) -> None:
    """Where receipts rotate, wait until the job's first renewal is known here: a
    renewer killed while an extend of it is out leaves a receipt the worker never
    heard of, and the lease is lost (refused: see the stale receipt's test). At a
    4 s visibility a lease is renewed every second, and the first is due at the 1 s
    the kill comes at."""
    if queue.rotates:
        held = leasekeeper.current_lease()
        wait_for(lambda: held.extensions >= 1, 20, "the first renewal")


def test_a_worker_s_job_outlives_its_killed_renewer(queue: Queue) -> None:
    """Issue 47's check: the renewer process of a ``Worker`` (its default renewer)
    SIGKILLed 1 s into a 9 s job at a 4 s visibility: no other consumer receives the
    message, the job completes once, no lease is lost, and a new renewer serves -
    beside a CPU hog too (``python3 -c 'while True: pass' &``, as the suite is run)."""
    queue.send("a nine-second job")
    pids: list[int] = []

    def job(message: Message) -> None:
        other.start()  # once the message is the worker's
        time.sleep(KILL_AT)
        between_renewals(queue)
        pids.append(kill_renewer(worker.manager))
        time.sleep(JOB - KILL_AT)
        pids.append(worker.manager.renewer_pid)

    worker = Worker(queue.backend, job, visibility_timeout=JOB_VISIBILITY, wait_seconds=1)
    assert worker.manager.renewer.name == "process"
    with Competitor(queue) as other:
        stats = worker.run(until_idle=2.0)
    assert other.received == []
    assert (stats.received, stats.completed, stats.lost, stats.failed) == (1, 1, 0, 0)
    dead, serving = pids
    assert serving not in (0, dead)
    assert worker.manager.stats().lost == 0


def test_an_async_worker_s_job_outlives_its_killed_renewer(queue: Queue) -> None:
    """The same through ``AsyncWorker``: its manager's renewer process is replaced
    mid-job, and the job keeps its message."""
    queue.send("a nine-second job")
    pids: list[int] = []

    async def job(message: Message) -> None:
        other.start()  # once the message is the worker's
        await asyncio.sleep(KILL_AT)
        between_renewals(queue)
        pids.append(kill_renewer(worker.manager))
        await asyncio.sleep(JOB - KILL_AT)
        pids.append(worker.manager.renewer_pid)

    worker = AsyncWorker(queue.backend, job, visibility_timeout=JOB_VISIBILITY, wait_seconds=1)
    with Competitor(queue) as other:
        stats = asyncio.run(asyncio.wait_for(worker.run(until_idle=2.0), 120))
    assert other.received == []
    assert (stats.received, stats.completed, stats.lost, stats.failed) == (1, 1, 0, 0)
    dead, serving = pids
    assert serving not in (0, dead)
