"""examples/async_worker.py, run as a user would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "async_worker.py"

pytestmark = [pytest.mark.realtime, pytest.mark.slow]


def test_the_async_worker_example_keeps_every_job_from_the_competing_consumer() -> None:
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
    assert sum(line.startswith("done m-") for line in lines) == 20
    assert "completed 20, failed 0, lost 0" in lines
    assert "messages the competing consumer got: 0" in lines
    assert "WARNING" not in result.stderr  # no lapse, no lost lease
