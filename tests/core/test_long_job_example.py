"""examples/long_job.py, run as a user would (at twice its speed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "long_job.py"

pytestmark = [pytest.mark.realtime]


def test_the_long_job_example_finishes_through_its_rollovers() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "LONG_JOB_SCALE": "0.5"}
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    hops = [line for line in lines if line.startswith("hop ")]
    # Three caps of work: at least three hops (how many more, a loaded machine's
    # sleeps decide), numbered in order.
    assert len(hops) >= 3
    assert [line.split()[1] for line in hops] == [str(n) for n in range(len(hops))]
    # Each hop resumed where the one before it stood, from its last checkpoint.
    starts = [int(line.rsplit(" ", 1)[1]) for line in hops]
    assert starts[0] == 0 and starts == sorted(set(starts)) and starts[-1] < 24
    rolled = len(hops) - 1
    assert f"completed 1, rolled over {rolled}, lost 0, overlapping hops 0" in lines
    assert "left on the queue: 0" in lines
    # No lapse, no lost or capped lease (the one warning is that failing messages
    # have no dead-letter queue here).
    warnings = [line for line in result.stderr.splitlines() if "WARNING" in line]
    assert all("leasekeeper.failures" in line for line in warnings), warnings
