"""examples/mns_worker.py, run as a user would, against the local MNS server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from leasekeeper.testing.mns_server import MNSServer
from tests.mns.conftest import ACCESS_ID, ACCESS_KEY

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "mns_worker.py"


@pytest.mark.realtime
def test_example_worker_runs_long_jobs_once(
    mns_server: MNSServer, make_queue: Any, tmp_path: Path
) -> None:
    name, _ = make_queue(3)
    env = dict(os.environ)
    env.update(
        MNS_ENDPOINT=mns_server.endpoint,
        MNS_QUEUE=name,
        MNS_ACCESS_KEY_ID=ACCESS_ID,
        MNS_ACCESS_KEY_SECRET=ACCESS_KEY,
        WAIT_SECONDS="1",
    )
    sent = subprocess.run(
        [sys.executable, str(EXAMPLE), "--send", "2", "--seconds", "4"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "sent 2 job(s)" in sent.stdout
    log_path = tmp_path / "worker.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, str(EXAMPLE)], env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
        try:
            deadline = time.monotonic() + 20
            while mns_server.queue_stats(name).deleted_count < 2:
                assert proc.poll() is None, log_path.read_text()
                assert time.monotonic() < deadline, log_path.read_text()
                time.sleep(0.1)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(15) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    output = log_path.read_text()
    assert "stopped: 2 completed, 0 failed, 0 lost" in output
    # Each 4 s job outlived the queue's 3 s timeout and was still received only once.
    assert set(mns_server.queue_stats(name).receive_counts.values()) == {1}
    assert ACCESS_KEY not in output
