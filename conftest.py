"""The code blocks of README.md and docs/ are tests (docs/contributing.md, "Code blocks").

pytest collects these two paths too (pyproject.toml's testpaths); this hook hands
their Markdown files to Sybil, and ``harness`` is the fixture their blocks get.

``make test`` runs the suite in two processes (pytest-xdist): ``tests/schedule.py``
says how the tests are shared between them.
"""

from __future__ import annotations

import importlib.util

from tests.docs.blocks import collect_docs as pytest_collect_file
from tests.docs.harness import harness

# The local services (moto...): also when only README.md or docs/ are collected.
pytest_plugins = ["tests.services"]
if importlib.util.find_spec("xdist") is not None:
    pytest_plugins.append("tests.schedule")

__all__ = ["harness", "pytest_collect_file"]
