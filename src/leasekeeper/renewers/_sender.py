"""Frames to the renewer process, written together: several threads' frames in one write.

A thread that sends encodes its frame (``encode_frame``, before it takes the lock)
and appends the bytes to a buffer; if no other thread is writing, it writes the
buffer itself (the frames' bytes joined: one write) and goes on writing what others
appended meanwhile, until the buffer is empty. So a frame costs one write when
frames come one at a time, and the frames of threads that send while a write is
under way (handlers registering and completing at once) ride together on the next.
The writes go to the socket's descriptor (``write_all``), not through
``Channel.send_bytes``' copy of each frame; the renewer reads
them as it reads ``send_frame``'s.

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
from collections.abc import Callable
from typing import Any

from leasekeeper.renewers._channel import Channel
from leasekeeper.renewers._frames import encode_frame, write_all


class FrameSender:
    """Whoever finds no write under way writes the buffer (see the module docstring);
    ``lock`` guards its buffer (a lock of its own)."""

    def __init__(self, conn: Channel, lock: threading.Lock) -> None:
        self._fd = conn.fileno()
        self._lock = lock  # guards everything below
        self._written_cond = threading.Condition(lock)  # a write is done (or failed)
        self._buffer: list[bytes] = []  # encoded frames, queued behind the write under way
        self._writing = False  # a thread is writing: it writes what is queued, too
        self._queued = 0  # frames queued so far (a frame's number: the count then)
        self._written = 0  # frames numbered up to this are on the socket
        self._dropped = 0  # frames numbered up to this were dropped by a failed write
        self._waiting = 0  # threads waiting for another's write
        self._closed = False  # no more writes: the socket is closed, or is to be
        self._closer: Callable[[], None] | None = None  # closes it once a write ends

    def send(self, frame: tuple[Any, ...]) -> None:
        """Write ``frame`` with what is queued before it, or wait while the thread
        writing now writes it; return once it is on the socket. OSError when the
        socket is gone."""
        data = encode_frame(frame)
        with self._lock:
            if self._closed:
                raise OSError("the renewer's socket is closed")
            self._queued += 1
            mine = self._queued
            if self._writing:
                self._buffer.append(data)
                self._waiting += 1
                try:
                    while self._written < mine and self._dropped < mine:
                        self._written_cond.wait()
                finally:
                    self._waiting -= 1
                if self._written < mine:
                    raise OSError("the renewer's socket is gone")
                return
            self._writing = True  # (nothing is queued while nobody writes)
        self._write_all(data, mine)

    def close(self, closer: Callable[[], None]) -> None:
        """Write no more; ``closer`` (which closes the socket) runs now, or once the
        write under way ends: a descriptor is never closed under a write (its number
        could be another file's by then)."""
        with self._lock:
            self._closed = True
            if self._writing:
                self._closer = closer
                return
        closer()

    def _write_all(self, data: bytes, upto: int) -> None:
        """Write ``data`` (frames numbered up to ``upto``), then what was queued
        meanwhile, until nothing is (this thread holds ``_writing``)."""
        closer = None
        try:
            while True:
                write_all(self._fd, data)
                with self._lock:
                    self._written = upto
                    if self._closed:  # what is queued is dropped
                        self._dropped = self._queued
                        self._buffer = []
                        closer, self._closer = self._closer, None
                    if self._waiting:
                        self._written_cond.notify_all()
                    if not self._buffer:
                        self._writing = False
                        return
                    frames, self._buffer = self._buffer, []
                    upto = self._queued
                data = b"".join(frames)
        except BaseException:
            with self._lock:
                self._buffer = []
                self._dropped = self._queued
                self._writing = False
                self._written_cond.notify_all()
                closer, self._closer = self._closer, None
            raise
        finally:
            if closer is not None:
                closer()
