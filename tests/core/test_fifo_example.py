"""examples/fifo_worker.py, run as a user would: each order's events in order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fifo_worker.py"

pytestmark = [pytest.mark.realtime]


def run_example(env: dict[str, str]) -> list[str]:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def check_orders(lines: list[str]) -> None:
    """Every order's events handled in the order sent; o-2's "paid" twice."""
    assert lines[:4] == [
        "o-1: created paid packed shipped",
        "o-2: created paid packed shipped (paid tried twice)",
        "o-3: created paid packed shipped",
        "o-4: created paid packed shipped",
    ]
    assert lines[4].startswith("completed 16, failed 1, held back ")


def test_each_orders_events_run_in_order_on_an_in_memory_fifo_queue() -> None:
    env = {k: v for k, v in os.environ.items() if k != "QUEUE_URL"}
    check_orders(run_example({**env, "QUEUE_URL": "memory://orders.fifo"}))
