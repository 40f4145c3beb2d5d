"""What the worker and its renewer process say to each other, over one socket.

Frames are length-prefixed pickles (``send_frame``/``recv_frame`` over a
``multiprocessing.connection.Connection``) of plain tuples, tagged by their first
element:

worker -> renewer
    ("add", key, message_id, receipt, received_at, visibility_timeout,
     deadline_hint, hard_deadline, receive_count, watch)   start renewing; no reply
    ("complete", request, keys)                             reply: results per key
    ("release", request, keys, delay, stop_handler)         reply: results per key
    ("abandon", key, reason)                                no reply
    ("progress", [(key, at), ...])                          the handlers' latest
                                                            progress (stall_timeout),
                                                            coalesced; no reply
    ("forget", request, key)                                reply once no extend is out
    ("stats", request)                                      reply: Stats
    ("observe", on)                                         forward observer events
    ("close", request, release, timeout)                    reply: the final Stats, then
                                                            it exits

renewer -> worker (its sender thread batches them: ("batch", [frame, ...]))
    ("started", pid)                                        once: it runs (its backend
                                                            is built next, while the
                                                            worker goes on)
    ("serving",) / ("failed", text)                         once: it renews now / its
                                                            backend could not be built
                                                            (then it exits)
    ("done", request, payload)                              a request's reply
    ("extended", key, receipt, visible_until, extensions)
    ("rolling", key)                                        the handler is to roll over
    ("ended", key, state, lost_reason, detail, stop_handler)  lost, abandoned,
                                                            released, forgotten
    ("event", callback, args)                               an observer callback

Keys are the worker's lease ids (ints), never message ids: a message received
again is a new lease. Receipts cross the socket (both ends are the same user's
processes) but are never logged. Times are ``time.monotonic()`` values, which
both processes share on one machine. Exceptions cross as (type name, args) and
are rebuilt on the worker's side by ``decode_error``.
"""

from __future__ import annotations

import pickle
from multiprocessing.connection import Connection
from typing import Any

from leasekeeper.errors import BackendError, ConfigError, LeaseError, LeaseLost, ManagerClosed

_PROTOCOL = pickle.HIGHEST_PROTOCOL


def send_frame(conn: Connection, frame: tuple[Any, ...]) -> None:
    """Send one frame. (``Connection.send`` pickles through multiprocessing's
    ForkingPickler, a new Pickler per call: several times the cost, per frame.)"""
    conn.send_bytes(pickle.dumps(frame, _PROTOCOL))


def recv_frame(conn: Connection) -> Any:
    """Receive one frame (EOFError when the other end is gone)."""
    return pickle.loads(conn.recv_bytes())


def progress_interval(stall_timeout: float) -> float:
    """How often at most a lease's progress is sent to the renewer: a tenth of
    ``stall_timeout``, at most a second (``process_renewer.ProgressRelay``)."""
    return min(1.0, stall_timeout / 10.0)


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
