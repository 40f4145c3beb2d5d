"""The local MNS server for the MNS backend's tests.

The session's one ``MNSServer`` (``mns_server``, from tests/services.py) and a
fresh queue per test; the real aliyun-mns-sdk talks to it over HTTP exactly as
it talks to Aliyun. Tests that need to move the server's time by hand get their
own server on a ``FakeClock`` (``faked_server``).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from leasekeeper.backends.mns import MNSBackend
from leasekeeper.testing.mns_server import MNSServer
from tests.services import MNS_ACCESS_ID as ACCESS_ID
from tests.services import MNS_ACCESS_KEY as ACCESS_KEY
from tests.services import sdk_queue

__all__ = ["ACCESS_ID", "ACCESS_KEY", "FakeClock", "sdk_queue"]


class FakeClock:
    """A leasekeeper Clock and an MNSServer clock at once, moved by hand.

    ``wait`` does not sleep (time moves only with ``advance``), so it is meant
    for backend-level tests, not for a running LeaseManager.
    """

    def __init__(self) -> None:
        self._now = 1000.0
        self._wall = 1_700_000_000.0
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._now

    def wall(self) -> float:
        with self._lock:
            return self._wall

    def wait(self, condition: threading.Condition, timeout: float) -> bool:
        return False

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds
            self._wall += seconds


@pytest.fixture
def make_queue(mns_server: MNSServer) -> Callable[..., tuple[str, Any]]:
    """``make_queue(visibility_timeout=30)`` -> (name, SDK Queue) of a fresh queue."""

    def make(visibility_timeout: int = 30) -> tuple[str, Any]:
        name = f"t-{uuid.uuid4().hex[:16]}"
        mns_server.create_queue(name, visibility_timeout=visibility_timeout)
        return name, sdk_queue(mns_server, name)

    return make


@pytest.fixture
def queue_name(make_queue: Callable[..., tuple[str, Any]]) -> str:
    name, _ = make_queue(30)
    return name


@pytest.fixture
def mns_queue(mns_server: MNSServer, queue_name: str) -> Any:
    """The user's SDK Queue (30 s VisibilityTimeout); also used to send messages."""
    return sdk_queue(mns_server, queue_name)


@pytest.fixture
def backend(mns_queue: Any) -> Iterator[MNSBackend]:
    with MNSBackend(mns_queue) as made:
        yield made


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def faked_server(fake_clock: FakeClock) -> Iterator[MNSServer]:
    with MNSServer(clock=fake_clock) as server:
        server.create_queue("faked", visibility_timeout=30)
        yield server


@pytest.fixture
def faked_queue(faked_server: MNSServer) -> Any:
    return sdk_queue(faked_server, "faked")


@pytest.fixture
def faked_backend(faked_queue: Any, fake_clock: FakeClock) -> Iterator[MNSBackend]:
    with MNSBackend(faked_queue, clock=fake_clock) as made:
        yield made
