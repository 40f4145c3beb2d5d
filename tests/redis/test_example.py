"""examples/queue_by_url.py, run as a user would: on the in-memory queue and on
Redis Streams, the same code."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "queue_by_url.py"


@pytest.mark.parametrize("where", ["memory", "redis"])
def test_the_example_runs_the_same_on_any_url(where: str, redis_url: str) -> None:
    args = [] if where == "memory" else [f"{redis_url}?stream=example-{uuid.uuid4().hex[:8]}"]
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert sorted(lines[:-1]) == sorted(f"job {n} (tenant t{n % 3}, delivery 1)" for n in range(10))
    assert lines[-1] == "completed 10, failed 0, lost 0"
