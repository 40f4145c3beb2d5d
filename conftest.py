"""The code blocks of README.md and docs/ are tests (docs/contributing.md, "Code blocks").

pytest collects these two paths too (pyproject.toml's testpaths); this hook hands
their Markdown files to Sybil, and ``harness`` is the fixture their blocks get.
"""

from tests.docs.blocks import collect_docs as pytest_collect_file
from tests.docs.harness import harness

# The local services (moto...): also when only README.md or docs/ are collected.
pytest_plugins = ["tests.services"]

__all__ = ["harness", "pytest_collect_file"]
