from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from leasekeeper import LeaseManager
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import ManualClock
from tests.helpers import ScriptedBackend

# The local services (moto, the MNS server, Azurite): one of each per session, shared
# by every directory that needs them.
pytest_plugins = ["tests.services"]

# Timing used by most core tests: 30 s visibility renewed when 10 s remain.
FAST = {"visibility_timeout": 30.0, "timer_interval": 1.0, "minimal_life": 2.0}


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def queue(clock: ManualClock) -> MemoryQueue:
    return MemoryQueue(visibility_timeout=30.0, clock=clock)


@pytest.fixture
def rotating(clock: ManualClock) -> MemoryQueue:
    return MemoryQueue(visibility_timeout=30.0, clock=clock, rotate_receipts=True)


@pytest.fixture
def scripted(rotating: MemoryQueue) -> ScriptedBackend:
    return ScriptedBackend(rotating)


@pytest.fixture
def make_manager(clock: ManualClock) -> Iterator[Any]:
    made: list[LeaseManager] = []

    def make(backend: Any, **kwargs: Any) -> LeaseManager:
        settings = {**FAST, **kwargs}
        manager = LeaseManager(backend, clock=settings.pop("clock", clock), **settings)
        made.append(manager)
        return manager

    yield make
    for manager in made:
        manager.close(release=False)
