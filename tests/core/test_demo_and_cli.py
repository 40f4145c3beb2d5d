"""The demo's three-way comparison, and the command line."""

from __future__ import annotations

import io
import subprocess
import sys
from typing import Any

import pytest

from leasekeeper import LeaseManager, demo
from leasekeeper.cli import main
from leasekeeper.demo import LONG_UNITS, run_demo


@pytest.mark.realtime
def test_demo_shows_the_trade_and_leasekeeper_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # The demo runs in real time with a 0.4 s visibility timeout (renewed when 0.13 s
    # remain): on a busy machine a lease can lapse, and then - rule 5 - it is lost and
    # its job may run twice. Keep the demo's managers to tell that from a bug.
    managers: list[LeaseManager] = []

    def recording(*args: Any, **kwargs: Any) -> LeaseManager:
        managers.append(LeaseManager(*args, **kwargs))
        return managers[-1]

    monkeypatch.setattr(demo, "LeaseManager", recording)
    out = io.StringIO()
    long_timeout, short_no_lease, leased = run_demo(seconds=10, out=out, tty=False)
    unit = 10 / 25
    stats = [m.stats() for m in managers]
    lost = sum(s.lost for s in stats)
    # A duplicate needs a live worker's lease to have lapsed: each is a reported loss.
    assert leased.duplicates <= lost, stats
    if lost == 0:
        assert leased.duplicates == 0 and leased.completed == 3
    # Back within one short timeout of the crash, plus however late this process ran
    # (the demo's workers poll in it too; the managers measured the lateness).
    late = max(s.scheduler_lag_p99 for s in stats)
    assert leased.failover is not None and leased.failover <= 1.5 * unit + late, (late, stats)
    assert leased.extensions > 0
    assert short_no_lease.duplicates > 0
    assert long_timeout.duplicates == 0
    assert long_timeout.failover is None or long_timeout.failover >= (LONG_UNITS - 2) * unit
    table = out.getvalue()
    assert "(c) short timeout + leasekeeper" in table and "duplicates" in table


def test_config_command_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--visibility-timeout", "60"]) == 0
    assert "threshold in force" in capsys.readouterr().out
    assert main(["config", "--visibility-timeout", "2", "--minimal-life", "5"]) == 2
    assert "must exceed" in capsys.readouterr().err


def test_python_dash_m_entry_point() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "leasekeeper", "config", "--extend-threshold", "40"],
        capture_output=True,
        check=False,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "extend_threshold (40)" in result.stderr
