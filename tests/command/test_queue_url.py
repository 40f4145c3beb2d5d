"""``leasekeeper worker MODULE:HANDLER --queue URL``: any queue ``leasekeeper.connect``
takes, a plug-in's scheme included, with the process renewer (that builds the
plug-in's backend again from its spec); and a URL that cannot work is one line and
exit code 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import pytest

import leasekeeper
from tests.plugin import write_plugin

REPO = Path(__file__).resolve().parents[2]

JOBS = textwrap.dedent(
    """
    import os, time

    def handle(message):
        os.write(1, f"start {message.body}\\n".encode())
        time.sleep(3)
        os.write(1, f"done {message.body}\\n".encode())
    """
)
TIMING = ["--visibility-timeout", "2", "--timer-interval", "0.2", "--minimal-life", "0.5"]
TIMING += ["--status-every", "0"]


@pytest.mark.realtime
def test_a_plugins_scheme_runs_with_the_process_renewer(redis_url: str, tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    plugin = write_plugin(tmp_path / "site")  # as ``pip install relay-plugin`` would
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(plugin), str(REPO)]),
        "RELAY_REDIS_URL": redis_url,
    }
    stream = f"cmd-{uuid.uuid4().hex[:8]}"
    url = f"{redis_url}?stream={stream}&group=leasekeeper"
    producer = leasekeeper.connect(url, consumer="producer")
    bodies = [f"job-{i}" for i in range(4)]
    for body in bodies:
        producer.send(body)  # type: ignore[attr-defined]
    args = ["--queue", f"relay://{stream}", "--renewer", "process", "--concurrency", "4"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "leasekeeper", "worker", "jobs:handle", *args, *TIMING],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    other = leasekeeper.connect(url, consumer="other")
    stolen: list[str] = []
    stop = threading.Event()

    def poll() -> None:  # another consumer of the group, the whole time
        while not stop.is_set():
            stolen.extend(m.body for m in other.receive(max_messages=10, wait_seconds=0.5))  # type: ignore[misc]

    assert proc.stdout is not None
    spy = threading.Thread(target=poll, daemon=True)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(4)]
        assert sorted(lines) == sorted(f"start {b}" for b in bodies), lines
        spy.start()  # all four leased and running for 3 s, at a 2 s timeout
        lines += [proc.stdout.readline().strip() for _ in range(4)]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        stop.set()
        proc.kill()
    spy.join(30)
    assert proc.returncode == 0, err
    assert sorted(line for line in lines + out.split("\n") if line.startswith("done")) == sorted(
        f"done {b}" for b in bodies
    )
    assert stolen == [], "a leased message reached another consumer"
    assert "renewer process" in err and "Traceback" not in err
    assert producer.receive(wait_seconds=0.5) == []  # all deleted


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("nowhere://x", "no leasekeeper backend for the scheme 'nowhere'; installed schemes:"),
        ("https://example.com/q", "is not an SQS queue URL"),
        ("redis://localhost:6379/0", "names no stream"),
    ],
)
def test_a_queue_url_that_cannot_work_is_one_line_and_exit_2(
    url: str, expected: str, tmp_path: Path
) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    result = subprocess.run(
        [sys.executable, "-m", "leasekeeper", "worker", "jobs:handle", "--queue", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith("leasekeeper worker: error: ") and expected in line, line


def test_an_in_memory_queue_is_said_to_live_only_in_this_process(tmp_path: Path) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    args = ["--queue", "memory://jobs", "--until-idle", "0.2", *TIMING]
    result = subprocess.run(
        [sys.executable, "-m", "leasekeeper", "worker", "jobs:handle", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    [notice] = [line for line in result.stderr.splitlines() if "in-memory" in line]
    assert "WARNING" in notice and "lives only in this process" in notice
    assert "memory://jobs" in notice or "'jobs'" in notice
