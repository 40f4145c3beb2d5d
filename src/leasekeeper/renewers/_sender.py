"""Frames to the renewer process: one write each, under one lock, in order.

A thread that sends encodes its frame (``encode_frame``, before it takes the lock),
then writes it to the socket's descriptor (``write_all``, not through
``Channel.send_bytes``' copy of each frame) holding the lock, so frames never
interleave and each thread's keep their order.

Every frame is on the socket when its ``send`` returns - a register must reach the
renewer even if this process then holds the GIL for minutes or is killed (a writer
thread that woke to send what was posted batched a receive's registers into one
write, but a handler holding the GIL kept it from sending them and their leases
lapsed, and a killed worker's last registers never reached its renewer to be
released).

Why not group commit (a thread whose frame arrives during another's write appends
it and waits for that writer to write it with its own): measured with 8 handler
threads registering and completing, its condition waits and wake-ups cost the
worker four times the CPU of a write each, and saved the renewer nothing - it reads
every frame that has arrived in one read either way (``_frames.FrameReader``).

After a frame that cannot wait, it rings the renewer's bell (``_bell``); the
others wait there to be read together, a while at most.

When the write fails (the renewer is gone) ``send`` raises OSError: the renewer's
death is noticed by the link's reader, which answers every pending request and
reports the leases it held lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from leasekeeper.renewers._bell import QUIET_FRAMES, ring
from leasekeeper.renewers._channel import Channel
from leasekeeper.renewers._frames import encode_frame, write_all


class FrameSender:
    """One frame, one write, under ``lock`` (see the module docstring); ``bell``: the
    write end of the renewer's bell pipe."""

    def __init__(self, conn: Channel, lock: threading.Lock, bell: int) -> None:
        self._fd = conn.fileno()
        self._bell = bell
        self._lock = lock  # guards the socket's writes, _unrung and _closed
        self._unrung = 0  # frames written since the last ring
        self._closed = False  # no more writes: the socket is closed

    def send(self, frame: tuple[Any, ...], *, urgent: bool = True) -> None:
        """Write ``frame``; return once it is on the socket, and the renewer's bell
        rung if it is ``urgent`` (or the quiet ones piled up: ``_bell``). OSError
        when the socket is gone."""
        data = encode_frame(frame)
        with self._lock:
            if self._closed:
                raise OSError("the renewer's socket is closed")
            write_all(self._fd, data)
            if urgent or self._unrung >= QUIET_FRAMES:
                ring(self._bell)
                self._unrung = 0
            else:
                self._unrung += 1

    def close(self, closer: Callable[[], None]) -> None:
        """Write no more; ``closer`` (which closes the socket) runs once no write is
        under way: a descriptor is never closed under a write (its number could be
        another file's by then). Called once the renewer is gone, when a write under
        way fails at once."""
        with self._lock:
            self._closed = True
            closer()
