"""Issue 24 on moto, with the renewer process: a stalled handler lets go of its
message, and a job longer than the queue's cap rolls over.

A ``Worker`` on SQS renews in a process of its own by default. Its handler reports
progress in a tight loop (the renewer process hears of it a few times a second,
not once a call), then hangs: with ``stall_timeout=3`` the renewer process stops
renewing, the lease ends lost (``stalled``) in the worker, and another consumer
receives the message within 3 s + one visibility timeout of the last progress.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from leasekeeper import LeaseState, LostReason, Message, Worker, current_lease
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.renewers._link import RenewerLink
from tests.services import make_client

pytestmark = [pytest.mark.realtime]

VISIBILITY = 2.0
STALL = 3.0
SETTLE = 60.0  # generous bound for waits that end on an event (a loaded machine)


@pytest.fixture
def queue_url(moto_endpoint: str, renewer_env: None) -> Iterator[str]:
    admin = make_client(moto_endpoint)
    url: str = admin.create_queue(
        QueueName=f"stall-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "2"}
    )["QueueUrl"]
    yield url
    admin.delete_queue(QueueUrl=url)


class FrameCount:
    """Counts the progress frames the worker sends its renewer process."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.frames = 0
        self.entries = 0
        send = RenewerLink.send

        def counting(link: RenewerLink, frame: tuple[Any, ...], *, urgent: bool = True) -> None:
            if frame[0] == "progress":
                self.frames += 1
                self.entries += len(frame[1])
            send(link, frame, urgent=urgent)

        monkeypatch.setattr(RenewerLink, "send", counting)


def test_a_stalled_handler_lets_go_and_progress_is_coalesced(
    moto_endpoint: str, queue_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    frames = FrameCount(monkeypatch)
    make_client(moto_endpoint).send_message(QueueUrl=queue_url, MessageBody="hangs")
    calls = 0
    last_progress: list[float] = []
    hang = threading.Event()
    started = threading.Event()
    held: list[Any] = []

    def handler(message: Message) -> None:
        nonlocal calls
        lease = current_lease()
        held.append(lease)
        started.set()
        end = time.monotonic() + 1.5
        while time.monotonic() < end:  # busy, and saying so on every step
            lease.progress()
            calls += 1
        last_progress.append(time.monotonic())
        hang.wait(SETTLE)  # then a deadlock, or a socket without a timeout

    worker = Worker(
        SQSBackend(make_client(moto_endpoint), queue_url),
        handler,
        concurrency=1,
        wait_seconds=0.5,
        shutdown_timeout=5,
        visibility_timeout=VISIBILITY,
        timer_interval=0.2,
        minimal_life=0.5,
        stall_timeout=STALL,
    ).start()
    try:
        assert worker.manager.renewer.name == "process"  # the default, where it can run
        assert started.wait(SETTLE), "the worker never ran its handler"
        other = make_client(moto_endpoint)
        deadline = time.monotonic() + SETTLE
        got: list[dict[str, Any]] = []
        while not got and time.monotonic() < deadline:
            got = other.receive_message(
                QueueUrl=queue_url, WaitTimeSeconds=0, VisibilityTimeout=30
            ).get("Messages", [])
            if not got:
                time.sleep(0.05)
        back_after = time.monotonic() - last_progress[0]
        [lease] = held
        assert got and got[0]["Body"] == "hangs", "the stalled message never came back"
        # The renewer process let go: the lease ends lost, as stalled, in the worker.
        assert lease.lost.wait(SETTLE) and lease.state is LeaseState.LOST
        assert lease.lost_reason is LostReason.STALLED
        assert worker.manager.stats().lost_reasons.get("stalled") == 1
    finally:
        hang.set()
        worker.stop(SETTLE)
    print(f"\n{calls} progress() calls, {frames.frames} frames; back after {back_after:.2f}s")
    # Back within stall_timeout + one visibility timeout of the last progress (plus the
    # 50 ms between this consumer's polls and a loaded machine's lateness).
    assert back_after < STALL + VISIBILITY + 1.0
    assert back_after > STALL - 0.5  # and not before the handler stalled
    # Not one frame a call: at most one an interval (0.3 s) and one at the end of it.
    assert calls > 1000 and frames.frames <= 2 * (1.5 / 0.3) + 4
    assert worker.stats.lost == 1 and worker.stats.completed == 0


def test_a_job_longer_than_the_cap_rolls_over_on_sqs(moto_endpoint: str, queue_url: str) -> None:
    """SQS with max_lease_age overridden to 4 s (a margin of 2 % kept before it): each
    hop is told to roll over two thresholds (2 x 0.4 s) before the cap, after seven
    steps of 0.5 s, so a job of 15 steps - nearly two caps - finishes through two
    rollovers (more on a loaded machine), with two workers on the queue: each hop
    resumes from the last checkpoint, every original is deleted, and no two hops run
    at once."""
    steps, step = 15, 0.5
    hops: list[tuple[int, int]] = []
    holders = threading.Semaphore(1)
    overlaps: list[int] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        held = current_lease()
        done = held.resumed or 0
        hop = held.lineage.hop
        with lock:
            hops.append((hop, done))
        alone = holders.acquire(blocking=False)
        if not alone:
            overlaps.append(hop)
        try:
            while done < steps:
                held.check()  # Rollover once rolling is set
                time.sleep(step)
                done += 1
                held.checkpoint(done)
        finally:
            if alone:
                holders.release()

    make_client(moto_endpoint).send_message(QueueUrl=queue_url, MessageBody="long")
    workers = [
        Worker(
            SQSBackend(make_client(moto_endpoint), queue_url, max_lease_age=4.0),
            handler,
            concurrency=1,
            wait_seconds=0.2,
            on_cap="rollover",
            visibility_timeout=1.2,
            timer_interval=0.1,
            minimal_life=0.3,
        )
        for _ in range(2)
    ]
    for worker in workers:
        worker.start()
    try:
        deadline = time.monotonic() + SETTLE
        while time.monotonic() < deadline:
            if sum(w.stats.completed for w in workers) == 1:
                break
            time.sleep(0.1)
    finally:
        for worker in workers:
            worker.stop(SETTLE)
    print(f"\nhops (hop, from step): {hops}")
    assert sum(w.stats.completed for w in workers) == 1
    rolled = sum(w.stats.rolled_over for w in workers)
    assert rolled >= 2 and [hop for hop, _ in hops] == list(range(rolled + 1))
    starts = [done for _, done in hops]
    assert starts[0] == 0 and starts == sorted(set(starts))  # each from the last checkpoint
    assert overlaps == [] and sum(w.stats.lost + w.stats.failed for w in workers) == 0
    counts = make_client(moto_endpoint).get_queue_attributes(
        QueueUrl=queue_url, AttributeNames=["All"]
    )["Attributes"]
    assert counts["ApproximateNumberOfMessages"] == "0"  # every hop's message deleted
    assert counts["ApproximateNumberOfMessagesNotVisible"] == "0"
