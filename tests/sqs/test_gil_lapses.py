"""Issue 12's scenario on SQS as the real service behaves: handlers that hold the GIL
past the visibility timeout while another consumer polls the queue.

Between a real boto3 client and moto runs the fault proxy in ``real_sqs`` mode
(tests/sqs/fault_proxy.py): like the real service, and unlike moto, it answers a
late extend 200 and does nothing, rejects an old handle's extend once someone
received the message again, and answers a delete with an old handle 200 and
deletes nothing. A competing consumer in a process of its own (it polls on while
this process is frozen) receives through the same proxy and keeps what it gets.

A handler holds the GIL for 3.5 s at a 2 s visibility timeout, so no renewal can
run in this process (the thread renewer's, chosen here: a renewer process would go
on renewing): every lease's deadline passes, and the competitor takes the messages. Checked,
as a user would: every such lease ends lost and its handler is told (LeaseLost),
none is reported completed, nothing is deleted from under the competitor, and
leasekeeper did not even try (the proxy saw no delete, and no late extend whose
lease did not end lost). The control: the same handlers sleeping lose nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from leasekeeper import LeaseLost, LeaseManager, LeaseState, Message, Worker
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.lease import Lease
from tests.helpers import hold_the_gil
from tests.sqs.competitor import Competitor
from tests.sqs.conftest import make_client
from tests.sqs.fault_proxy import LATE, STALE, FaultProxyProcess
from tests.sqs.test_moto import TIMING, queue_counts, receive_n

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

HOLD = 3.5  # seconds with the GIL held, against the 2 s visibility timeout
SETTLE = 60.0  # generous limit for waits that end on an event (a loaded machine)


@pytest.fixture
def real_sqs(moto_endpoint: str) -> Iterator[Any]:
    with FaultProxyProcess(moto_endpoint, error_rate=0.0, real_sqs=True) as proxy:
        yield proxy


def send_jobs(moto_endpoint: str, url: str, count: int) -> set[str]:
    admin = make_client(moto_endpoint)
    return {
        admin.send_message(QueueUrl=url, MessageBody=f"job {n}")["MessageId"] for n in range(count)
    }


class Reports:
    """``on_lost`` reports, by message id."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reasons: dict[str, list[str]] = {}

    def __call__(self, lease: Lease, reason: str) -> None:
        with self.lock:
            self.reasons.setdefault(lease.id, []).append(reason)


def service_view(proxy: Any) -> tuple[set[str], set[str], set[str]]:
    """From the proxy: ids deleted, ids with a delete that did nothing (an old
    handle), ids with an extend that did nothing (late or an old handle)."""
    events = proxy.stats()["real_sqs"]["events"]
    deleted = {e["id"] for e in events if e["action"] == "delete" and e["verdict"] == "forward"}
    stale_deletes = {e["id"] for e in events if e["action"] == "delete" and e["verdict"] == STALE}
    void_extends = {
        e["id"] for e in events if e["action"] == "extend" and e["verdict"] in (LATE, STALE)
    }
    return deleted, stale_deletes, void_extends


def test_leases_starved_by_a_gil_holder_end_lost_and_delete_nothing(
    moto_endpoint: str, make_queue: Any, real_sqs: Any
) -> None:
    url = make_queue(visibility_timeout=2)
    ids = send_jobs(moto_endpoint, url, 5)
    reports = Reports()
    backend = SQSBackend(make_client(real_sqs.url), url)
    manager = LeaseManager(backend, on_lost=reports, renewer="thread", **TIMING)
    with Competitor(real_sqs.url, url) as other:
        leases = [manager.register(m) for m in receive_n(backend, 5)]
        other.go()
        hold_the_gil(HOLD)  # no renewal runs; the other process polls on
        held_until = time.monotonic()
        # Every deadline passed during the hold; the competitor takes the messages.
        assert all(lease.visible_until < held_until for lease in leases)
        assert other.wait_for(ids, SETTLE), f"the competitor got only {other.received}"
        outcomes: dict[str, str] = {}
        for lease in leases:
            try:
                lease.complete()
                outcomes[lease.id] = "completed"
            except LeaseLost:
                outcomes[lease.id] = "lost"
    manager.close()
    stats = manager.stats()
    deleted, stale_deletes, void_extends = service_view(real_sqs)
    print(f"\noutcomes {sorted(outcomes.values())}, competitor got {len(other.received)}")
    print(f"lost reasons: {sorted({r for rs in reports.reasons.values() for r in rs})}")

    assert outcomes == dict.fromkeys(ids, "lost"), "a lapsed lease was reported completed"
    assert all(lease.state is LeaseState.LOST and lease.lost.is_set() for lease in leases)
    assert {mid: len(r) for mid, r in reports.reasons.items()} == dict.fromkeys(ids, 1)
    assert stats.lost == 5 and stats.completed == 0, stats
    # Nothing deleted from under the competitor, and no delete even tried.
    assert (deleted, stale_deletes) == (set(), set())
    assert queue_counts(make_client(moto_endpoint), url) == (0, 5)
    # An extend that was out during the hold reached the service late: its lease is lost.
    assert void_extends <= set(reports.reasons)


def run_worker(
    moto_endpoint: str, url: str, proxy: Any, job: Any, ids: set[str]
) -> tuple[Worker, Reports, Competitor, set[str]]:
    """A Worker of 3 handlers through the proxy, with a competitor that starts
    polling when the first handler starts. Runs until every message is either
    deleted or with the competitor; returns what the service deleted."""
    reports = Reports()
    manager = LeaseManager(
        SQSBackend(make_client(proxy.url), url), on_lost=reports, renewer="thread", **TIMING
    )
    with Competitor(proxy.url, url) as other:

        def handler(message: Message) -> None:
            other.go()  # the whole batch is leased by now (the Worker leases it first)
            job(message)

        worker = Worker(manager, handler, concurrency=3, batch_size=3, wait_seconds=1)
        worker.start()
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            deleted = service_view(proxy)[0]
            done = worker.stats.completed + worker.stats.lost + worker.stats.failed
            settled = worker.stats.received >= 3 and done + worker.stats.refused == (
                worker.stats.received
            )  # every handler that started has finished
            if settled and (deleted | set(other.received)) >= ids:
                break
            time.sleep(0.1)
        worker.stop(timeout=SETTLE)
    manager.close()
    return worker, reports, other, service_view(proxy)[0]


def test_a_worker_whose_handlers_hold_the_gil_loses_the_leases_and_reports_it(
    moto_endpoint: str, make_queue: Any, real_sqs: Any
) -> None:
    url = make_queue(visibility_timeout=2)
    ids = send_jobs(moto_endpoint, url, 3)
    first_deliveries: set[str] = set()
    lock = threading.Lock()

    def job(message: Message) -> None:
        with lock:
            first = message.receive_count == 1
            if first:
                first_deliveries.add(message.id)
        if first:
            hold_the_gil(HOLD)
        # A later delivery (the worker got it back before the competitor did, on a
        # loaded machine) is a short job, done in time.

    worker, reports, other, deleted = run_worker(moto_endpoint, url, real_sqs, job, ids)
    stats = worker.manager.stats()
    _, stale_deletes, void_extends = service_view(real_sqs)
    competitor = set(other.received)
    print(f"\nworker {worker.stats}; competitor got {len(competitor)}, deleted {len(deleted)}")

    # At least one handler held the GIL; on a loaded machine a handler thread may not
    # have started before that, and then its lease lapsed and it never ran.
    assert first_deliveries and first_deliveries <= ids
    # Every GIL-starved lease ended lost and its handler was told.
    assert set(reports.reasons) >= ids
    assert worker.stats.lost == stats.lost == sum(len(r) for r in reports.reasons.values())
    assert worker.stats.lost >= 3 and worker.stats.failed == 0
    # None reported completed while the competitor had it; nothing deleted from under it.
    assert not deleted & competitor
    assert stale_deletes == set()
    assert worker.stats.completed == len(deleted)
    assert deleted | competitor == ids
    assert queue_counts(make_client(moto_endpoint), url) == (0, len(competitor))
    assert void_extends <= set(reports.reasons)


def test_the_same_worker_with_sleeping_handlers_loses_nothing(
    moto_endpoint: str, make_queue: Any, real_sqs: Any
) -> None:
    url = make_queue(visibility_timeout=2)
    ids = send_jobs(moto_endpoint, url, 3)
    worker, reports, other, deleted = run_worker(
        moto_endpoint, url, real_sqs, lambda message: time.sleep(HOLD), ids
    )
    stats = worker.manager.stats()
    _, stale_deletes, void_extends = service_view(real_sqs)
    print(f"\nworker {worker.stats}; send lag p99 {stats.send_lag_p99 * 1000:.0f} ms")

    assert (worker.stats.completed, worker.stats.lost, worker.stats.failed) == (3, 0, 0), stats
    assert (stats.lost, stats.lapses, reports.reasons) == (0, 0, {}), stats
    assert deleted == ids and other.received == []
    assert (stale_deletes, void_extends) == (set(), set())
    assert stats.extended >= 3
    assert queue_counts(make_client(moto_endpoint), url) == (0, 0)


def test_a_delete_that_reaches_the_service_after_the_deadline_is_no_completion(
    moto_endpoint: str, make_queue: Any, real_sqs: Any
) -> None:
    """complete() sends its delete in time, but the request is slow (a congested
    network, or the GIL taken right after the deadline check) and reaches SQS after
    the deadline, when the competitor has received the message: SQS answers 200 and
    deletes nothing. An extend answered that late ends the lease lost; so does
    this delete (rule 5), instead of reporting a completion while another consumer
    has the message."""
    url = make_queue(visibility_timeout=2)
    [message_id] = send_jobs(moto_endpoint, url, 1)
    client = make_client(real_sqs.url)
    backend = SQSBackend(client, url)
    manager = LeaseManager(backend, renewer="thread", **TIMING)
    with Competitor(real_sqs.url, url) as other:

        def slow_network(**_: Any) -> None:
            # The delete is on its way until the deadline passed and the other consumer
            # received the message (while complete() holds the lease, nothing renews it).
            assert other.wait_for({message_id}, SETTLE), "the competitor got nothing"

        client.meta.events.register("before-send.sqs.DeleteMessageBatch", slow_network)
        lease = manager.register(receive_n(backend, 1)[0])
        other.go()
        outcome = "completed"
        try:
            lease.complete()
        except LeaseLost:
            outcome = "lost"
    manager.close()
    _, stale_deletes, _ = service_view(real_sqs)
    assert stale_deletes == {message_id}  # the service answered 200 and deleted nothing
    assert queue_counts(make_client(moto_endpoint), url) == (0, 1)
    assert outcome == "lost"
    assert lease.state is LeaseState.LOST and manager.stats().lost == 1
