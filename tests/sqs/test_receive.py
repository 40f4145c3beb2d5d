"""The README's first loop on SQS (moto's server): ``manager.receive`` leases every
message of a batch the instant it arrives, so at a 2-second timeout a batch of
1.5-second jobs, handled one after another, is never seen by a second consumer."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from leasekeeper import LeaseManager, LeaseState
from leasekeeper.backends.sqs import SQSBackend
from tests.sqs.conftest import make_client

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

# 2 s leases renewed when 1.2 s remain (room for a late wake-up on a loaded machine).
TIMING: dict[str, Any] = {
    "visibility_timeout": 2.0,
    "timer_interval": 0.2,
    "minimal_life": 0.5,
    "extend_threshold": 1.2,
}


def test_a_received_batch_of_long_jobs_is_never_seen_by_a_second_consumer(
    moto_endpoint: str, make_queue: Callable[..., str]
) -> None:
    url = make_queue(visibility_timeout=2)
    client = make_client(moto_endpoint)
    sent = {
        client.send_message(QueueUrl=url, MessageBody=f"job {n}")["MessageId"] for n in range(6)
    }
    queue = SQSBackend(client, url)
    other = SQSBackend(make_client(moto_endpoint), url)
    stolen: list[str] = []
    stop = threading.Event()

    def second_consumer() -> None:
        while not stop.is_set():
            stolen.extend(m.id for m in other.receive(max_messages=10, wait_seconds=0.2))

    done: list[str] = []
    with LeaseManager(queue, **TIMING) as manager:
        held = []
        for _ in range(20):  # moto may hand out a batch in parts
            held += manager.receive(max_messages=10, wait_seconds=1)
            if len(held) == len(sent):
                break
        thief = threading.Thread(target=second_consumer, daemon=True)
        thief.start()
        try:
            for lease in held:
                with lease:  # each waited its turn leased: renewed since it arrived
                    time.sleep(1.5)  # the job
                    done.append(lease.id)
        finally:
            stop.set()
            thief.join(10)
        assert [lease.state for lease in held] == [LeaseState.COMPLETED] * len(sent)
        assert manager.stats().lost == 0
    assert set(done) == sent
    assert stolen == []
