"""``leasekeeper worker`` with its defaults keeps jobs that hold the GIL (issue 24).

With default settings the command renews in a process of its own: handlers that
hold the GIL for 4 s each at a 2-second visibility timeout on moto lose nothing -
another consumer, polling all along from a process of its own, sees no message,
and every job completes once. With ``--renewer thread`` the same jobs lose their
messages (issue 12: tests/sqs/test_gil_lapses.py shows that side).
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.command.test_worker_command import command, env_for, queue_url  # noqa: F401
from tests.services import make_client
from tests.sqs.competitor import Competitor

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

HOLD = 4.0  # seconds each job holds the GIL, against the 2 s visibility timeout

GIL_JOBS = textwrap.dedent(
    f"""
    import os, sys, time

    def hold(message):
        os.write(1, f"start {{message.body}}\\n".encode())
        previous = sys.getswitchinterval()
        sys.setswitchinterval({HOLD} + 5.0)  # no other thread of this process runs
        try:
            end = time.monotonic() + {HOLD}
            while time.monotonic() < end:
                pass
        finally:
            sys.setswitchinterval(previous)
        os.write(1, f"done {{message.body}}\\n".encode())
    """
)


def test_the_default_worker_keeps_jobs_that_hold_the_gil(
    moto_endpoint: str,
    queue_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    (tmp_path / "gil.py").write_text(GIL_JOBS)
    client = make_client(moto_endpoint)
    bodies = ["job-0", "job-1"]
    for body in bodies:
        client.send_message(QueueUrl=queue_url, MessageBody=body)
    with Competitor(moto_endpoint, queue_url) as other:
        proc = subprocess.Popen(
            command(
                "gil:hold",
                "--sqs",
                queue_url,
                "--visibility-timeout",
                "2",
                "--timer-interval",
                "0.2",
                "--minimal-life",
                "0.5",
                "--wait-seconds",
                "0.5",
                "--status-every",
                "0",
            ),
            cwd=tmp_path,
            env=env_for(moto_endpoint),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        try:
            first = proc.stdout.readline().strip()
            other.go()  # both messages are leased by now (a batch is leased first)
            lines = [first] + [proc.stdout.readline().strip() for _ in range(3)]
            proc.terminate()
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    lines += out.split("\n")
    assert proc.returncode == 0, err
    assert sorted(line for line in lines if line.startswith("start")) == [
        f"start {b}" for b in bodies
    ]  # once each
    assert sorted(line for line in lines if line.startswith("done")) == [
        f"done {b}" for b in bodies
    ]
    assert other.polls > 0 and other.received == [], "another consumer got a running job"
    assert "renewer process" in err  # the default, said in the start-up line
    counts = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])
    assert counts["Attributes"]["ApproximateNumberOfMessages"] == "0"
    assert counts["Attributes"]["ApproximateNumberOfMessagesNotVisible"] == "0"  # deleted
    assert "lapse" not in err and "LeaseLost" not in err and "Traceback" not in err
