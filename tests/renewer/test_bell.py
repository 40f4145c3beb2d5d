"""The renewer's doorbell: it reads at once what the worker rings for, and the rest
a while later, together - never later than that, and never at all while idle."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from leasekeeper.renewers._bell import Doorbell, ring, rings_for

HOUR = 3600.0
SOON = 10.0  # how long a wake-up that should come may take on a loaded machine
A_WHILE = 0.3  # how long one that should not come is given to come all the same


class Waiter:
    """A thread waiting at the doorbell, once."""

    def __init__(self, doorbell: Doorbell) -> None:
        self._thread = threading.Thread(target=doorbell.wait, daemon=True)
        self._thread.start()

    def woke(self, within: float) -> bool:
        self._thread.join(within)
        return not self._thread.is_alive()


@pytest.fixture
def ends() -> Iterator[tuple[socket.socket, socket.socket, int, int]]:
    """The worker's socket, the renewer's, the bell's read end and its write end."""
    worker, renewer = socket.socketpair()
    heard, rung = os.pipe()
    os.set_blocking(rung, False)
    yield worker, renewer, heard, rung
    for end in (worker, renewer):
        end.close()
    for fd in (heard, rung):
        with contextlib.suppress(OSError):  # (unless the test closed it)
            os.close(fd)


def test_a_ring_wakes_the_renewer_at_once(
    ends: tuple[socket.socket, socket.socket, int, int],
) -> None:
    worker, renewer, heard, rung = ends
    waiter = Waiter(Doorbell(renewer.fileno(), heard, quiet_for=HOUR))
    assert not waiter.woke(A_WHILE)  # idle: it sleeps
    worker.sendall(b"a request")
    ring(rung)
    assert waiter.woke(SOON)


def test_frames_without_a_ring_wait_until_one_comes(
    ends: tuple[socket.socket, socket.socket, int, int],
) -> None:
    worker, renewer, heard, rung = ends
    waiter = Waiter(Doorbell(renewer.fileno(), heard, quiet_for=HOUR))
    worker.sendall(b"a drop")
    assert not waiter.woke(A_WHILE)  # read later, with what comes meanwhile
    ring(rung)
    assert waiter.woke(SOON)


def test_frames_without_a_ring_are_read_a_while_after_they_came(
    ends: tuple[socket.socket, socket.socket, int, int],
) -> None:
    worker, renewer, heard, _ = ends
    waiter = Waiter(Doorbell(renewer.fileno(), heard, quiet_for=0.05))
    worker.sendall(b"a drop")  # and the worker rings nothing more (stuck in C code)
    assert waiter.woke(SOON)


def test_the_worker_s_end_wakes_the_renewer_at_once(
    ends: tuple[socket.socket, socket.socket, int, int],
) -> None:
    worker, renewer, heard, _ = ends
    waiter = Waiter(Doorbell(renewer.fileno(), heard, quiet_for=HOUR))
    worker.sendall(b"its last drops")
    worker.close()  # the worker died: its quiet frames are read now, and the end seen
    assert waiter.woke(SOON)


def test_without_its_bell_every_frame_is_read_as_it_comes(
    ends: tuple[socket.socket, socket.socket, int, int],
) -> None:
    worker, renewer, heard, rung = ends
    doorbell = Doorbell(renewer.fileno(), heard, quiet_for=HOUR)
    os.close(rung)  # (a worker that closed its side of the pipe only)
    assert Waiter(doorbell).woke(SOON)  # the pipe's end is heard
    waiter = Waiter(doorbell)
    assert not waiter.woke(A_WHILE)  # and then it does not wake for nothing
    worker.sendall(b"a drop")
    assert waiter.woke(SOON)


def test_a_register_rings_when_its_lease_is_held_back_only_a_little_or_not_at_all() -> None:
    now = 100.0
    assert not rings_for(now + 30.0, now)  # held back for 30 s: it can wait
    assert rings_for(now + 0.1, now)  # adopted in a moment: read it now
    assert rings_for(float("-inf"), now)  # not held back: renewed as soon as read
