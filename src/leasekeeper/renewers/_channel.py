"""``Channel``: one end of the socket between a worker and its renewer process.

It speaks ``multiprocessing.connection.Connection``'s wire format (a 4-byte
big-endian length, or -1 and an 8-byte one for 2 GiB or more, then the bytes),
with the few methods the renewers use. It exists because importing
``multiprocessing.connection`` pulls in the standard library's temporary-file,
subprocess and compression modules: a tenth or more of the renewer process's start-up
CPU, for a length prefix.
"""

from __future__ import annotations

import os
import select
import struct

_SHORT = struct.Struct("!i")
_LONG = struct.Struct("!Q")
_WHOLE = 1 << 14  # up to this size, the prefix and the bytes go in one write


class Channel:
    """One end of the renewer's socket, by file descriptor (owned: ``close`` closes it)."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        if self._fd < 0:
            raise OSError("the channel is closed")
        return self._fd

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether something can be read (data or end of file) within ``timeout`` s."""
        readable, _, _ = select.select([self.fileno()], [], [], timeout)
        return bool(readable)

    def send_bytes(self, data: bytes) -> None:
        size = len(data)
        long = size > 0x7FFFFFFF
        header = _SHORT.pack(-1) + _LONG.pack(size) if long else _SHORT.pack(size)
        if size <= _WHOLE:
            self._write_all(header + data)
        else:
            self._write_all(header)
            self._write_all(data)

    def recv_bytes(self) -> bytes:
        """The next message's bytes; EOFError when the other end is gone."""
        (size,) = _SHORT.unpack(self._read_exactly(4))
        if size == -1:
            (size,) = _LONG.unpack(self._read_exactly(8))
        return self._read_exactly(size)

    def _write_all(self, data: bytes) -> None:
        fd = self.fileno()
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]

    def _read_exactly(self, size: int) -> bytes:
        fd = self.fileno()
        parts: list[bytes] = []
        left = size
        while left:
            chunk = os.read(fd, left)
            if not chunk:
                raise EOFError
            parts.append(chunk)
            left -= len(chunk)
        return b"".join(parts)
