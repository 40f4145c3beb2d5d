"""What the worker and its renewer process say to each other, over one socket.

Each frame is a small ``NamedTuple`` of its own, defined here and nowhere else: a
new frame is added in this file (and a handler in each side's dispatch table), and
a frame built without a field is a type error, not an ``IndexError`` at the other
end. Frames cross as length-prefixed pickles of (type number, fields)
(``to_wire``; ``send_frame``/``recv_frame`` over a ``renewers._channel.Channel``);
a ``Batch`` carries several in one write, and a ``FrameReader`` takes every frame
that has arrived in one read.

worker -> renewer: ``Hello`` (first, before anything else), ``Add``, ``Adds``,
``Adopt`` and ``Drop`` (no reply),
``Complete``, ``Release``, ``Forget``, ``AskStats`` and ``Close`` (each answered by
a ``Done`` with its ``request``), ``Abandon``, ``Progress``, ``Observe`` (no reply).

renewer -> worker: ``Started`` then ``Serving`` or ``Failed`` (once each), ``Done``,
``Extended``, ``Rolling``, ``Ended``, ``Event``; its sender batches them (``Batch``),
as the worker's sender batches its frames (``renewers._sender``).

Keys are the worker's lease ids (ints), never message ids: a message received
again is a new lease. Receipts cross the socket (both ends are the same user's
processes) but are never logged. Times are ``time.monotonic()`` values, which
both processes share on one machine. Exceptions cross as (type name, args) and
are rebuilt on the worker's side by ``decode_error``.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

from leasekeeper.errors import BackendError, ConfigError, LeaseError, LeaseLost, ManagerClosed
from leasekeeper.renewers._channel import Channel

_PROTOCOL = pickle.HIGHEST_PROTOCOL

# ---------------------------------------------------------------------- worker -> renewer


class Hello(NamedTuple):
    """The first frame: where to import from, who to watch, what to build."""

    path: list[str]
    parent: int
    payload: bytes  # the pickled (spec, config)


class Add(NamedTuple):
    """Start renewing a lease (no reply: the worker knows its deadline)."""

    key: int
    message_id: str
    receipt: str
    received_at: float
    visibility_timeout: float
    deadline_hint: float | None
    hard_deadline: float | None
    receive_count: int
    watch: bool
    queue: int = 0  # which of a multi-queue worker's queues (their order at start)
    # The worker may delete it itself if its job ends while it is held (``Drop``):
    # then it is held even when it arrives late, until what the worker wrote before
    # its time to be adopted has been read.
    own: bool = False


class Adds(NamedTuple):
    """Several ``Add``s (a receive's registers), each as the plain tuple of its
    fields: cheaper to read than a NamedTuple each, and one the renewer finds
    dropped in the same read it never needs to build."""

    entries: list[tuple[Any, ...]]


class Adopted(NamedTuple):
    """Not a frame: one lease of an ``Adopt``, as the worker knows it now. ``add``: an
    ``Add``'s fields, its receipt the newest the worker was told of and ``own`` true
    while the worker may still delete its message itself (it was never renewed);
    then its deadline now, when it was registered, its extensions, and its handler's
    latest progress (None: none reported)."""

    add: tuple[Any, ...]
    visible_until: float
    registered_at: float
    extensions: int
    progressed_at: float | None


class Adopt(NamedTuple):
    """Renew these leases, which a renewer process that died held (no reply): the
    first frame a renewer started in its place reads. Each entry is an ``Adopted``
    as a plain tuple."""

    leases: list[tuple[Any, ...]]


class Drop(NamedTuple):
    """The worker deletes these held leases' messages itself (no reply). Sent only
    while, by the worker's clock, the renewer cannot have adopted them yet (it reads
    what came before it adopts): they are never renewed. One that was adopted all
    the same, or was not held, is left as it is: a ``Complete`` for it follows."""

    keys: list[int]


class Complete(NamedTuple):
    """Delete these leases' messages. Reply: per key (encoded error, extensions).
    ``adds``: the fields (as ``Add``'s) of those among them the worker dropped
    (``Drop``): the renewer may have let go of them, and holds them anew first."""

    request: int
    keys: list[int]
    adds: Sequence[tuple[Any, ...]] = ()


class Release(NamedTuple):
    """Release these leases. Reply: per key, an encoded error or None."""

    request: int
    keys: list[int]
    delay: float | None
    stop_handler: bool


class Forget(NamedTuple):
    """Stop renewing one lease. Reply (None) once no extend of it is out."""

    request: int
    key: int


class Abandon(NamedTuple):
    """Stop renewing one lease whose delete keeps failing (no reply)."""

    key: int
    reason: str


class Progress(NamedTuple):
    """The handlers' latest progress (``stall_timeout``), coalesced (no reply)."""

    entries: list[tuple[int, float]]  # (key, at)


class AskStats(NamedTuple):
    """Reply: the renewer's ``Stats``."""

    request: int


class Observe(NamedTuple):
    """Forward observer events (the worker has observers) or stop."""

    on: bool


class Close(NamedTuple):
    """Close (releasing what is active when ``release``). Reply: the final Stats."""

    request: int
    release: bool
    timeout: float | None


# ---------------------------------------------------------------------- renewer -> worker


class Started(NamedTuple):
    """It runs; its backend is built next (the worker waits for Serving or Failed)."""

    pid: int


class Serving(NamedTuple):
    """It built its backend and renews."""


class Failed(NamedTuple):
    """It could not start or build its backend (then it exits)."""

    reason: str


class Done(NamedTuple):
    """A request's reply."""

    request: int
    payload: Any


class Extended(NamedTuple):
    key: int
    receipt: str
    visible_until: float
    extensions: int


class Rolling(NamedTuple):
    """The handler is to roll over."""

    key: int


class Ended(NamedTuple):
    """A lease ended there: lost, abandoned, released or forgotten."""

    key: int
    state: str
    lost_reason: str | None
    detail: str
    stop_handler: bool


class Event(NamedTuple):
    """An observer callback: ``on_call`` with a call's figures, else (key, value)."""

    callback: str
    args: tuple[Any, ...]


class Batch(NamedTuple):
    """Several frames in one write."""

    frames: Sequence[tuple[Any, ...]]


# ---------------------------------------------------------------------- the socket


# On the wire a frame is (its type's number, its fields as a plain tuple): a
# NamedTuple pickles by reference to its class (a lookup of the module and the
# name when pickled, an import lookup and a Python-level ``__new__`` when read),
# several times the cost of the plain tuple it is. Measured for a register's
# ``Adds`` of one: 4.7 us to pickle as a NamedTuple, 1.0 us as (number, fields).
# Both ends run the same code (the renewer imports from the worker's path), so
# the numbers are the position in this list; a new frame is appended to it.
_WIRE_TYPES: tuple[type[tuple[Any, ...]], ...] = (
    Hello,
    Add,
    Adds,
    Drop,
    Complete,
    Release,
    Forget,
    Abandon,
    Progress,
    AskStats,
    Observe,
    Close,
    Started,
    Serving,
    Failed,
    Done,
    Extended,
    Rolling,
    Ended,
    Event,
    Batch,
    Adopt,
    Adopted,  # (an entry of an Adopt, which carries them as plain tuples)
)
_WIRE_NUMBER = {kind: number for number, kind in enumerate(_WIRE_TYPES)}
_BATCH = _WIRE_NUMBER[Batch]
_WHOLE = -1  # anything else is pickled whole


def to_wire(frame: tuple[Any, ...]) -> tuple[int, Any]:
    """``frame`` as it crosses: (its type's number, its fields), or ``_WHOLE`` and
    the object itself for what is no frame of this module."""
    number = _WIRE_NUMBER.get(type(frame), _WHOLE)
    if number == _BATCH:
        return number, [to_wire(each) for each in frame[0]]
    return (number, tuple(frame)) if number != _WHOLE else (number, frame)


def from_wire(wire: tuple[int, Any]) -> Any:
    """The frame ``to_wire`` gave ``wire`` for."""
    number, fields = wire
    if number == _WHOLE:
        return fields
    if number == _BATCH:
        return Batch([from_wire(each) for each in fields])
    # tuple.__new__ builds the NamedTuple from its fields without its Python-level
    # __new__ (the fields are a whole frame's: to_wire took them from one).
    return tuple.__new__(_WIRE_TYPES[number], fields)


def send_frame(conn: Channel, frame: tuple[Any, ...]) -> None:
    """Send one frame. (``Connection.send`` pickles through multiprocessing's
    ForkingPickler, a new Pickler per call: several times the cost, per frame.)"""
    conn.send_bytes(pickle.dumps(to_wire(frame), _PROTOCOL))


def recv_frame(conn: Channel) -> Any:
    """Receive one frame (EOFError when the other end is gone)."""
    return from_wire(pickle.loads(conn.recv_bytes()))


_SHORT = struct.Struct("!i")  # multiprocessing.connection's length prefix
_LONG = struct.Struct("!Q")  # ... after a -1, for a frame of 2 GiB or more
READ_SIZE = 1 << 18  # bytes asked of the socket per read


def encode_frame(frame: tuple[Any, ...]) -> bytes:
    """``frame`` as ``send_frame`` writes it: its length, then its pickle. Frames encoded
    are read as ``send_frame``'s are (``renewers._sender`` writes them)."""
    data = pickle.dumps(to_wire(frame), _PROTOCOL)
    size = len(data)
    if size > 0x7FFFFFFF:
        return _SHORT.pack(-1) + _LONG.pack(size) + data
    return _SHORT.pack(size) + data


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a blocking socket); OSError when it is gone."""
    written = os.write(fd, data)
    if written < len(data):
        with memoryview(data) as view:
            while written < len(data):
                written += os.write(fd, view[written:])


class FrameReader:
    """Reads the frames ``send_frame`` wrote, as many at once as have arrived: one
    read of up to ``READ_SIZE`` bytes, split into frames here, where
    ``recv_frame`` makes two reads per frame and a ``poll`` (a new selector each
    time) to learn whether another is waiting. Same wire format, so a connection
    may be read by ``recv_frame`` first (the start-up handshake) and by this after.
    One reader per connection, used by one thread at a time."""

    def __init__(self, conn: Channel) -> None:
        self._fd = conn.fileno()
        self._buffer = bytearray()
        # Read into this one buffer: ``os.read`` would allocate READ_SIZE bytes a read
        # (above malloc's mmap threshold: an mmap, a page fault and a munmap each).
        self._chunk = bytearray(READ_SIZE)
        self._chunk_view = memoryview(self._chunk)

    def read(self) -> list[Any]:
        """The frames that have arrived, at least one (waits for it); EOFError when
        the other end is gone."""
        while True:
            frames = self._split()
            if frames:
                return frames
            self._fill()

    def read_waiting(self) -> list[Any]:
        """The frames that have arrived, without waiting (none: an empty list)."""
        while True:
            frames = self._split()
            if frames or not select.select([self._fd], [], [], 0)[0]:
                return frames
            self._fill()

    def _fill(self) -> None:
        size = os.readv(self._fd, (self._chunk,))
        if not size:
            raise EOFError
        self._buffer += self._chunk_view[:size]

    def _split(self) -> list[Any]:
        """The whole frames at the front of the buffer, unpickled; the rest kept."""
        buffer = self._buffer
        frames: list[Any] = []
        at, end = 0, len(buffer)
        with memoryview(buffer) as view:
            while end - at >= 4:
                (size,) = _SHORT.unpack_from(view, at)
                start = at + 4
                if size == -1:
                    if end - start < 8:
                        break
                    (size,) = _LONG.unpack_from(view, start)
                    start += 8
                if end - start < size:
                    break
                frames.append(from_wire(pickle.loads(view[start : start + size])))
                at = start + size
        if at:
            del buffer[:at]
        return frames


def progress_interval(stall_timeout: float) -> float:
    """How often at most a lease's progress is sent to the renewer: a tenth of
    ``stall_timeout``, at most a second (``renewers.process.ProgressRelay``)."""
    return min(1.0, stall_timeout / 10.0)


# ---------------------------------------------------------------------- errors

# A request's per-lease result: None, or an encoded exception.
Encoded = tuple[str, tuple[Any, ...]] | None


def encode_error(exc: BaseException | None) -> Encoded:
    """``exc`` as a picklable (type name, args); None stays None."""
    if exc is None:
        return None
    if isinstance(exc, LeaseLost):
        return ("LeaseLost", (exc.message_id, exc.reason, exc.lost_reason))
    if isinstance(exc, BackendError):
        return ("BackendError", (exc.operation, exc.message_id, exc.kind, exc.detail))
    for kind in (ManagerClosed, ConfigError, LeaseError, ValueError):
        if isinstance(exc, kind):
            return (kind.__name__, (str(exc),))
    return ("LeaseError", (f"{type(exc).__name__} in the renewer process",))


_ERRORS: dict[str, type[Exception]] = {
    "LeaseLost": LeaseLost,
    "BackendError": BackendError,
    "ManagerClosed": ManagerClosed,
    "ConfigError": ConfigError,
    "LeaseError": LeaseError,
    "ValueError": ValueError,
}


def decode_error(encoded: Encoded) -> Exception | None:
    """The exception ``encode_error`` described, rebuilt; None stays None."""
    if encoded is None:
        return None
    name, args = encoded
    return _ERRORS.get(name, LeaseError)(*args)
