"""Invariants (1) to (3) with a real boto3 client behind a fault-injecting proxy.

A proxy between the client and moto fails 30 % of the visibility calls
(ChangeMessageVisibilityBatch: extends and releases) as the service and network
do - 500, 503, throttling, reset connections, answers lost after the change was
applied - and adds 20-100 ms to every request. It also answers as the real SQS
does where moto does not (``real_sqs``: a late extend does nothing, an old
handle's extend fails and its delete deletes nothing). Jobs run for 2-5
visibility timeouts; one in five raises. Checked:

(1) a message is deleted only after its handler returned successfully (every
    DeleteMessageBatch entry is checked as the client sends it), a failed job's
    message is never deleted, and every delete the service confirmed removed the
    message (none was made with an old handle);
(2) no leased message reaches a second consumer polling the queue (through the
    proxy, so the service sees its receives), except a failed job's message after
    its lease was given up, or a message whose lease leasekeeper reported lost;
(3) every loss is reported: ``stats().lost`` equals the leases ``on_lost`` was
    told about, each of them with ``lease.lost`` set, and the Worker counted a
    loss for each handler that finished on a lost lease.

Not "nothing lost": on a loaded machine an extend can come back after the
lease's deadline, and then the lease *is* lost (rule 5); the test asserts that
such a loss is reported and does no harm, and prints the counts.

Run with the client settings the docs recommend and with boto3's defaults
(standard retries, 3 attempts, up to seconds of backoff inside one call), on
both call paths: the boto3 client's and the lean one (backends/sqs/lean.py).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import boto3
import pytest

from leasekeeper import Lease, LeaseManager, Message, Worker
from leasekeeper.backends.sqs import SQSBackend
from tests.sqs.conftest import REGION, make_client
from tests.sqs.fault_proxy import FaultProxyProcess
from tests.sqs.test_moto import TIMING as MOTO_TIMING
from tests.sqs.test_moto import Spy, queue_counts

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

JOBS = 30
# test_moto's 2 s timing; a failed job's message stays out of sight for the rest of the test.
TIMING: dict[str, Any] = {**MOTO_TIMING, "release_delay": 60}


def boto3_default_client(endpoint: str) -> Any:
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.mark.parametrize("path", ["boto3", "lean"])
@pytest.mark.parametrize("settings", ["recommended", "boto3-defaults"])
def test_invariants_hold_behind_a_proxy_failing_30_percent_of_visibility_calls(
    moto_endpoint: str, make_queue: Any, settings: str, path: str
) -> None:
    url = make_queue(visibility_timeout=2)
    admin = make_client(moto_endpoint)
    for start in range(0, JOBS, 10):
        admin.send_message_batch(
            QueueUrl=url,
            Entries=[{"Id": str(i), "MessageBody": str(i)} for i in range(start, start + 10)],
        )

    lock = threading.Lock()
    succeeded: set[str] = set()
    failed: set[str] = set()
    receipts: dict[str, str] = {}  # receipt -> message id, as the handlers saw them
    early_deletes: list[str] = []
    confirmed: set[str] = set()  # message ids whose delete the service confirmed
    handled: list[tuple[Lease, bool]] = []  # each handler's lease; did the handler return?
    reported: list[tuple[Lease, str]] = []  # on_lost

    def on_lost(lease: Lease, reason: str) -> None:
        with lock:
            reported.append((lease, reason))

    faults = {"error_rate": 0.3, "latency": 0.02, "jitter": 0.08, "seed": 30, "real_sqs": True}
    with FaultProxyProcess(moto_endpoint, **faults) as proxy:
        client = make_client(proxy.url) if settings == "recommended" else None
        client = client or boto3_default_client(proxy.url)
        backend = SQSBackend(client, url, fast_path=path == "lean")
        manager = LeaseManager(backend, on_lost=on_lost, renewer="thread", **TIMING)

        def handler(message: Message) -> None:
            job = int(str(message.body))
            lease = manager.get(message)
            assert lease is not None
            with lock:
                receipts[message.receipt] = message.id
            time.sleep(4 + (job % 7))  # 2 to 5 visibility timeouts, staggered
            if job % 5 == 4:
                with lock:
                    failed.add(message.id)
                    handled.append((lease, False))
                raise RuntimeError(f"job {job} failed")
            with lock:
                succeeded.add(message.id)
                handled.append((lease, True))

        def check_delete(params: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
            with lock:
                ids = {e["Id"]: receipts.get(e["ReceiptHandle"], "?") for e in params["Entries"]}
                context["leasekeeper-test-ids"] = ids
                early_deletes.extend(i for i in ids.values() if i not in succeeded)

        def record_delete(parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
            ids = context.get("leasekeeper-test-ids", {})
            with lock:
                confirmed.update(ids[e["Id"]] for e in parsed.get("Successful", []))

        lean = backend.lean
        if path == "boto3":
            events = client.meta.events
            events.register("provide-client-params.sqs.DeleteMessageBatch", check_delete)
            events.register("after-call.sqs.DeleteMessageBatch", record_delete)
        else:  # the same checks where the lean path sends and reads its deletes
            assert lean is not None and lean.usable()
            send = lean.call

            def checked(operation: str, params: Any, **options: Any) -> Any:
                context: dict[str, Any] = {}
                if operation == "DeleteMessageBatch":
                    check_delete(params, context)
                answer = send(operation, params, **options)
                if operation == "DeleteMessageBatch":
                    record_delete(answer, context)
                return answer

            lean.call = checked  # type: ignore[method-assign]
        # One message per receive: leases registered apart are due apart, so the
        # proxy sees many visibility calls rather than a few full batches.
        worker = Worker(manager, handler, concurrency=JOBS, batch_size=1, wait_seconds=1)
        worker.start()
        deadline = time.monotonic() + 60
        while worker.stats.received < JOBS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker.stats.received == JOBS, worker.stats
        # Every message is leased now: from here on a second consumer gets only what
        # leasekeeper gave up. It polls through the proxy, so the service sees it.
        with Spy(proxy.url, url) as spy:
            deadline = time.monotonic() + 90
            while len(succeeded) + len(failed) < JOBS and time.monotonic() < deadline:
                time.sleep(0.2)
            worker.stop(timeout=30)
        stats = manager.stats()
        manager.close()
        counts = proxy.stats()
        if path == "lean":  # it made the calls all along
            assert lean is not None and lean.usable()
    targeted, injected = counts["targeted"], counts["injected"]
    emulated = counts["real_sqs"]["counts"]
    lost_ids = {lease.id for lease, _ in reported}

    print(
        f"\n{settings}: visibility calls {targeted}, injected {injected}; "
        f"extended {stats.extended}, retries {stats.retries}, lost {stats.lost}, "
        f"lapses {stats.lapses}, send lag p99 {stats.send_lag_p99 * 1000:.0f} ms, "
        f"extend latency p99 {stats.extend_latency_p99 * 1000:.0f} ms; "
        f"the service saw {emulated}"
    )
    for lease, reason in reported:
        print(f"  lost {lease.id}: {reason}")
    # The faults really happened, of every kind.
    assert targeted >= 30 and sum(injected.values()) >= 8, injected
    assert len(injected) >= 3, injected
    assert len(succeeded) == JOBS - JOBS // 5 and len(failed) == JOBS // 5
    # (1) deleted only after success, and what the service confirmed is gone.
    assert early_deletes == []
    assert confirmed <= succeeded and not confirmed & failed
    assert emulated.get("delete:stale", 0) == 0, "a delete confirmed that deleted nothing"
    assert succeeded - lost_ids <= confirmed
    visible, hidden = queue_counts(admin, url)
    assert visible + hidden == JOBS - len(confirmed)
    # (2) nobody else got a leased message (a failed job's message, once released or
    # left to lapse, is fair game; so is one whose lease was reported lost).
    assert spy.polled_every(TIMING["visibility_timeout"]), (spy.polls, spy.watched)
    assert set(spy.received) <= failed | lost_ids, "a leased message reached a second consumer"
    # (3) every loss reported, once, and told to its handler.
    assert stats.lost == len(reported) and stats.abandoned == 0, stats
    assert len({id(lease) for lease, _ in reported}) == len(reported)
    assert all(lease.lost.is_set() for lease, _ in reported)
    lost_leases = {id(lease) for lease, _ in reported}
    returned = [lease for lease, ok in handled if ok]
    assert worker.stats.lost == sum(id(lease) in lost_leases for lease in returned), worker.stats
    assert worker.stats.completed == sum(id(lease) not in lost_leases for lease in returned)


@pytest.mark.parametrize("path", ["boto3", "lean"])
def test_leasekeeper_calls_make_one_attempt_and_the_applications_keep_botocores_retries(
    moto_endpoint: str, make_queue: Any, path: str
) -> None:
    url = make_queue(visibility_timeout=30)
    admin = make_client(moto_endpoint)
    admin.send_message(QueueUrl=url, MessageBody="job")
    with FaultProxyProcess(moto_endpoint, error_rate=1.0, kinds=("InternalError",)) as proxy:
        client = boto3_default_client(proxy.url)  # standard retries: 3 attempts
        backend = SQSBackend(client, url, fast_path=path == "lean")
        assert (backend.lean is not None) is (path == "lean")
        message = backend.receive(max_messages=1, wait_seconds=1)[0]

        outcomes = backend.extend([message.handle], 30)
        assert [o.kind for o in outcomes] == ["retry"] and "InternalError" in outcomes[0].detail
        assert proxy.stats()["targeted"] == 1, "leasekeeper's extend was retried inside botocore"

        entry = {"Id": "0", "ReceiptHandle": message.receipt, "VisibilityTimeout": 30}
        with pytest.raises(Exception, match="InternalError"):
            client.change_message_visibility_batch(QueueUrl=url, Entries=[entry])
        assert proxy.stats()["targeted"] == 1 + 3, "the application's call lost botocore's retries"

        # With client_retries=True botocore's policy covers leasekeeper's calls too.
        SQSBackend(client, url, client_retries=True, fast_path=path == "lean").extend(
            [message.handle], 30
        )
        assert proxy.stats()["targeted"] == 4 + 3
