"""Reliability tests: fault matrix, model-based test, bad input, secrets.

Tests marked ``@pytest.mark.soak`` run many more cases and only under
``LEASEKEEPER_SOAK=1`` (``make soak``); otherwise they are deselected here, not
skipped, so a normal run reports them as deselected rather than as skips.
"""

from __future__ import annotations

import os

import pytest

SOAK = os.environ.get("LEASEKEEPER_SOAK") == "1"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "soak: long-running reliability runs, selected by LEASEKEEPER_SOAK=1"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if SOAK:
        return
    soak = [item for item in items if item.get_closest_marker("soak") is not None]
    if soak:
        config.hook.pytest_deselected(items=soak)
        items[:] = [item for item in items if item.get_closest_marker("soak") is None]
