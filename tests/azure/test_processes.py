"""Worker processes on Azurite: failover after SIGKILL, and the example's graceful SIGTERM."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from azure.storage.queue import QueueClient

from leasekeeper.backends.azure import AzureQueueBackend

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

VISIBILITY = 2.0
TICK = 0.2
# How late the test may notice the message back: its receive poll runs every 0.05 s,
# plus one HTTP round trip, plus Azurite's own lag in making a message visible
# again (~0.1 s, docs/backend-semantics.md).
POLL_TOLERANCE = 0.3


class _Lines:
    """Collects a subprocess's output lines on a thread, so the test can wait for one."""

    def __init__(self, stream: object) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, needle: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no line with {needle!r} in {timeout}s; got {self.seen}")
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                continue
            self.seen.append(line)
            if needle in line:
                return line


@pytest.fixture
def env(azurite: str, queue_name: str) -> dict[str, str]:
    return {
        **os.environ,
        "AZURE_STORAGE_CONNECTION_STRING": azurite,
        "AZURE_QUEUE_NAME": queue_name,
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture
def spawn(env: dict[str, str]) -> Iterator[object]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str, stream: str = "stdout") -> tuple[subprocess.Popen[str], _Lines]:
        proc = subprocess.Popen(
            [sys.executable, *args],
            stdout=subprocess.PIPE if stream == "stdout" else subprocess.DEVNULL,
            stderr=subprocess.PIPE if stream == "stderr" else None,
            text=True,
            env=env,
            cwd=str(REPO),
        )
        procs.append(proc)
        out = proc.stdout if stream == "stdout" else proc.stderr
        return proc, _Lines(out)

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


def test_sigkilled_worker_message_comes_back_within_one_visibility_timeout(
    spawn: object, queue_client: QueueClient, other_consumer: AzureQueueBackend
) -> None:
    queue_client.send_message("a job that never ends")
    proc, out = spawn(str(HERE / "crash_worker.py"), str(VISIBILITY), str(TICK))  # type: ignore[operator]
    leased = out.wait_for("LEASED", timeout=30).split()[1]
    # While the worker lives, its job outlasts the visibility timeout unharmed.
    end = time.monotonic() + 1.5 * VISIBILITY
    while time.monotonic() < end:
        assert other_consumer.receive(max_messages=32, visibility_timeout=30) == []
        time.sleep(0.05)
    out.wait_for("EXTENDED 2", timeout=10)

    proc.send_signal(signal.SIGKILL)
    killed_at = time.monotonic()
    proc.wait(timeout=10)

    back = []
    while not back and time.monotonic() - killed_at < 10:
        back = other_consumer.receive(max_messages=32, visibility_timeout=30)
        if not back:
            time.sleep(0.05)
    assert back, "the message never came back"
    [message] = back
    # received_at is taken just before the receive that got it
    elapsed = message.received_at - killed_at
    assert message.id == leased
    assert message.receive_count == 2
    print(f"back after {elapsed:.3f}s")
    assert 0.3 < elapsed <= VISIBILITY + TICK + POLL_TOLERANCE, elapsed
    assert other_consumer.delete([message.handle])[0].kind == "ok"


def test_example_worker_processes_and_releases_on_sigterm(
    spawn: object, queue_client: QueueClient, other_consumer: AzureQueueBackend
) -> None:
    for _ in range(3):
        queue_client.send_message("work:0.3")
    proc, log = spawn(  # type: ignore[operator]
        str(REPO / "examples" / "azure_worker.py"),
        "--visibility-timeout",
        str(VISIBILITY),
        "--timer-interval",
        str(TICK),
        "--minimal-life",
        "0.5",
        "--shutdown-timeout",
        "0.5",
        stream="stderr",
    )
    for _ in range(3):
        log.wait_for("done after", timeout=30)
    # a job far longer than the visibility timeout, still running at SIGTERM
    queue_client.send_message("work:60")
    log.wait_for("working 60s", timeout=15)
    time.sleep(VISIBILITY)  # extended at least once meanwhile
    proc.send_signal(signal.SIGTERM)
    stopped_at = time.monotonic()
    assert proc.wait(timeout=15) == 0
    # released, not left to time out: another consumer gets it at once
    back = other_consumer.receive(wait_seconds=1.0, visibility_timeout=30)
    assert time.monotonic() - stopped_at < 5
    assert [m.body for m in back] == ["work:60"]
    assert back[0].receive_count == 2
    assert other_consumer.delete([back[0].handle])[0].kind == "ok"
    assert queue_client.get_queue_properties().approximate_message_count == 0
    log.wait_for("stopped: 4 received, 3 completed", timeout=5)
