"""Invariants (1) and (2) with a real boto3 client behind a fault-injecting proxy.

A proxy between the client and moto fails 30 % of the visibility calls
(ChangeMessageVisibilityBatch: extends and releases) as the service and network
do - 500, 503, throttling, reset connections, answers lost after the change was
applied - and adds 20-100 ms to every request. Jobs run for 2-5 visibility
timeouts; one in five raises. Checked:

(1) a message is deleted only after its handler returned successfully (every
    DeleteMessageBatch entry is checked as the client sends it), and a failed
    job's message is never deleted;
(2) no leased message reaches a second consumer polling moto directly, except a
    failed job's message after its lease was given up.

Run with the client settings the docs recommend and with boto3's defaults
(standard retries, 3 attempts, up to seconds of backoff inside one call).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import boto3
import pytest

from leasekeeper import LeaseManager, Message, Worker
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


@pytest.mark.parametrize("settings", ["recommended", "boto3-defaults"])
def test_invariants_hold_behind_a_proxy_failing_30_percent_of_visibility_calls(
    moto_endpoint: str, make_queue: Any, settings: str
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

    def handler(message: Message) -> None:
        job = int(str(message.body))
        with lock:
            receipts[message.receipt] = message.id
        time.sleep(4 + (job % 7))  # 2 to 5 visibility timeouts, staggered
        if job % 5 == 4:
            with lock:
                failed.add(message.id)
            raise RuntimeError(f"job {job} failed")
        with lock:
            succeeded.add(message.id)

    faults = {"error_rate": 0.3, "latency": 0.02, "jitter": 0.08, "seed": 30}
    with FaultProxyProcess(moto_endpoint, **faults) as proxy:
        client = make_client(proxy.url) if settings == "recommended" else None
        client = client or boto3_default_client(proxy.url)

        def check_delete(params: dict[str, Any], **_: Any) -> None:
            with lock:
                for entry in params.get("Entries", []):
                    message_id = receipts.get(entry["ReceiptHandle"], "?")
                    if message_id not in succeeded:
                        early_deletes.append(message_id)

        client.meta.events.register("provide-client-params.sqs.DeleteMessageBatch", check_delete)
        manager = LeaseManager(SQSBackend(client, url), **TIMING)
        # One message per receive: leases registered apart are due apart, so the
        # proxy sees many visibility calls rather than a few full batches.
        worker = Worker(manager, handler, concurrency=JOBS, batch_size=1, wait_seconds=1)
        worker.start()
        deadline = time.monotonic() + 20
        while worker.stats.received < JOBS and time.monotonic() < deadline:
            time.sleep(0.05)
        assert worker.stats.received == JOBS, worker.stats
        # Every message is leased now: from here on a second consumer must get none.
        with Spy(moto_endpoint, url) as spy:
            deadline = time.monotonic() + 60
            while len(succeeded) + len(failed) < JOBS and time.monotonic() < deadline:
                time.sleep(0.2)
            worker.stop(timeout=30)
        stats = manager.stats()
        manager.close()
        counts = proxy.stats()
    targeted, injected = counts["targeted"], counts["injected"]

    print(
        f"\n{settings}: visibility calls {targeted}, injected {injected}; "
        f"extended {stats.extended}, retries {stats.retries}, lost {stats.lost}, "
        f"lapses {stats.lapses}, send lag p99 {stats.send_lag_p99 * 1000:.0f} ms, "
        f"extend latency p99 {stats.extend_latency_p99 * 1000:.0f} ms"
    )
    # The faults really happened, of every kind.
    assert targeted >= 30 and sum(injected.values()) >= 8, injected
    assert len(injected) >= 3, injected
    assert len(succeeded) == JOBS - JOBS // 5 and len(failed) == JOBS // 5
    # (1) deleted only after success; the failed jobs' messages are all still there.
    assert early_deletes == []
    visible, hidden = queue_counts(admin, url)
    assert visible + hidden == len(failed)
    # (2) nobody else got a leased message (a failed job's message, once released or
    # left to lapse, is fair game).
    assert spy.polls > 50
    assert set(spy.received) <= failed, "a leased message reached a second consumer"
    assert (stats.lost, stats.lapses) == (0, 0), stats


def test_leasekeeper_calls_make_one_attempt_and_the_applications_keep_botocores_retries(
    moto_endpoint: str, make_queue: Any
) -> None:
    url = make_queue(visibility_timeout=30)
    admin = make_client(moto_endpoint)
    admin.send_message(QueueUrl=url, MessageBody="job")
    with FaultProxyProcess(moto_endpoint, error_rate=1.0, kinds=("InternalError",)) as proxy:
        client = boto3_default_client(proxy.url)  # standard retries: 3 attempts
        backend = SQSBackend(client, url)
        message = backend.receive(max_messages=1, wait_seconds=1)[0]

        outcomes = backend.extend([message.handle], 30)
        assert [o.kind for o in outcomes] == ["retry"] and "InternalError" in outcomes[0].detail
        assert proxy.stats()["targeted"] == 1, "leasekeeper's extend was retried inside botocore"

        entry = {"Id": "0", "ReceiptHandle": message.receipt, "VisibilityTimeout": 30}
        with pytest.raises(Exception, match="InternalError"):
            client.change_message_visibility_batch(QueueUrl=url, Entries=[entry])
        assert proxy.stats()["targeted"] == 1 + 3, "the application's call lost botocore's retries"

        # With client_retries=True botocore's policy covers leasekeeper's calls too.
        SQSBackend(client, url, client_retries=True).extend([message.handle], 30)
        assert proxy.stats()["targeted"] == 4 + 3
