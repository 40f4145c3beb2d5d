"""examples/celery_project and examples/dramatiq_project carry the two lines their
docs pages show (the scenarios of test_celery.py and test_dramatiq.py run the same
two lines in real workers)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

from leasekeeper.celery import LeaseKeeping
from leasekeeper.dramatiq import LeaseMiddleware

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def load(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_celery_project_keeps_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISIBILITY_TIMEOUT", "5")
    tasks = load(EXAMPLES / "celery_project" / "tasks.py")
    steps = tasks.app.steps["consumer"]
    assert any(isinstance(step, type) and issubclass(step, LeaseKeeping) for step in steps)
    assert tasks.app.conf.task_acks_late
    assert tasks.app.conf.broker_transport_options["visibility_timeout"] == 5


def test_the_dramatiq_project_keeps_leases(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VISIBILITY_TIMEOUT", "5")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    jobs = load(EXAMPLES / "dramatiq_project" / "jobs.py")
    (middleware,) = [m for m in jobs.broker.middleware if isinstance(m, LeaseMiddleware)]
    assert middleware.visibility_timeout == 5
    assert jobs.render.options["time_limit"] >= 3600 * 1000  # past Dramatiq's 10 minutes
