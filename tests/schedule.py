"""How ``make test`` shares the suite between its two processes (pytest-xdist).

A file is one unit of work, never split: a page's code blocks share one namespace
and run in order, and a module's fixtures (a worker process, a Spark session) are
set up once. Every Spark test is one unit: one JVM and one standalone cluster at a
time on a machine of two cores. The Spark unit is the longest (about a third of
the suite), so it is collected first and starts at once; the rest is shared in
file order by whichever process is free.

(xdist's ``--dist loadgroup`` would say this with markers, but it does not group
under pytest 9: it renames items by their private ``_nodeid``.)
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScopeScheduling

SPARK = "tests/spark/"


def _is_spark(nodeid: str) -> bool:
    return nodeid.startswith(SPARK)


class ByFileSparkFirst(LoadScopeScheduling):
    """xdist's scope scheduling, with a file as the scope and tests/spark as one."""

    def _split_scope(self, nodeid: str) -> str:  # xdist's documented extension point
        return SPARK if _is_spark(nodeid) else nodeid.split("::", 1)[0]


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> ByFileSparkFirst:
    # In collection order (Spark first), not largest-file-first.
    config.option.loadscopereorder = False
    return ByFileSparkFirst(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: not _is_spark(item.nodeid))  # stable: the rest keep their order
