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

import pytest

from leasekeeper import LeaseManager, Message, ReceiveError, Worker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import FaultyBackend

pytestmark = pytest.mark.realtime

TIMING = {"visibility_timeout": 1.0, "timer_interval": 0.1, "minimal_life": 0.3}


def test_worker_processes_everything_and_stops_when_idle() -> None:
    queue = MemoryQueue(1.0)
    for i in range(12):
        queue.send(f"job {i}")
    seen: list[str] = []
    lock = threading.Lock()

    def handler(message: Message) -> None:
        time.sleep(0.05)
        with lock:
            seen.append(message.id)

    worker = Worker(queue, handler, concurrency=4, wait_seconds=0.05, **TIMING)
    stats = worker.run(until_idle=0.3)
    assert (stats.received, stats.completed, stats.failed) == (12, 12, 0)
    assert len(queue) == 0 and len(set(seen)) == 12
    assert worker.manager.closed


def test_failing_handler_releases_its_message() -> None:
    queue = MemoryQueue(1.0)
    queue.send("poison")

    def handler(message: Message) -> None:
        raise ValueError("bad payload")

    worker = Worker(queue, handler, concurrency=1, wait_seconds=0.05, release_delay=5.0, **TIMING)
    stats = worker.run(until_idle=0.3)
    assert stats.failed == 1 and stats.completed == 0
    assert len(queue) == 1 and queue.visible_count() == 0  # released with a 5 s delay


def test_worker_never_holds_more_than_it_can_run() -> None:
    queue = MemoryQueue(1.0)
    for i in range(10):
        queue.send(f"job {i}")
    started = threading.Event()
    finish = threading.Event()

    def handler(message: Message) -> None:
        started.set()
        finish.wait(5)

    worker = Worker(queue, handler, concurrency=2, batch_size=10, wait_seconds=0.05, **TIMING)
    worker.start()
    assert started.wait(5)
    time.sleep(0.2)
    assert queue.in_flight_count() == 2  # not 10: the rest stay available to others
    finish.set()
    worker.stop(timeout=5)


def test_stop_waits_for_running_handlers_then_releases_the_rest() -> None:
    queue = MemoryQueue(1.0)
    queue.send_many(["quick", "stuck"])
    done: list[str] = []

    def handler(message: Message) -> None:
        if message.body == "stuck":
            time.sleep(3)
        else:
            time.sleep(0.3)
        done.append(str(message.body))

    worker = Worker(
        queue, handler, concurrency=2, wait_seconds=0.05, shutdown_timeout=1.0, **TIMING
    )
    worker.start()
    time.sleep(0.1)
    stopped_at = time.monotonic()
    worker.stop(timeout=5)
    assert time.monotonic() - stopped_at < 2.5
    assert done == ["quick"]  # finished (its lease renewed meanwhile) and deleted
    assert len(queue) == 1 and queue.visible_count() == 1  # "stuck" released at once


def test_worker_on_a_shared_manager_leaves_it_open() -> None:
    queue = MemoryQueue(1.0)
    queue.send("job")
    manager = LeaseManager(queue, **TIMING)
    worker = Worker(manager, lambda m: None, wait_seconds=0.05)
    assert worker.run(until_idle=0.2).completed == 1
    assert not manager.closed
    manager.close()


def test_shutdown_on_a_shared_manager_tells_unfinished_handlers_to_stop() -> None:
    queue = MemoryQueue(1.0)
    queue.send("stuck")
    manager = LeaseManager(queue, **TIMING)
    told = threading.Event()

    def handler(message: Message) -> None:
        lease = manager.get(message)
        assert lease is not None
        told.set() if lease.lost.wait(5) else None

    worker = Worker(manager, handler, wait_seconds=0.05, shutdown_timeout=0.3)
    worker.start()
    time.sleep(0.2)
    worker.stop(timeout=5)
    assert told.wait(5), "the handler's lease.lost was not set when shutdown released it"
    assert queue.visible_count() == 1
    deadline = time.monotonic() + 5  # the handler thread finishes after stop() returns
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


def test_a_fatal_receive_error_stops_the_worker_after_running_handlers() -> None:
    """Queue deleted, credentials refused: retrying cannot help. The worker stops as
    stop() would (the running handler finishes and its message is deleted), and
    run() raises the error."""
    queue = MemoryQueue(1.0)
    queue.send("job")
    faulty = FaultyBackend(queue)
    faulty.script("receive", "pass", "fatal")
    go = threading.Event()
    finished: list[str] = []

    def handler(message: Message) -> None:
        assert go.wait(10)
        finished.append(message.id)

    def release_the_handler_after_the_fatal_receive() -> None:
        deadline = time.monotonic() + 10
        while faulty.injected("fatal", "receive") == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        go.set()

    helper = threading.Thread(target=release_the_handler_after_the_fatal_receive)
    helper.start()
    worker = Worker(faulty, handler, concurrency=2, wait_seconds=0.05, **TIMING)
    with pytest.raises(ReceiveError) as raised:
        worker.run()
    helper.join(10)
    assert not raised.value.retryable and raised.value.kind == "fatal"
    assert worker.error is raised.value
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
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = MemoryQueue(1.0)
    queue.send("job")
    faulty = FaultyBackend(queue)
    # Two transient errors, then one of a type no leasekeeper backend raises (a
    # custom backend's own): all retried, and the message is handled after them.
    faulty.script("receive", "retry", "throttle", RuntimeError("custom backend failed"))
    caplog.set_level(logging.WARNING, logger="leasekeeper.worker")
    done = threading.Event()
    worker = Worker(faulty, lambda message: done.set(), wait_seconds=0.05, **TIMING)
    stats = worker.run(until_idle=0.5)
    assert done.is_set() and stats.completed == 1 and worker.error is None
    messages = [r.getMessage() for r in caplog.records]
    assert sum("retrying in" in m for m in messages) == 3
    assert any("RuntimeError, not a leasekeeper ReceiveError" in m for m in messages)
    assert not any("custom backend failed" in m for m in messages)  # its text is not logged
