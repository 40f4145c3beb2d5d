"""examples/priorities.py, run as a user would: urgent and bulk queues in one worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "priorities.py"

pytestmark = [pytest.mark.realtime]


def test_urgent_jobs_go_first_and_bulk_work_keeps_moving() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
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
    first = lines[lines.index("the first 24 jobs done, by queue:") + 1].split()
    # Weights 3:1 while both have work: urgent first, bulk never starved.
    assert 14 <= first.count("U") <= 21 and first.count("b") >= 3
    (among,) = [line for line in lines if line.startswith("all 20 urgent jobs done")]
    assert int(among.split()[-3]) <= 32  # not after most of the 60 bulk jobs
    assert "urgent: received 20, completed 20" in lines
    assert "bulk: received 60, completed 60" in lines
    assert "in total: completed 80, left: 0" in lines
