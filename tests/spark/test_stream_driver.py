"""StreamDriver, the driver-side half of read_stream, on MemoryQueue (no Spark needed),
and on moto's SQS where its renewer process matters.

Offsets, deletes when Spark asks for the next batch, replays and restarts,
admission control, Trigger.AvailableNow, lost leases, stop and SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from leasekeeper import LeaseConfig, Message
from leasekeeper.backends.base import ForwardingBackend
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.errors import ReceiveError
from leasekeeper.receiving import REACH_WITHIN
from leasekeeper.spark import SQSSource
from leasekeeper.spark.stream_driver import StreamDriver, StreamStopped
from leasekeeper.spark.stream_options import StreamOptions
from leasekeeper.spark.stream_rows import COLUMNS
from leasekeeper.testing import ManualClock
from tests.helpers import hold_the_gil
from tests.services import CHILD_ENV, free_port, make_client
from tests.sqs.conftest import make_queue

__all__ = ["make_queue"]

REPO = Path(__file__).resolve().parents[2]
CONFIG = LeaseConfig(visibility_timeout=2, timer_interval=0.2, minimal_life=0.5)
# Never built: every driver here is handed its backend.
SOURCE = SQSSource("https://sqs.us-east-1.amazonaws.com/1/unused", region="us-east-1")


def wait_for(condition: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.02)


def B(n: int) -> dict[str, int]:
    return {"batch": n}


@pytest.fixture
def make_driver() -> Iterator[Callable[..., StreamDriver]]:
    made: list[StreamDriver] = []

    def make(backend: Any, **fields: Any) -> StreamDriver:
        fields.setdefault("config", CONFIG)
        fields.setdefault("poll_seconds", 0.0)
        driver = StreamDriver(StreamOptions(source=SOURCE, **fields), backend=backend)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.stop(timeout=10)
        driver.shutdown_threads()


def ids(parts: list[list[tuple[Any, ...]]]) -> list[str]:
    return [row[0] for part in parts for row in part]


def test_batches_are_planned_from_start_and_deleted_when_the_next_is_asked_for(
    make_driver: Any,
) -> None:
    queue = MemoryQueue(30)
    sent = queue.send_many([f"job-{n}" for n in range(25)])
    # No receiving ahead, so the queue's in-flight count is exactly what batches hold.
    driver = make_driver(queue, max_messages_per_batch=10, partitions=3, prefetch=0)
    assert driver.initial_offset() == B(0)
    assert driver.latest_offset(B(0)) == B(1)
    parts = driver.plan(B(0), B(1))
    assert [len(part) for part in parts] == [4, 3, 3]
    assert len(set(ids(parts))) == 10 and set(ids(parts)) <= set(sent)
    row = dict(zip(COLUMNS, parts[0][0], strict=True))
    assert row["body"].startswith("job-") and row["body_binary"] is None
    assert row["receive_count"] == 1 and row["batch"] == 1 and row["attributes"] == {}
    assert queue.in_flight_count() == 10
    # Spark asks for the next batch once the sink has the first: that deletes
    # exactly the first's messages; its commit, later, has nothing left to delete.
    assert driver.latest_offset(B(1)) == B(2)
    assert len(queue) == 15 and driver.counts.deleted == 10
    driver.commit(B(1))
    assert len(queue) == 15 and driver.counts.deleted == 10
    assert driver.held() == 10 and queue.calls["delete"] == 1
    # Offsets keep growing from whatever start Spark hands back.
    assert driver.latest_offset(B(2)) == B(3)
    assert len(ids(driver.plan(B(2), B(3)))) == 5
    driver.commit(B(3))
    assert len(queue) == 0 and driver.counts.deleted == 25


def test_the_last_batch_of_a_burst_is_deleted_with_no_batch_after_it(
    make_driver: Any,
) -> None:
    queue = MemoryQueue(30)
    queue.send_many(["a", "b", "c"])
    driver = make_driver(queue)
    assert driver.latest_offset(B(7)) == B(8)
    assert len(ids(driver.plan(B(7), B(8)))) == 3
    # Nothing new: start itself, so Spark plans no batch (and would never commit
    # batch 8); asking was enough to delete batch 8.
    start = {"batch": 8}
    assert driver.latest_offset(start) is start
    assert len(queue) == 0 and driver.counts.deleted == 3 and driver.held() == 0


def test_offsets_this_driver_never_held_plan_nothing_and_commit_nothing(
    make_driver: Any,
) -> None:
    """After a restart Spark replays the checkpoint's last batch and commits offsets
    of the previous process: both are empty, harmless calls."""
    queue = MemoryQueue(30)
    queue.send_many(["x", "y"])
    driver = make_driver(queue)
    assert driver.plan(B(41), B(42)) == []
    driver.commit(B(42))
    assert len(queue) == 2 and queue.in_flight_count() == 0
    assert driver.latest_offset(B(42)) == B(43)  # built from start, not a counter
    assert len(ids(driver.plan(B(42), B(43)))) == 2


def test_asked_twice_for_the_same_start_gives_the_same_batch(make_driver: Any) -> None:
    queue = MemoryQueue(30)
    queue.send_many([str(n) for n in range(20)])
    driver = make_driver(queue, max_messages_per_batch=5, prefetch=0)
    assert driver.latest_offset(B(0)) == B(1)
    assert driver.latest_offset(B(0)) == B(1)
    assert len(ids(driver.plan(B(0), B(1)))) == 5
    assert queue.in_flight_count() == 5


class Gated(ForwardingBackend):
    """Receives wait while the gate is closed (as a slow service would)."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.gate = threading.Event()
        self.gate.set()

    def receive(
        self, max_messages: int = 1, wait_seconds: float = 0.0, visibility_timeout: Any = None
    ) -> list[Message]:
        self.gate.wait()
        return super().receive(max_messages, wait_seconds, visibility_timeout)


def test_the_next_batch_is_received_and_leased_while_spark_runs_this_one(
    make_driver: Any,
) -> None:
    queue = MemoryQueue(2)  # lapses after 2 s unless renewed
    sent = queue.send_many([f"job-{n}" for n in range(30)])
    backend = Gated(queue)
    driver = make_driver(backend, max_messages_per_batch=10)  # prefetch: 10 ahead
    assert driver.latest_offset(B(0)) == B(1)
    first = set(ids(driver.plan(B(0), B(1))))
    # While "Spark runs" batch 1, the next 10 are received and leased: renewed, hidden.
    wait_for(lambda: queue.in_flight_count() == 20, what="10 messages leased ahead")
    time.sleep(2 * CONFIG.visibility_timeout)
    assert queue.visible_count() == 10 and driver.counts.lost == 0
    # The next batch comes out of the buffer, with the service not answering at all.
    backend.gate.clear()
    try:
        assert driver.latest_offset(B(1)) == B(2)
    finally:
        backend.gate.set()
    second = set(ids(driver.plan(B(1), B(2))))
    assert len(second) == 10 and not first & second
    # Asking for batch 2 deleted batch 1 only: what is leased ahead is in no batch yet.
    assert len(queue) == 20 and driver.counts.deleted == 10
    driver.commit(B(1))
    assert len(queue) == 20 and driver.counts.deleted == 10
    wait_for(lambda: queue.in_flight_count() == 20, what="the next 10 leased ahead")
    # Stopping releases every lease not committed: batch 2 and the buffer.
    assert driver.stop() is True
    assert queue.visible_count() == 20 and driver.counts.released == 20
    assert set(sent) - first == {message.id for message in queue.receive(30)}


def test_a_lease_lost_while_buffered_gives_no_row(make_driver: Any) -> None:
    queue = MemoryQueue(2)
    sent = queue.send_many([str(n) for n in range(10)])
    driver = make_driver(queue, max_messages_per_batch=5)
    assert driver.latest_offset(B(0)) == B(1)
    planned = set(ids(driver.plan(B(0), B(1))))
    wait_for(lambda: queue.in_flight_count() == 10, what="5 messages leased ahead")
    buffered = next(message_id for message_id in sent if message_id not in planned)
    queue.rotate_receipt(buffered)  # as if someone else received it
    wait_for(lambda: driver.counts.lost == 1, what="the lease to be lost at its next extend")
    assert driver.latest_offset(B(1)) == B(2)
    rows = ids(driver.plan(B(1), B(2)))
    assert buffered not in rows and len(rows) == 4
    assert driver.counts.dropped == 1


def test_admission_control_limits_a_batch(make_driver: Any) -> None:
    queue = MemoryQueue(30)
    queue.send_many([str(n) for n in range(50)])
    driver = make_driver(queue, max_messages_per_batch=30)
    assert driver.latest_offset(B(0), max_rows=7) == B(1)
    assert len(ids(driver.plan(B(0), B(1)))) == 7
    assert driver.latest_offset(B(1), max_rows=None) == B(2)  # ReadAllAvailable: the cap
    assert len(ids(driver.plan(B(1), B(2)))) == 30


def test_a_batch_is_filled_by_parallel_receives(make_driver: Any) -> None:
    queue = MemoryQueue(30)
    queue.send_many([str(n) for n in range(1000)])
    driver = make_driver(queue, max_messages_per_batch=1000, receive_concurrency=8)
    assert driver.latest_offset(B(0)) == B(1)
    assert len(set(ids(driver.plan(B(0), B(1))))) == 1000
    assert queue.calls["receive"] >= 100  # 10 a call


@pytest.mark.parametrize("max_batch", [10, 1])
def test_a_commit_deletes_in_batch_calls(make_driver: Any, max_batch: int) -> None:
    queue = MemoryQueue(30, max_batch=max_batch)
    queue.send_many([str(n) for n in range(200)])
    driver = make_driver(queue, max_messages_per_batch=200)
    assert driver.latest_offset(B(0)) == B(1)
    driver.plan(B(0), B(1))
    driver.commit(B(1))
    assert len(queue) == 0 and driver.counts.deleted == 200
    assert queue.calls["delete"] == 200 // max_batch


def test_leases_are_renewed_while_a_batch_runs_longer_than_the_timeout(
    make_driver: Any,
) -> None:
    queue = MemoryQueue(2)
    queue.send_many([str(n) for n in range(10)])
    driver = make_driver(queue)
    assert driver.latest_offset(B(0)) == B(1)
    driver.plan(B(0), B(1))
    time.sleep(3 * CONFIG.visibility_timeout)  # the "batch" runs; nothing reappears
    assert queue.visible_count() == 0
    driver.commit(B(1))
    assert len(queue) == 0 and driver.counts.lost == 0


def test_the_reader_s_leases_hold_while_its_process_is_starved(
    make_driver: Any, moto_endpoint: str, make_queue: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a queue service the reader renews from a renewer process of its own (the
    default, ``renewer="auto"``): its process holding the GIL for 1.5 timeouts - a
    loaded Spark driver, a CPU hog - starves no renewal, and no message comes back
    to be received twice."""
    for name, value in CHILD_ENV.items():  # where a renewer process finds them
        monkeypatch.setenv(name, value)
    url = make_queue(2)
    client = make_client(moto_endpoint)
    for start in range(0, 20, 10):
        entries = [{"Id": str(n), "MessageBody": f"job {start + n}"} for n in range(10)]
        client.send_message_batch(QueueUrl=url, Entries=entries)
    backend = SQSBackend(make_client(moto_endpoint), url)
    driver = make_driver(backend, max_messages_per_batch=20, receive_concurrency=1)
    assert driver.latest_offset(B(0)) == B(1)
    rows = [row for part in driver.plan(B(0), B(1)) for row in part]
    hold_the_gil(1.5 * CONFIG.visibility_timeout)
    other = client.receive_message(QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1)
    assert other.get("Messages", []) == [], "a message came back while the batch ran"
    assert driver.latest_offset(B(1)) in (B(1), B(2))  # deletes batch 1
    assert (len(rows), driver.counts.deleted, driver.counts.lost) == (20, 20, 0)


def test_a_lease_lost_before_planning_gives_no_row(make_driver: Any) -> None:
    queue = MemoryQueue(2)
    sent = queue.send_many([str(n) for n in range(5)])
    driver = make_driver(queue)
    assert driver.latest_offset(B(0)) == B(1)
    queue.rotate_receipt(sent[2])  # as if someone else received it
    wait_for(lambda: driver.counts.lost == 1, what="the lease to be lost at its next extend")
    parts = driver.plan(B(0), B(1))
    assert sent[2] not in ids(parts) and len(ids(parts)) == 4
    assert driver.counts.dropped == 1
    driver.commit(B(1))
    assert len(queue) == 1  # the lost one comes back, to be read again
    assert driver.counts.deleted == 4 and driver.counts.lost_at_commit == 0


def test_a_lease_lost_after_planning_is_counted_at_commit(make_driver: Any) -> None:
    queue = MemoryQueue(2)
    sent = queue.send_many([str(n) for n in range(5)])
    driver = make_driver(queue)
    assert driver.latest_offset(B(0)) == B(1)
    assert len(ids(driver.plan(B(0), B(1)))) == 5
    queue.rotate_receipt(sent[0])
    wait_for(lambda: driver.counts.lost == 1, what="the lease to be lost")
    driver.commit(B(1))
    assert driver.counts.lost_at_commit == 1 and driver.counts.deleted == 4
    assert len(queue) == 1


class Stamped(ForwardingBackend):
    """Gives each message an SQS-style SentTimestamp: "new-*" bodies were sent a
    minute from now, the others an hour ago."""

    def wrap(self, message: Message) -> Message:
        now_ms = time.time() * 1000
        sent = now_ms + 60_000 if str(message.body).startswith("new-") else now_ms - 3_600_000
        message.raw = {"Attributes": {"SentTimestamp": str(int(sent))}}
        return super().wrap(message)


def test_available_now_takes_the_backlog_then_ends(make_driver: Any) -> None:
    queue = MemoryQueue(30)
    queue.send_many([f"old-{n}" for n in range(25)])
    driver = make_driver(Stamped(queue), max_messages_per_batch=10)
    driver.prepare_available_now()
    got: list[str] = []
    start = B(0)
    for _ in range(10):
        end = driver.latest_offset(start)
        if end == start:
            break
        got += ids(driver.plan(start, end))
        driver.commit(start)
        start = end
    else:
        pytest.fail("Trigger.AvailableNow never ended")
    assert len(got) == 25 and len(queue) == 0


def test_available_now_ends_at_a_round_of_messages_sent_after_it_began(
    make_driver: Any,
) -> None:
    queue = MemoryQueue(30)
    queue.send_many(["old-1", "old-2", "new-1", "new-2"])
    driver = make_driver(Stamped(queue), max_messages_per_batch=2)
    driver.prepare_available_now()
    assert driver.latest_offset(B(0)) == B(1)  # old-1, old-2: goes on
    driver.plan(B(0), B(1))
    assert driver.latest_offset(B(1)) == B(2)  # new-1, new-2 are taken, and end the run
    assert sorted(row[1] for row in driver.plan(B(1), B(2))[0]) == ["new-1", "new-2"]
    queue.send_many(["old-3"])  # what comes after the end waits for the next run
    assert driver.latest_offset(B(2)) == B(2)  # the end; batch 2 deleted by the asking
    assert len(queue) == 1 and driver.counts.deleted == 4


class FailingReceives(ForwardingBackend):
    """Its first ``failures`` receives fail as a throttled service's would."""

    def __init__(self, inner: Any, failures: int) -> None:
        super().__init__(inner)
        self.failures = failures

    def receive(
        self, max_messages: int = 1, wait_seconds: float = 0.0, visibility_timeout: Any = None
    ) -> list[Message]:
        if self.failures > 0:
            self.failures -= 1
            raise ReceiveError("retry", "Throttled: slow down")
        return super().receive(max_messages, wait_seconds, visibility_timeout)


def test_a_failing_receive_does_not_end_available_now(make_driver: Any) -> None:
    queue = MemoryQueue(30)
    queue.send_many(["a", "b"])
    driver = make_driver(FailingReceives(queue, failures=2))
    driver.prepare_available_now()
    assert driver.latest_offset(B(0)) == B(1)  # retried, not taken for an empty queue
    assert len(ids(driver.plan(B(0), B(1)))) == 2


def test_a_fatal_receive_error_fails_the_query(make_driver: Any) -> None:
    class Gone(ForwardingBackend):
        def receive(self, *args: Any, **kwargs: Any) -> list[Message]:
            raise ReceiveError("fatal", "QueueDoesNotExist")

    driver = make_driver(Gone(MemoryQueue(30)))
    with pytest.raises(ReceiveError, match="QueueDoesNotExist"):
        driver.latest_offset(B(0))


class SlowToFail(ForwardingBackend):
    """``inner``, on ``clock``: its receives fail while ``failing()`` says so, each
    failure taking ``took`` seconds of the clock's time (a connect timeout, say), as
    ``inner``'s own failure where it has one."""

    def __init__(self, inner: Any, clock: ManualClock, took: float, failing: Any) -> None:
        super().__init__(inner)
        self.clock = clock
        self.took = took
        self.failing = failing
        self.failures = 0

    def receive(
        self, max_messages: int = 1, wait_seconds: float = 0.0, visibility_timeout: Any = None
    ) -> list[Message]:
        if not self.failing(self.failures):
            return super().receive(max_messages, wait_seconds, visibility_timeout)
        self.clock.advance(self.took)
        self.failures += 1
        try:
            super().receive(max_messages, wait_seconds, visibility_timeout)
        except ReceiveError:
            raise
        raise ReceiveError("retry", "could not reach 127.0.0.1:1 (ConnectTimeoutError)")


def test_a_queue_never_reached_fails_the_query_after_reach_within(make_driver: Any) -> None:
    """docs/guide.md, "When a service cannot be reached": the reader's receives of a
    queue no receive has reached stop REACH_WITHIN (clock time) after the reader's
    start, and the query fails with the last failure, which names the endpoint - it
    waited for ever. The real SDK, on a port nobody listens on."""
    port = free_port()
    refused = SQSBackend(make_client(f"http://127.0.0.1:{port}"), f"http://127.0.0.1:{port}/1/q")
    clock = ManualClock()
    backend = SlowToFail(refused, clock, took=7.0, failing=lambda _: True)
    driver = make_driver(backend, renewer="thread")
    started = clock.now()
    with pytest.raises(ReceiveError) as raised:
        driver.latest_offset(B(0))
    assert raised.value.retryable
    assert f"could not reach 127.0.0.1:{port} (" in str(raised.value)
    # Tried until REACH_WITHIN had passed, then no more: 7 s, 14 s, 21 s.
    assert backend.failures == 3 and clock.now() - started >= REACH_WITHIN
    with pytest.raises(ReceiveError):
        driver.latest_offset(B(0))  # and the next ask says the same, with no receive
    assert backend.failures == 3


def test_once_reached_an_outage_is_waited_out(make_driver: Any) -> None:
    """Once a receive has had an answer, failures are retried however long they
    last: the query waits the outage out."""
    queue = MemoryQueue(30)
    clock = ManualClock()
    asked: list[int] = []

    def failing(failures: int) -> bool:
        # Answers once (empty), then fails for three minutes of clock time (a
        # service restarted), then answers again, with a message sent meanwhile.
        asked.append(failures)
        if failures == 2:
            queue.send("after the outage")
        return len(asked) > 1 and failures < 3

    backend = SlowToFail(queue, clock, took=60.0, failing=failing)
    driver = make_driver(backend, renewer="thread")
    started = clock.now()
    offset = B(0)
    for _ in range(5):  # an ask may give no batch while receives fail
        offset = driver.latest_offset(B(0))
        if offset == B(1):
            break
    assert offset == B(1) and backend.failures == 3
    assert clock.now() - started >= 3 * 60 > REACH_WITHIN
    assert [body for _, body in ids_and_bodies(driver.plan(B(0), B(1)))] == ["after the outage"]


def ids_and_bodies(parts: list[list[tuple[Any, ...]]]) -> list[tuple[str, Any]]:
    return [
        (row[0], dict(zip(COLUMNS, row, strict=True))["body"]) for part in parts for row in part
    ]


def test_binary_bodies(make_driver: Any) -> None:
    queue = MemoryQueue(30)
    queue.send_many([b"\xff\x00raw", "caf\u00e9".encode()])
    driver = make_driver(queue)
    driver.latest_offset(B(0))
    rows = sorted(driver.plan(B(0), B(1))[0], key=lambda row: row[0])
    assert (rows[0][1], rows[0][2]) == (None, b"\xff\x00raw")
    assert (rows[1][1], rows[1][2]) == ("caf\u00e9", "caf\u00e9".encode())


def test_stop_releases_everything_not_committed(make_driver: Any) -> None:
    queue = MemoryQueue(30)  # a lapse would take 30 s: the messages are released
    queue.send_many([str(n) for n in range(12)])
    driver = make_driver(queue, max_messages_per_batch=5)
    driver.latest_offset(B(0))
    driver.plan(B(0), B(1))
    driver.latest_offset(B(1))
    driver.commit(B(1))
    driver.latest_offset(B(2))  # taken, never planned
    # Nor does asking for batch 4 delete batch 3: Spark never asked for its rows.
    driver.latest_offset(B(3))
    assert queue.in_flight_count() == 7
    assert driver.stop() is True
    assert queue.visible_count() == 7 and len(queue) == 7
    assert driver.counts.released == 2 + 5
    assert driver.stop() is False
    with pytest.raises(StreamStopped):
        driver.latest_offset(B(3))


SIGTERM_SCRIPT = textwrap.dedent(
    """
    import logging, sys, time
    import boto3
    from leasekeeper import LeaseConfig
    from leasekeeper.backends.base import ForwardingBackend
    from leasekeeper.backends.sqs import SQSBackend
    from leasekeeper.spark import SQSSource
    from leasekeeper.spark.stream_driver import StreamDriver, install_sigterm_handler
    from leasekeeper.spark.stream_options import StreamOptions

    logging.basicConfig(level=logging.INFO, stream=sys.stdout, format="%(message)s")
    endpoint, url = sys.argv[1], sys.argv[2]

    class SlowSecondReceive(ForwardingBackend):
        calls = 0

        def receive(self, max_messages=1, wait_seconds=0.0, visibility_timeout=None):
            SlowSecondReceive.calls += 1
            if SlowSecondReceive.calls == 2:
                print("receiving", flush=True)
                time.sleep(3)  # SIGTERM comes now; the receive is half done
            return super().receive(max_messages, 0.0, visibility_timeout)

    client = boto3.client("sqs", region_name="us-east-1", endpoint_url=endpoint)
    source = SQSSource(url, region="us-east-1", endpoint_url=endpoint)
    options = StreamOptions(
        source=source, config=LeaseConfig(visibility_timeout=60), max_messages_per_batch=10
    )
    driver = StreamDriver(options, backend=SlowSecondReceive(SQSBackend(client, url)))
    assert install_sigterm_handler(lambda: driver)
    # The second receive is the reader's receiving ahead while batch 1 "runs" (or
    # the one batch 2 waits for, once asking for it deleted batch 1): SIGTERM comes
    # while it is under way.
    driver.latest_offset({"batch": 0})
    driver.plan({"batch": 0}, {"batch": 1})
    driver.latest_offset({"batch": 1})
    print("survived", flush=True)
    """
)


def test_sigterm_waits_for_a_receive_under_way_then_releases_everything(
    moto_endpoint: str, make_queue: Any, tmp_path: Path
) -> None:
    """What Spark does to the reader's process when a query stops."""
    from tests.spark.test_drain import fill, queue_depth
    from tests.sqs.conftest import CHILD_ENV, make_client

    client = make_client(moto_endpoint)
    url = make_queue(60)
    fill(client, url, 10)
    script = tmp_path / "reader.py"
    script.write_text(SIGTERM_SCRIPT)
    env = {**os.environ, **CHILD_ENV, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen(
        [sys.executable, str(script), moto_endpoint, url],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert proc.stdout is not None
        lines: list[str] = []
        while not lines or lines[-1] != "receiving":
            line = proc.stdout.readline()
            assert line, "\n".join(lines)
            lines.append(line.strip())
        # The receive under way gets this message: leased, then released.
        client.send_message(QueueUrl=url, MessageBody="late")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    out = "\n".join(lines) + "\n" + out
    assert proc.returncode == -signal.SIGTERM, out
    assert "survived" not in out
    # Batch 1 went when batch 2 was asked for; the late one, received by the
    # receive under way, is released.
    assert "'received': 11" in out and "'deleted': 10" in out, out
    assert "'released': 1}" in out, out
    attributes = client.get_queue_attributes(
        QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
    )["Attributes"]
    # Visible at once, though its receive hid it for 60 s.
    assert int(attributes["ApproximateNumberOfMessages"]) == 1, out
    assert queue_depth(client, url) == 1
