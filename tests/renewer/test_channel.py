"""The renewer's socket end (``renewers._channel.Channel``) speaks the wire format of
``multiprocessing.connection.Connection``: each reads what the other wrote."""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

import pytest

from leasekeeper.renewers import _frames as frames_module
from leasekeeper.renewers._channel import Channel
from leasekeeper.renewers._frames import (
    Add,
    Batch,
    Done,
    FrameReader,
    Rolling,
    recv_frame,
    send_frame,
)


@pytest.fixture
def pair() -> Iterator[tuple[Channel, Connection]]:
    ours, theirs = socket.socketpair()
    channel, connection = Channel(ours.detach()), Connection(theirs.detach())
    yield channel, connection
    channel.close()
    connection.close()


@pytest.mark.parametrize("size", [0, 1, 16_384, 16_385, 300_000])
def test_each_reads_what_the_other_wrote(pair: tuple[Channel, Connection], size: int) -> None:
    channel, connection = pair
    data = os.urandom(size)
    with ThreadPoolExecutor(1) as pool:  # a big one fills the socket: read as it is sent
        got = pool.submit(connection.recv_bytes)
        channel.send_bytes(data)
        assert got.result(timeout=30) == data
        back = pool.submit(channel.recv_bytes)
        connection.send_bytes(data[::-1])
        assert back.result(timeout=30) == data[::-1]


def test_frames_cross_and_a_reader_takes_several_at_once(
    pair: tuple[Channel, Connection],
) -> None:
    channel, connection = pair
    frames = [Add(key, f"m{key}", "r", 1.0, 30.0, None, None, 1, False, 0) for key in range(3)]
    for frame in frames:
        send_frame(connection, frame)  # type: ignore[arg-type]
    assert FrameReader(channel).read() == frames
    send_frame(channel, frames[0])
    assert recv_frame(connection) == frames[0]  # type: ignore[arg-type]


def test_poll_and_end_of_file(pair: tuple[Channel, Connection]) -> None:
    channel, connection = pair
    assert not channel.poll(0)
    connection.send_bytes(b"x")
    assert channel.poll(1.0)
    assert channel.recv_bytes() == b"x"
    connection.close()
    assert channel.poll(1.0)  # end of file is readable
    with pytest.raises(EOFError):
        channel.recv_bytes()


def test_a_closed_channel_refuses_and_closes_once(pair: tuple[Channel, Connection]) -> None:
    channel, _ = pair
    channel.close()
    channel.close()
    assert channel.closed
    with pytest.raises(OSError):
        channel.send_bytes(b"x")


def _frame_classes() -> list[type[tuple[Any, ...]]]:
    """Every frame of ``renewers._frames``: its NamedTuple classes."""
    return [
        kind
        for kind in vars(frames_module).values()
        if isinstance(kind, type)
        and issubclass(kind, tuple)
        and kind.__module__ == frames_module.__name__
    ]


@pytest.mark.parametrize("kind", _frame_classes(), ids=lambda kind: kind.__name__)
def test_every_frame_crosses_as_its_own_class_by_number(
    pair: tuple[Channel, Connection], kind: type[tuple[Any, ...]]
) -> None:
    """A frame crosses as (its number, its fields) - a few times cheaper to pickle and
    read than the NamedTuple - and is its own class again at the other end."""
    fields = [f"{name}-value" for name in kind._fields]  # type: ignore[attr-defined]
    frame = Batch([Done(1, None), Rolling(7)]) if kind is Batch else kind(*fields)
    wire = frames_module.to_wire(frame)
    assert wire[0] >= 0, "a frame class missing from _WIRE_TYPES"
    assert kind.__name__.encode() not in pickle.dumps(wire)
    channel, connection = pair
    send_frame(connection, frame)  # type: ignore[arg-type]
    (got,) = FrameReader(channel).read()
    assert type(got) is kind and got == frame
    if kind is Batch:
        assert [type(each) for each in got[0]] == [Done, Rolling]


def test_what_is_no_frame_crosses_whole(pair: tuple[Channel, Connection]) -> None:
    channel, connection = pair
    send_frame(connection, ("not", "a", "frame"))  # type: ignore[arg-type]
    assert FrameReader(channel).read() == [("not", "a", "frame")]
