"""SQSBackend against moto's server in real time, with real boto3 clients.

Timing: a test that checks *when* a message came back polls with short receives
every 50 ms and bounds the moment from the side load cannot push: "hidden for at
most X" is checked with the start of the last poll that did *not* get the message
(it was still hidden then, so that moment is earlier than its return, however
slow the polls are), "not back before Y" with the return of the poll that got it.
A loaded machine makes polls slow and sparse; neither bound then fails by
itself. TOLERANCE (0.75 s) covers moto rounding and the poll interval.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from leasekeeper import LeaseLost, LeaseManager, LeaseState
from leasekeeper.backends.base import Message
from leasekeeper.backends.sqs import SQSBackend
from tests.sqs.conftest import CHILD_ENV, count_calls, make_client

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
EXAMPLE = HERE.parent.parent / "examples" / "sqs_worker.py"
TOLERANCE = 0.75
POLL = 0.05
# A 2 s visibility timeout renewed when 1.2 s remain: room for a slow call or a late
# wake-up on a loaded 2-core machine (other test suites may run at the same time).
TIMING: dict[str, Any] = {
    "visibility_timeout": 2,
    "timer_interval": 0.2,
    "minimal_life": 0.5,
    "extend_threshold": 1.2,
}


class Spy:
    """A second consumer that polls the queue the whole time and keeps what it gets."""

    def __init__(self, endpoint: str, url: str) -> None:
        self.client = make_client(endpoint)
        self.url = url
        self.received: list[str] = []
        self.polls = 0
        self.watched = 0.0  # seconds between entering and leaving the ``with`` block
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqs-spy", daemon=True)

    def polled_every(self, seconds: float) -> bool:
        """Did it poll at least once per ``seconds`` on average? (A check that it
        watched at all, whatever the load: polls slow down on a busy machine.)"""
        return self.polls >= max(1.0, self.watched / seconds)

    def _run(self) -> None:
        while not self._stop.is_set():
            response = self.client.receive_message(
                QueueUrl=self.url, MaxNumberOfMessages=10, VisibilityTimeout=30
            )
            self.polls += 1
            self.received += [m["MessageId"] for m in response.get("Messages", [])]
            self._stop.wait(POLL)

    def __enter__(self) -> Spy:
        self._entered = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.watched = time.monotonic() - self._entered


def receive_n(backend: SQSBackend, n: int, **kwargs: Any) -> list[Message]:
    got: list[Message] = []
    deadline = time.monotonic() + 10
    while len(got) < n and time.monotonic() < deadline:
        got += backend.receive(max_messages=min(10, n - len(got)), **kwargs)
    assert len(got) == n, f"received {len(got)} of {n} messages"
    return got


@dataclass
class Back:
    """When a message came back: ``hidden_at`` is the start of the last poll that did
    not get it (None if the first poll did), ``back_at`` the return of the poll
    that did (monotonic), ``message`` what that poll received."""

    hidden_at: float | None
    back_at: float
    message: dict[str, Any]

    def hidden_for(self, since: float) -> float:
        """How long after ``since`` the message was last seen hidden (0: never)."""
        return 0.0 if self.hidden_at is None else max(0.0, self.hidden_at - since)


def wait_until_back(client: Any, url: str, message_id: str, limit: float) -> Back:
    """Poll until ``message_id`` can be received again (it is then hidden for 30 s)."""
    deadline = time.monotonic() + limit
    hidden_at: float | None = None
    while time.monotonic() < deadline:
        started = time.monotonic()
        # One at a time: on a FIFO queue a poll of 10 would take the group's next too.
        response = client.receive_message(QueueUrl=url, MaxNumberOfMessages=1, VisibilityTimeout=30)
        for message in response.get("Messages", []):
            if message["MessageId"] == message_id:
                return Back(hidden_at, time.monotonic(), message)
        hidden_at = started
        time.sleep(POLL)
    pytest.fail(f"message {message_id} did not come back within {limit:g}s")


def queue_counts(client: Any, url: str) -> tuple[int, int]:
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return (
        int(attributes["ApproximateNumberOfMessages"]),
        int(attributes["ApproximateNumberOfMessagesNotVisible"]),
    )


@pytest.fixture
def client(moto_endpoint: str) -> Any:
    return make_client(moto_endpoint)


def test_long_jobs_are_never_redelivered_while_leased(
    moto_endpoint: str, make_queue: Any, client: Any
) -> None:
    url = make_queue(visibility_timeout=2)
    for index in range(3):
        client.send_message(QueueUrl=url, MessageBody=f"job-{index}")
    backend = SQSBackend(client, url)
    manager = LeaseManager(backend, **TIMING)
    messages = receive_n(backend, 3)  # the queue's 2 s (read with GetQueueAttributes)
    assert {m.visibility_timeout for m in messages} == {2.0}

    outcomes: dict[str, str] = {}

    def job(message: Message) -> None:
        try:
            with manager.lease(message):
                time.sleep(6)  # three visibility timeouts
            outcomes[message.id] = "completed"
        except LeaseLost:
            outcomes[message.id] = "lost"

    with Spy(moto_endpoint, url) as spy:
        workers = [threading.Thread(target=job, args=(m,)) for m in messages]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
    manager.close()
    stats = manager.stats()
    lost = {mid for mid, outcome in outcomes.items() if outcome == "lost"}
    print(f"\n{stats}")
    assert spy.polled_every(TIMING["visibility_timeout"]), (spy.polls, spy.watched)
    assert len(outcomes) == 3
    # Only a lease leasekeeper reported lost (on a machine too busy for the margin:
    # an extend answered after the deadline, rule 5) may reach the second consumer.
    assert set(spy.received) <= lost, "a leased message was delivered to a second consumer"
    assert (stats.completed, stats.lost, stats.abandoned) == (3 - len(lost), len(lost), 0), stats
    assert stats.extended >= 3 * 3 or lost, stats
    # What was completed is gone; the second consumer holds what it got.
    visible, hidden = queue_counts(client, url)
    assert hidden >= len(spy.received) and visible + hidden == len(lost)


def test_25_leases_due_together_take_three_batch_calls(make_queue: Any, client: Any) -> None:
    url = make_queue(visibility_timeout=2)
    for start in range(0, 25, 10):
        client.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "MessageBody": f"m{i}"} for i in range(start, min(25, start + 10))
            ],
        )
    backend = SQSBackend(client, url)
    calls = count_calls(client)
    manager = LeaseManager(backend, visibility_timeout=4, timer_interval=0.2, minimal_life=0.5)
    messages = receive_n(backend, 25, visibility_timeout=4)
    # Three receives, each a round trip apart (more on a busy machine): give all 25
    # the deadline of the first, the earliest, as a service-reported deadline may
    # (it only ever shortens the estimate). Then they are due at the same moment,
    # when 4/3 s remain.
    earliest = min(m.received_at for m in messages) + 4
    for message in messages:
        message.deadline_hint = earliest
    leases = [manager.register(m) for m in messages]
    deadline = time.monotonic() + 20
    while any(lease.extensions == 0 and lease.state is LeaseState.ACTIVE for lease in leases):
        assert time.monotonic() < deadline, calls
        time.sleep(0.02)
    first_round = dict(calls)
    print(f"first renewal round of 25 leases: {first_round}")
    manager.close()
    stats = manager.stats()
    assert first_round.get("ChangeMessageVisibilityBatch", 0) == 3
    assert calls["ChangeMessageVisibility"] == 0
    assert calls["DeleteMessage"] == 0
    # close() released the active ones in batches as well
    assert calls["ChangeMessageVisibilityBatch"] - first_round["ChangeMessageVisibilityBatch"] <= 3
    # A lease whose extend came back too late (a loaded machine) was lost, and counted.
    lost = [lease for lease in leases if lease.state is LeaseState.LOST]
    assert all(lease.extensions >= 1 for lease in leases if lease not in lost)
    assert stats.lost == len(lost), stats


def test_killed_worker_message_comes_back_within_one_timeout(
    moto_endpoint: str, make_queue: Any, client: Any
) -> None:
    url = make_queue(visibility_timeout=2)
    client.send_message(QueueUrl=url, MessageBody="long job")
    env = {**os.environ, **CHILD_ENV, "SQS_ENDPOINT": moto_endpoint, "SQS_QUEUE_URL": url}
    worker = subprocess.Popen(
        [sys.executable, str(HERE / "kill_worker.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert worker.stdout is not None
        line = worker.stdout.readline().strip()
        assert line.startswith("READY "), f"worker said {line!r}: {worker.stderr.read()}"  # type: ignore[union-attr]
        message_id = line.split()[1]
        # 3 s > the 2 s timeout: without renewals the message would be back by now.
        with Spy(moto_endpoint, url) as spy:
            time.sleep(3)
        assert spy.received == [], "re-delivered while the worker was alive (a lapse?)"
        killed_at = time.monotonic()
        worker.send_signal(signal.SIGKILL)
        back = wait_until_back(client, url, message_id, limit=10)
    finally:
        worker.kill()
        worker.wait(10)
    hidden = back.hidden_for(killed_at)
    print(f"re-delivered {back.back_at - killed_at:.3f}s after SIGKILL (hidden {hidden:.3f}s)")
    # The last extend before the kill hid it for at most one visibility timeout.
    assert hidden <= TIMING["visibility_timeout"] + TIMING["timer_interval"] + TOLERANCE, hidden


def test_delete_after_several_extends(moto_endpoint: str, make_queue: Any, client: Any) -> None:
    url = make_queue(visibility_timeout=2)
    client.send_message(QueueUrl=url, MessageBody="x")
    backend = SQSBackend(client, url)
    with LeaseManager(backend, **TIMING) as manager:
        [message] = receive_n(backend, 1)
        lease = manager.register(message)
        time.sleep(4.5)
        assert lease.extensions >= 2
        lease.complete()
        assert lease.state is LeaseState.COMPLETED
        with Spy(moto_endpoint, url) as spy:
            time.sleep(2.5)  # longer than the timeout: it is gone, not hidden
    assert spy.received == []
    assert queue_counts(client, url) == (0, 0)


def test_release_makes_the_message_visible_again_after_the_delay(
    make_queue: Any, client: Any
) -> None:
    url = make_queue(visibility_timeout=2)
    client.send_message(QueueUrl=url, MessageBody="x")
    backend = SQSBackend(client, url)
    with LeaseManager(backend, **TIMING) as manager:
        [message] = receive_n(backend, 1, visibility_timeout=30)
        lease = manager.register(message)
        released_at = time.monotonic()
        lease.release(delay=1.0)
        released = time.monotonic()  # the service applied the release in between
        assert lease.state is LeaseState.RELEASED
        back = wait_until_back(client, url, message.id, limit=5)
        raw_receipt = back.message["ReceiptHandle"]
        assert back.back_at - released_at >= 1.0 - 0.1  # not before the delay ...
        assert back.hidden_for(released) <= 1.0 + TOLERANCE  # ... and not much after

        # delay 0: back at once
        client.change_message_visibility(
            QueueUrl=url, ReceiptHandle=raw_receipt, VisibilityTimeout=0
        )
        [again] = receive_n(backend, 1, visibility_timeout=30)
        assert again.id == message.id and again.receive_count == 3
        lease = manager.register(again)
        lease.release(delay=0)
        released = time.monotonic()
        back = wait_until_back(client, url, message.id, limit=5)
        assert back.hidden_for(released) <= TOLERANCE


def test_fifo_lease_holds_the_group_and_release_frees_it(
    moto_endpoint: str, make_queue: Any, client: Any
) -> None:
    url = make_queue(visibility_timeout=2, fifo=True)
    for body in ("first", "second"):
        client.send_message(QueueUrl=url, MessageBody=body, MessageGroupId="g")
    backend = SQSBackend(client, url)
    with LeaseManager(backend, **TIMING) as manager:
        [first] = receive_n(backend, 1)
        assert first.body == "first"
        lease = manager.register(first)
        with Spy(moto_endpoint, url) as spy:
            time.sleep(3)  # the group stays blocked while the lease is renewed
        assert spy.received == []
        lease.release(delay=1.0)
        released = time.monotonic()
        back = wait_until_back(client, url, first.id, limit=5)
        assert back.hidden_for(released) <= 1.0 + TOLERANCE
        # The poll took "first" again (for 30 s): finish it, and the group goes on.
        again = backend.adopt(back.message, visibility_timeout=30)
        manager.register(again).complete()
        [second] = receive_n(backend, 1)
        assert second.body == "second"
        manager.register(second).complete()
    assert queue_counts(client, url) == (0, 0)


def test_adopt_dict_and_resource_message(make_queue: Any, client: Any, moto_endpoint: str) -> None:
    url = make_queue(visibility_timeout=10)
    for index in range(3):
        client.send_message(QueueUrl=url, MessageBody=f"m{index}")
    calls = count_calls(client)
    backend = SQSBackend(client, url)
    raw = client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=2, MessageSystemAttributeNames=["All"]
    )["Messages"]
    sqs = boto3.resource(
        "sqs",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    [resource_message] = sqs.Queue(url).receive_messages(MaxNumberOfMessages=1)
    adopted = [backend.adopt(r) for r in raw] + [backend.adopt(resource_message)]
    assert calls["GetQueueAttributes"] == 1
    assert {m.body for m in adopted} == {"m0", "m1", "m2"}
    assert all(m.visibility_timeout == 10.0 for m in adopted)
    assert adopted[2].raw is resource_message
    with LeaseManager(backend, **TIMING) as manager:
        for message in adopted:
            manager.register(message).complete()
    assert queue_counts(client, url) == (0, 0)


def test_example_worker_processes_and_stops_on_sigterm(
    moto_endpoint: str, make_queue: Any, client: Any
) -> None:
    url = make_queue(visibility_timeout=30)
    for _ in range(2):
        client.send_message(QueueUrl=url, MessageBody='{"seconds": 2.5}')
    env = {
        **os.environ,
        **CHILD_ENV,
        "SQS_QUEUE_URL": url,
        "AWS_ENDPOINT_URL": moto_endpoint,
        "VISIBILITY_TIMEOUT": "2",
        "WAIT_SECONDS": "1",
    }
    worker = subprocess.Popen(
        [sys.executable, str(EXAMPLE)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    try:
        assert worker.stdout is not None
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and sum("processed" in x for x in lines) < 2:
            line = worker.stdout.readline()
            if not line:
                break
            lines.append(line)
        worker.send_signal(signal.SIGTERM)
        out, _ = worker.communicate(timeout=15)
        lines.append(out)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    text = "".join(lines)
    assert worker.returncode == 0, text
    assert text.count("processed ") == 2, text
    assert "stopped: 2 processed, 0 failed" in text, text
    assert queue_counts(client, url) == (0, 0)


@pytest.mark.parametrize("fast_path", [True, False], ids=["lean", "client"])
def test_message_group_on_fifo_and_standard_queues(
    make_queue: Any, client: Any, fast_path: bool
) -> None:
    fifo = make_queue(visibility_timeout=10, fifo=True)
    standard = make_queue(visibility_timeout=10)
    client.send_message(QueueUrl=fifo, MessageBody="ordered", MessageGroupId="tenant-7")
    client.send_message(QueueUrl=standard, MessageBody="fair", MessageGroupId="tenant-8")
    client.send_message(QueueUrl=standard, MessageBody="plain")
    [ordered] = receive_n(SQSBackend(client, fifo, fast_path=fast_path), 1)
    assert ordered.group == "tenant-7"
    assert "group='tenant-7'" in repr(ordered)
    got = {m.body: m for m in receive_n(SQSBackend(client, standard, fast_path=fast_path), 2)}
    assert got["fair"].group == "tenant-8"
    assert got["plain"].group is None and "group=" not in repr(got["plain"])
    # The copies the library makes keep it.
    assert ordered.with_backend(ordered.backend).group == "tenant-7"
