"""Frames to the renewer process, written together: several threads' frames in one write.

A thread that sends appends its frame to a buffer; if no other thread is writing,
it writes the buffer itself (one ``Batch`` frame when it holds several) and goes
on writing what others appended meanwhile, until the buffer is empty. So a frame
costs one write when frames come one at a time, and the frames of threads that
send while a write is under way (handlers registering and completing at once)
ride together on the next.

Every frame is on the socket when its ``send`` returns: a thread whose frame rides
on another's write waits for that write (group commit), never leaving it for
later - a register must reach the renewer even if this process then holds the GIL
for minutes or is killed. (A writer thread that woke to send what was posted
batched a receive's registers into one write, but a handler holding the GIL kept
it from sending them and their leases lapsed, and a killed worker's last
registers never reached its renewer to be released.)

Frames keep their order (one writer at a time, the buffer in order). When the write
fails (the renewer is gone) the writer raises OSError and the frames it held are
dropped: the renewer's death is noticed by the link's reader, which answers every
pending request and reports the leases it held lost.
"""

from __future__ import annotations

import threading
from multiprocessing.connection import Connection
from typing import Any

from leasekeeper.renewers._frames import Batch, send_frame


class FrameSender:
    """Whoever finds no write under way writes the buffer (see the module docstring);
    ``lock`` also guards the link's pending replies."""

    def __init__(self, conn: Connection, lock: threading.Lock) -> None:
        self._conn = conn
        self._lock = lock  # guards everything below
        self._written_cond = threading.Condition(lock)  # a write is done (or failed)
        self._buffer: list[tuple[Any, ...]] = []
        self._writing = False  # a thread is writing: it writes what is queued, too
        self._queued = 0  # frames queued so far (a frame's number: the count then)
        self._written = 0  # frames numbered up to this are on the socket
        self._dropped = 0  # frames numbered up to this were dropped by a failed write
        self._waiting = 0  # threads waiting for another's write

    def send(self, frame: tuple[Any, ...]) -> None:
        """Write ``frame`` with what is queued before it, or wait while the thread
        writing now writes it; return once it is on the socket. OSError when the
        socket is gone."""
        with self._lock:
            self._buffer.append(frame)
            self._queued += 1
            mine = self._queued
            if self._writing:
                self._waiting += 1
                try:
                    while self._written < mine and self._dropped < mine:
                        self._written_cond.wait()
                finally:
                    self._waiting -= 1
                if self._written < mine:
                    raise OSError("the renewer's socket is gone")
                return
            self._writing = True
        self._write_all()

    def _write_all(self) -> None:
        """Write what is queued until nothing is (this thread holds ``_writing``)."""
        try:
            while True:
                with self._lock:
                    frames = self._buffer
                    if not frames:
                        self._writing = False
                        return
                    self._buffer = []
                    upto = self._queued
                send_frame(self._conn, frames[0] if len(frames) == 1 else Batch(frames))
                with self._lock:
                    self._written = upto
                    if self._waiting:
                        self._written_cond.notify_all()
        except BaseException:
            with self._lock:
                self._buffer = []
                self._dropped = self._queued
                self._writing = False
                self._written_cond.notify_all()
            raise
