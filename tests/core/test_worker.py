"""Worker: receive loop, handler pool, leases and graceful shutdown (real time)."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from leasekeeper import LeaseManager, Message, ReceiveError, Worker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import FaultyBackend, ManualClock

TIMING = {"visibility_timeout": 1.0, "timer_interval": 0.1, "minimal_life": 0.3}
# On a ManualClock: 30 s leases, a 1 s long poll, and time moved by the test.
MANUAL = {"visibility_timeout": 30.0, "timer_interval": 1.0, "minimal_life": 2.0}


def run_in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, list[Any]]:
    """Run ``fn`` in a thread; the list gets its result, or the exception it raised."""
    out: list[Any] = []

    def target() -> None:
        try:
            out.append(fn(*args, **kwargs))
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, out


def drive(clock: ManualClock, thread: threading.Thread, step: float = 1.0) -> None:
    """Advance ``clock`` by ``step`` each time the worker waits on it, until ``thread``
    ends: time moves only while the worker waits, so every run takes the same steps."""
    for _ in range(10_000):
        if not thread.is_alive():
            return
        if clock.wait_for_sleepers(1, timeout=0.2):
            clock.advance(step)
    raise AssertionError("the worker never finished")


def test_worker_processes_everything_and_stops_when_idle(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    for i in range(12):
        queue.send(f"job {i}")
    seen: list[str] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        with lock:
            seen.append(message.id)

    worker = Worker(queue, handler, concurrency=4, wait_seconds=1, clock=clock, **MANUAL)
    thread, out = run_in_thread(worker.run, until_idle=5)
    started = clock.now()
    drive(clock, thread)
    (stats,) = out
    assert (stats.received, stats.completed, stats.failed) == (12, 12, 0)
    assert len(queue) == 0 and len(set(seen)) == 12
    assert worker.manager.closed
    # It stopped once idle for 5 s of its clock (its deletes are answered in real
    # time, by the coalescer, so how much further the clock went varies).
    assert clock.now() - started >= 5


def test_failing_handler_releases_its_message(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    queue.send("poison")

    def handler(message: Message) -> None:
        raise ValueError("bad payload")

    worker = Worker(
        queue, handler, concurrency=1, wait_seconds=1, release_delay=60.0, clock=clock, **MANUAL
    )
    thread, out = run_in_thread(worker.run, until_idle=5)
    drive(clock, thread)
    assert out[0].failed == 1 and out[0].completed == 0
    assert len(queue) == 1 and queue.visible_count() == 0  # released with a 60 s delay


def test_worker_never_holds_more_than_it_can_run(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    for i in range(10):
        queue.send(f"job {i}")
    started = threading.Semaphore(0)
    finish = threading.Event()

    def handler(message: Message) -> None:
        started.release()
        finish.wait(30)

    worker = Worker(
        queue, handler, concurrency=2, batch_size=10, wait_seconds=1, clock=clock, **MANUAL
    )
    thread, _ = run_in_thread(worker.run, until_idle=5)
    assert started.acquire(timeout=30) and started.acquire(timeout=30)
    # Both handlers run: the loop waits for a free slot and receives nothing more.
    assert queue.in_flight_count() == 2  # not 10: the rest stay available to others
    clock.advance(100)  # their leases are renewed meanwhile, no receive happens
    assert queue.in_flight_count() == 2 and queue.calls["receive"] == 1
    finish.set()
    drive(clock, thread)
    assert worker.stats.completed == 10


def test_stop_waits_for_running_handlers_then_releases_the_rest(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    queue.send_many(["quick", "stuck"])
    running = threading.Semaphore(0)
    quick_may_finish = threading.Event()
    done: list[str] = []

    def handler(message: Message) -> None:
        running.release()
        if message.body == "stuck":
            threading.Event().wait(30)  # never finishes in time
            return
        assert quick_may_finish.wait(30)
        done.append(str(message.body))

    worker = Worker(
        queue, handler, concurrency=2, wait_seconds=1, shutdown_timeout=10, clock=clock, **MANUAL
    )
    thread, _ = run_in_thread(worker.run)
    assert running.acquire(timeout=30) and running.acquire(timeout=30)
    stopper, _ = run_in_thread(worker.stop, 60)
    quick_may_finish.set()
    # "quick" finishes during the graceful stop (in real time: no clock moves until
    # its delete is answered)...
    deadline = time.monotonic() + 30
    while worker.stats.completed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    # ...then the shutdown waits out the rest of its 10 s for "stuck", and releases it.
    drive(clock, thread, step=5.0)
    stopper.join(30)
    assert done == ["quick"]  # finished (its lease renewed meanwhile) and deleted
    assert len(queue) == 1 and queue.visible_count() == 1  # "stuck" released at once


def test_worker_on_a_shared_manager_leaves_it_open(clock: ManualClock) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    queue.send("job")
    manager = LeaseManager(queue, clock=clock, **MANUAL)
    worker = Worker(manager, lambda m: None, wait_seconds=1)
    assert worker.clock is clock
    thread, out = run_in_thread(worker.run, until_idle=3)
    drive(clock, thread)
    assert out[0].completed == 1
    assert not manager.closed
    # Run again, as a user of a manager of their own may: the new job is handled.
    queue.send("another job")
    thread, out = run_in_thread(worker.run, until_idle=3)
    drive(clock, thread)
    assert out[0].completed == 2 and len(queue) == 0
    manager.close()


def test_shutdown_on_a_shared_manager_tells_unfinished_handlers_to_stop(
    clock: ManualClock,
) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    queue.send("stuck")
    manager = LeaseManager(queue, clock=clock, **MANUAL)
    running = threading.Event()
    told = threading.Event()

    def handler(message: Message) -> None:
        lease = manager.get(message)
        assert lease is not None
        running.set()
        if lease.lost.wait(30):
            told.set()

    worker = Worker(manager, handler, wait_seconds=1, shutdown_timeout=3)
    thread, _ = run_in_thread(worker.run)
    assert running.wait(30)
    worker.stop(timeout=0)  # asks; the run's thread does the shutdown
    drive(clock, thread)
    assert told.wait(30), "the handler's lease.lost was not set when shutdown released it"
    assert queue.visible_count() == 1
    deadline = time.monotonic() + 30  # the handler thread finishes after run() returns
    while worker.stats.lost == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert worker.stats.lost == 1  # its with-block ended in LeaseLost, nothing deleted
    assert queue.deleted_ids == []
    manager.close()


def test_worker_rejects_bad_arguments() -> None:
    queue = MemoryQueue(1.0)
    with pytest.raises(TypeError, match="callable"):
        Worker(queue, "handler")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="concurrency"):
        Worker(queue, print, concurrency=0)
    with pytest.raises(TypeError, match="LeaseManager or a leasekeeper backend"):
        Worker(object(), print)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no backend"):
        Worker(LeaseManager(), print)


SCRIPT = textwrap.dedent(
    """
    import json, sys, threading, time
    from leasekeeper import Worker
    from leasekeeper.backends.memory import MemoryQueue

    queue = MemoryQueue(1.0)
    queue.send_many(["short", "long"])
    def handler(message):
        if message.body == "long":
            print("started", flush=True)
            time.sleep(0.8)
    worker = Worker(queue, handler, concurrency=2, wait_seconds=0.05, shutdown_timeout=5,
                    visibility_timeout=1.0, timer_interval=0.1, minimal_life=0.3)
    stats = worker.run()
    print(json.dumps({"completed": stats.completed, "left": len(queue)}), flush=True)
    """
)


def test_sigterm_lets_running_handlers_finish(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=15)
    assert proc.returncode == 0
    assert json.loads(out.strip().splitlines()[-1]) == {"completed": 2, "left": 0}


def test_worker_keeps_receives_within_the_services_limits() -> None:
    queue = MemoryQueue(1.0)
    queue.max_receive = 3  # type: ignore[attr-defined]
    queue.max_wait_seconds = 0.5  # type: ignore[attr-defined]
    worker = Worker(queue, print, batch_size=10, wait_seconds=20)
    assert (worker.batch_size, worker.wait_seconds) == (3, 0.5)


# ------------------------------------------------------------------ receive errors


def test_a_fatal_receive_error_stops_the_worker_after_running_handlers(
    clock: ManualClock,
) -> None:
    """Queue deleted, credentials refused: retrying cannot help. The worker stops as
    stop() would (the running handler finishes and its message is deleted), and
    run() raises the error."""
    queue = MemoryQueue(30.0, clock=clock)
    queue.send("job")
    faulty = FaultyBackend(queue)
    faulty.script("receive", "pass", "fatal")
    go = threading.Event()
    finished: list[str] = []

    def handler(message: Message) -> None:
        assert go.wait(30)
        finished.append(message.id)

    worker = Worker(faulty, handler, concurrency=2, wait_seconds=1, clock=clock, **MANUAL)
    thread, out = run_in_thread(worker.run)
    for _ in range(1000):  # step the clock (the loop gathers before its next receive)
        if faulty.injected("fatal", "receive"):
            break
        if clock.wait_for_sleepers(1, timeout=0.2):
            clock.advance(0.05)
    assert faulty.injected("fatal", "receive") == 1
    go.set()  # the running handler finishes during the graceful stop
    # Before the clock moves on: driven while the handler thread has yet to run (a
    # loaded machine), the stop's grace period would pass on the clock first.
    deadline = time.monotonic() + 30
    while queue.deleted_ids != ["m-000001"] and time.monotonic() < deadline:
        time.sleep(0.01)
    drive(clock, thread)
    (raised,) = out
    assert isinstance(raised, ReceiveError)
    assert not raised.retryable and raised.kind == "fatal"
    assert worker.error is raised
    assert finished == ["m-000001"] and queue.deleted_ids == ["m-000001"]
    assert worker.stats.completed == 1 and worker.manager.closed


def test_a_started_worker_keeps_and_logs_its_fatal_receive_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    faulty = FaultyBackend(MemoryQueue(1.0))
    faulty.script("receive", "fatal")
    caplog.set_level(logging.ERROR, logger="leasekeeper.worker")
    worker = Worker(faulty, lambda message: None, wait_seconds=0.05, **TIMING).start()
    deadline = time.monotonic() + 10
    while worker.error is None and time.monotonic() < deadline:
        time.sleep(0.01)
    worker.stop(10)  # joins the thread, which ended by itself
    assert isinstance(worker.error, ReceiveError) and not worker.error.retryable
    assert worker.manager.closed
    assert any("failed for good" in r.getMessage() for r in caplog.records)


def test_retryable_receive_errors_are_retried_with_backoff(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    queue = MemoryQueue(30.0, clock=clock)
    queue.send("job")
    faulty = FaultyBackend(queue)
    # Two transient errors, then one of a type no leasekeeper backend raises (a
    # custom backend's own): all retried, and the message is handled after them.
    faulty.script("receive", "retry", "throttle", RuntimeError("custom backend failed"))
    caplog.set_level(logging.WARNING, logger="leasekeeper.worker")
    done = threading.Event()
    worker = Worker(faulty, lambda message: done.set(), wait_seconds=1, clock=clock, **MANUAL)
    thread, out = run_in_thread(worker.run, until_idle=5)
    started = clock.now()
    drive(clock, thread, step=0.1)
    stats = out[0]
    assert done.is_set() and stats.completed == 1 and worker.error is None
    messages = [r.getMessage() for r in caplog.records]
    assert sum("retrying in" in m for m in messages) == 3
    assert any("RuntimeError, not a leasekeeper ReceiveError" in m for m in messages)
    assert not any("custom backend failed" in m for m in messages)  # its text is not logged
    # The pauses grew (0.2 s, 0.4 s, 0.8 s, jittered): the job waited them out on the
    # worker's clock before being handled.
    assert clock.now() - started >= 5 + 0.2 * 0.8 + 0.4 * 0.8 + 0.8 * 0.8


# ------------------------------------------------------------------ a queue that cannot be reached


def test_a_queue_never_reached_stops_the_run_after_reach_within(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    """docs/guide.md, "When a service cannot be reached": at start, an unreachable
    queue is a mistake to report, not an outage to wait out: run() raises the last
    (retryable) error once REACH_WITHIN seconds passed without an answer."""
    from leasekeeper.receiving import REACH_WITHIN

    faulty = FaultyBackend(MemoryQueue(30.0, clock=clock))
    faulty.script("receive", *["retry"] * 200)
    caplog.set_level(logging.WARNING, logger="leasekeeper.worker")
    worker = Worker(faulty, lambda message: None, clock=clock, renewer="thread", **MANUAL)
    thread, out = run_in_thread(worker.run)
    started = clock.now()
    drive(clock, thread, step=0.5)
    (raised,) = out
    assert isinstance(raised, ReceiveError) and raised.retryable and worker.error is raised
    # Bounded: given up at REACH_WITHIN of its clock, not a backoff pause later.
    assert REACH_WITHIN <= clock.now() - started <= REACH_WITHIN + 1
    assert any(f"no answer from the queue in {REACH_WITHIN:g}s" in r.getMessage()
               for r in caplog.records if r.levelno == logging.ERROR)  # fmt: skip
    assert worker.manager.closed


def test_until_idle_ends_a_run_whose_queue_cannot_be_reached(clock: ManualClock) -> None:
    """run(until_idle=N) ends N seconds after the last message, reachable or not, and
    raises when the queue never answered (a cron drain must not hang)."""
    faulty = FaultyBackend(MemoryQueue(30.0, clock=clock))
    faulty.script("receive", *["retry"] * 200)
    worker = Worker(faulty, lambda message: None, clock=clock, renewer="thread", **MANUAL)
    thread, out = run_in_thread(worker.run, until_idle=3)
    started = clock.now()
    drive(clock, thread, step=0.25)
    (raised,) = out
    assert isinstance(raised, ReceiveError) and raised.retryable
    assert 3 <= clock.now() - started <= 3.5


def test_a_queue_that_answered_once_is_retried_past_reach_within(clock: ManualClock) -> None:
    """Once the queue has answered, an outage is retried for ever; with until_idle the
    run ends after N idle seconds, and returns (the queue was reached)."""
    from leasekeeper.receiving import REACH_WITHIN

    queue = MemoryQueue(30.0, clock=clock)
    queue.send("job")
    faulty = FaultyBackend(queue)
    faulty.script("receive", "pass", *["retry"] * 400)
    done: list[str] = []
    worker = Worker(faulty, lambda m: done.append(m.id), clock=clock, renewer="thread", **MANUAL)
    thread, out = run_in_thread(worker.run)
    started = clock.now()
    while clock.now() - started < 3 * REACH_WITHIN:  # past the start window, still running
        assert thread.is_alive() and not out
        if clock.wait_for_sleepers(1, timeout=0.2):
            clock.advance(1.0)
    worker.stop(0)
    drive(clock, thread)
    assert done == ["m-000001"] and out == [worker.stats] and worker.error is None
    again = FaultyBackend(MemoryQueue(30.0, clock=clock))
    again.script("receive", "pass", *["retry"] * 400)
    idle = Worker(again, lambda m: None, clock=clock, renewer="thread", **MANUAL)
    thread, out = run_in_thread(idle.run, until_idle=5)
    started = clock.now()
    drive(clock, thread, step=0.5)
    assert out == [idle.stats] and 5 <= clock.now() - started <= 6


# ------------------------------------------------------------------ the handler, Ctrl-C


@pytest.mark.parametrize(
    ("handler", "words"),
    [
        (lambda: None, "takes () (too many positional arguments)"),
        (lambda message, context: None, "takes (message, context) (missing a required argument"),
    ],
)
def test_a_handler_that_cannot_take_one_message_is_refused_at_construction(
    handler: Any, words: str
) -> None:
    """As the command refuses it: accepted, every message would fail with a TypeError
    and be retried for ever."""
    with pytest.raises(TypeError, match="cannot be called with one message") as raised:
        Worker(MemoryQueue(), handler, renewer="thread")
    assert words in str(raised.value) and "def handle(message)" in str(raised.value)
    Worker(MemoryQueue(), lambda message, context=None: None, renewer="thread").manager.close()
    Worker(MemoryQueue(), print, renewer="thread").manager.close()  # *args: fine


FIRST_SIGNAL = textwrap.dedent(
    """
    import sys, time
    from leasekeeper import MemoryQueue, Worker

    queue = MemoryQueue()
    queue.send("job")

    def handle(message):
        print("started", flush=True)
        time.sleep(15)

    # No logging set up: Python's last-resort handler prints WARNING and above.
    Worker(queue, handle, shutdown_timeout=25, renewer="thread").run()
    print("ended", flush=True)
    """
)


def test_the_first_ctrl_c_says_at_once_what_the_worker_waits_for(tmp_path: Path) -> None:
    script = tmp_path / "first_signal.py"
    script.write_text(FIRST_SIGNAL)
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        line = proc.stderr.readline()
        assert time.monotonic() - sent < 2, "the first Ctrl-C said nothing for 2 s"
        assert line.strip() == (
            "Ctrl-C (SIGINT): stopping; waiting up to 25s for 1 running handler(s) to "
            "finish (their leases renewed meanwhile); a second Ctrl-C releases their "
            "messages now"
        )
        proc.send_signal(signal.SIGINT)  # the second: released now, not in 13 s
        out, err = proc.communicate(timeout=10)
        assert proc.returncode == 0 and out.strip() == "ended"
        assert "releasing running messages now" in err
    finally:
        proc.kill()
        proc.wait()
