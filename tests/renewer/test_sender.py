"""The worker's frames to its renewer process: several in one write, in order."""

from __future__ import annotations

import os
import socket
import threading
from multiprocessing.connection import Connection
from typing import Any

import pytest

from leasekeeper.renewers._bell import QUIET_FRAMES
from leasekeeper.renewers._frames import READ_SIZE, Batch, FrameReader, recv_frame, send_frame
from leasekeeper.renewers._sender import FrameSender


def pair() -> tuple[Connection, Connection]:
    ours, theirs = socket.socketpair()
    return Connection(ours.detach()), Connection(theirs.detach())


def bell() -> tuple[int, int]:
    """A bell's pipe as the link makes it: (the renewer's end, the worker's)."""
    theirs, ours = os.pipe()
    os.set_blocking(ours, False)
    os.set_blocking(theirs, False)
    return theirs, ours


def rings(bell_end: int) -> int:
    """How many times the bell rang since last asked."""
    try:
        return len(os.read(bell_end, 4096))
    except BlockingIOError:
        return 0


def read_all(conn: Connection, frames: int) -> tuple[list[Any], int]:
    """``frames`` frames as the renewer reads them, and how many writes carried them."""
    got: list[Any] = []
    writes = 0
    while len(got) < frames:
        frame = recv_frame(conn)
        writes += 1
        got += list(frame.frames) if isinstance(frame, Batch) else [frame]
    return got, writes


def test_a_frame_is_on_the_socket_when_send_returns() -> None:
    ours, theirs = pair()
    sender = FrameSender(ours, threading.Lock(), bell()[1])
    sender.send(("add", 1))
    assert theirs.poll(0)  # on the socket when send returns: nothing left for later
    sender.send(("complete", 1))
    got, _ = read_all(theirs, 2)
    assert got == [("add", 1), ("complete", 1)]


def test_the_frames_of_eight_threads_all_arrive_each_thread_s_in_order() -> None:
    ours, theirs = pair()
    sender = FrameSender(ours, threading.Lock(), bell()[1])
    per_thread = 300
    received: list[Any] = []
    reader = threading.Thread(
        target=lambda: received.extend(read_all(theirs, 8 * per_thread * 2)[0])
    )
    reader.start()

    def run(thread: int) -> None:
        for n in range(per_thread):
            sender.send((thread, n, "add"))
            sender.send((thread, n, "complete"))

    threads = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    reader.join(30)
    assert len(received) == 8 * per_thread * 2
    for t in range(8):
        mine = [frame[1:] for frame in received if frame[0] == t]
        assert mine == [(n, kind) for n in range(per_thread) for kind in ("add", "complete")]


def test_a_request_rings_the_bell_and_quiet_frames_ring_it_only_when_they_pile_up() -> None:
    ours, theirs = pair()
    heard, rung = bell()
    sender = FrameSender(ours, threading.Lock(), rung)
    sender.send(("complete", 1))  # urgent: a thread waits for its reply
    assert rings(heard) == 1
    for n in range(QUIET_FRAMES):
        sender.send(("drop", n), urgent=False)
    assert rings(heard) == 0  # on the socket (read later, together), no wake-up
    sender.send(("drop", "one more"), urgent=False)
    assert rings(heard) == 1  # the socket's buffer must not fill: read them now
    got, _ = read_all(theirs, QUIET_FRAMES + 2)
    assert got[0] == ("complete", 1) and got[-1] == ("drop", "one more")


def test_a_gone_renewer_is_an_os_error_for_the_sender() -> None:
    ours, theirs = pair()
    sender = FrameSender(ours, threading.Lock(), bell()[1])
    theirs.close()
    ours.close()
    with pytest.raises(OSError):
        sender.send(("complete", 1))


def test_the_reader_returns_every_frame_in_order_however_the_reads_split_them() -> None:
    ours, theirs = pair()
    reader = FrameReader(theirs)
    assert reader.read_waiting() == []  # nothing arrived: no wait
    big = ("progress", "x" * (3 * READ_SIZE))  # more than one read holds
    frames = [("add", n) for n in range(100)] + [big, ("complete", 1)]
    got: list[Any] = []

    def write() -> None:
        for frame in frames:
            send_frame(ours, frame)

    writer = threading.Thread(target=write)
    writer.start()
    while len(got) < len(frames):
        got += reader.read()
    writer.join()
    assert got == frames
    ours.close()
    with pytest.raises(EOFError):
        reader.read()
