"""The renewer process imports leasekeeper from where its worker did.

A worker may find leasekeeper on a path it added in code - a copy vendored into an
application, a script's ``sys.path.insert`` - where a fresh interpreter would not
look. Its renewer process must still start (the thread renewer works there), and
import that same copy, not another installed one.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import leasekeeper

pytestmark = [pytest.mark.realtime]

REPO = Path(__file__).resolve().parents[2]
VENDORED = Path(leasekeeper.__file__).resolve().parents[1]  # the directory holding it

WORKER = """
import sys
sys.path[:0] = [{vendored!r}, {repo!r}]
from benchmarks.nullq import NullBackend
from leasekeeper import LeaseManager

backend = NullBackend()
manager = LeaseManager(backend, renewer={renewer!r}, visibility_timeout=60)
(message,) = backend.receive(max_messages=1, visibility_timeout=60)
manager.register(message).complete()
print(manager.renewer.name, manager.stats().as_dict()["completed"])
manager.close()
"""


def _run_bare(python: str, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in ``cwd``, with no ``PYTHONPATH``: it finds only what a
    fresh interpreter finds, and what ``code`` puts on sys.path itself."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [python, "-c", code],
        check=False,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _interpreter_without_leasekeeper(cwd: Path) -> str:
    """This Python's base interpreter (outside the virtualenv): it has no leasekeeper
    of its own - which is what makes the worker's copy one found only in code."""
    base = str(getattr(sys, "_base_executable", sys.executable))
    if _run_bare(base, "import leasekeeper", cwd).returncode == 0:
        pytest.fail(f"{base} imports a leasekeeper of its own: this test needs one that does not")
    return base


@pytest.mark.parametrize("renewer", ["process", "auto"])
def test_a_leasekeeper_found_on_a_path_added_in_code_renews_in_a_process(
    tmp_path: Path, renewer: str
) -> None:
    python = _interpreter_without_leasekeeper(tmp_path)
    script = WORKER.format(vendored=str(VENDORED), repo=str(REPO), renewer=renewer)
    done = _run_bare(python, script, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["process", "1"]
    assert "could not start" not in done.stderr  # auto did not fall back, with a WARNING
