"""The code blocks of README.md and docs/ are tests (docs/contributing.md, "Code blocks").

pytest collects these two paths too (pyproject.toml's testpaths); this hook hands
their Markdown files to Sybil, and ``harness`` is the fixture their blocks get.

``make test`` runs the suite in two processes (pytest-xdist, ``--dist loadgroup``);
``pytest_collection_modifyitems`` below says what must share one.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.docs.blocks import collect_docs as pytest_collect_file
from tests.docs.harness import harness

# The local services (moto...): also when only README.md or docs/ are collected.
pytest_plugins = ["tests.services"]

__all__ = ["harness", "pytest_collect_file", "pytest_collection_modifyitems"]

ROOT = Path(__file__).resolve().parent
SPARK = ROOT / "tests" / "spark"


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """One xdist group per file: a page's blocks share one namespace and run in
    order, and a module's fixtures (a Spark session, a worker process) are set up
    once. Every Spark test is in one group: one JVM and one standalone cluster at a
    time, on a machine of two cores."""
    for item in items:
        path = Path(item.path)
        group = "spark" if SPARK in path.parents else str(path.relative_to(ROOT))
        item.add_marker(pytest.mark.xdist_group(group))
