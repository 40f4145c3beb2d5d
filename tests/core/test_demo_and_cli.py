"""The demo's three-way comparison, and the command line."""

from __future__ import annotations

import io
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from leasekeeper import LeaseManager
from leasekeeper.command import demo
from leasekeeper.command.cli import main
from leasekeeper.command.demo import LONG_UNITS, run_demo
from tests.helpers import svg_text_problems


@pytest.mark.realtime
def test_demo_shows_the_trade_and_leasekeeper_ends_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # The demo runs in real time with a 0.4 s visibility timeout (renewed when 0.13 s
    # remain): on a busy machine a lease can lapse, and then - rule 5 - it is lost and
    # its job may run twice. Keep the demo's managers to tell that from a bug.
    managers: list[LeaseManager] = []

    def recording(*args: Any, **kwargs: Any) -> LeaseManager:
        managers.append(LeaseManager(*args, **kwargs))
        return managers[-1]

    monkeypatch.setattr(demo, "LeaseManager", recording)
    out = io.StringIO()
    svg = tmp_path / "demo.svg"
    long_timeout, short_no_lease, leased = run_demo(seconds=10, out=out, tty=False, svg=svg)
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
    text = out.getvalue()
    assert "(c) short timeout + leasekeeper" in text and "duplicates" in text
    # The timelines, drawn once at the end without terminal codes: each job's rows,
    # every renewal of (c), the crash, and (b)'s duplicate runs.
    assert "\x1b[" not in text and text.count("job-1 ") == 3 and "✗" in text
    runs = {o.title[:3]: o.timeline.snapshot() for o in (long_timeout, short_no_lease, leased)}
    assert sum(len(r.renewals) for r in runs["(c)"]) == leased.extensions
    assert sum(r.duplicate for r in runs["(b)"]) == short_no_lease.duplicates
    assert [r.ending for r in runs["(c)"]].count("crashed") == 1
    # Whatever the threads' start order: w1 takes the first job and crashes holding it.
    for title, scenario_runs in runs.items():
        crashed = [r.worker for r in scenario_runs if r.ending == "crashed"]
        assert crashed == ["w1"], (title, crashed)
    # The same as SVG: three panels, a bar per run, a tick per renewal.
    root = ET.parse(svg).getroot()
    marks = [e.attrib.get("class", "") for e in root.iter()]
    assert marks.count("timeline") == 3
    assert sum(c.startswith("run") for c in marks) == sum(len(r) for r in runs.values())
    assert marks.count("renewal") == leased.extensions
    assert marks.count("run duplicate") == short_no_lease.duplicates
    # No text of the picture overlaps another or leaves the canvas.
    assert svg_text_problems(svg.read_text()) == []


@pytest.mark.realtime
def test_in_a_terminal_the_demo_redraws_its_timelines_in_place(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LINES", "60")
    monkeypatch.setenv("COLUMNS", "120")
    monkeypatch.delenv("NO_COLOR", raising=False)
    out = io.StringIO()
    *_, leased = run_demo(seconds=10, out=out, tty=True)
    text = out.getvalue()
    assert leased.duplicates == 0 and leased.completed == 3
    assert text.count("\x1b[J") > 10  # frames redrawn over the previous one
    final = text[text.rindex("\x1b[J") :]
    assert "(a) long timeout" in final and "crashed" in final and "scenario" in final


def test_config_command_validates(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--visibility-timeout", "60"]) == 0
    out = capsys.readouterr().out.splitlines()
    # Each value once, under the flag that sets it; the derived threshold as a number.
    assert "--visibility-timeout   60.0" in out
    assert "--extend-threshold     20 (derived)" in out
    assert "--max-lease-duration   unset" in out
    assert not any("None" in line or "threshold in force" in line for line in out)
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
    assert "--extend-threshold (40) must be less than --visibility-timeout (30)" in result.stderr


def test_the_install_hints_name_what_each_extra_brings() -> None:
    """The missing-SDK errors name the extra's own packages (leasekeeper is not on
    PyPI, so ``pip install 'leasekeeper[sqs]'`` works only where it is installed):
    ``leasekeeper.errors.EXTRAS`` is pyproject.toml's optional-dependencies, and each
    backend module's message is ``install_hint`` of its extra."""
    import importlib.metadata
    import re
    from pathlib import Path

    from leasekeeper.errors import EXTRAS, install_hint

    declared: dict[str, list[str]] = {}
    for requirement in importlib.metadata.requires("leasekeeper") or []:
        name, _, marker = requirement.partition(";")
        extra = re.search(r"extra == [\"']([^\"']+)[\"']", marker)
        if extra is not None:
            declared.setdefault(extra.group(1), []).append(name.strip().replace(" ", ""))
    for extra, requirement in EXTRAS.items():
        assert declared[extra] == [requirement.replace(" ", "")], extra
    source = Path(__file__).resolve().parents[2] / "src" / "leasekeeper"
    for extra, module in (
        ("sqs", "backends/sqs/backend.py"),
        ("mns", "backends/mns.py"),
        ("azure", "backends/azure.py"),
        ("redis", "backends/redis.py"),
    ):
        assert install_hint(extra) in (source / module).read_text(), module
