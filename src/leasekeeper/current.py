"""``current_lease()``: the lease of the message the calling handler runs for.

``Worker``, ``AsyncWorker`` and ``leasekeeper worker`` call a handler with the
message alone; the handler reaches its lease through this context variable, set
around each handler call (a thread's handler, or an ``async def`` handler's task):

    def handle(message):
        held = leasekeeper.current_lease()
        for step in steps(held.resumed):
            do(step)
            held.checkpoint(step)        # progress, and where a rollover resumes

``worker.manager.get(message)`` keeps working too. (``leasekeeper.aio.current_lease()``
is the async form: the ``AsyncLease`` of an ``async with`` or ``AsyncWorker``.)
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from leasekeeper.lease import Lease

__all__ = ["current_lease", "handling"]

_CURRENT: contextvars.ContextVar[Lease | None] = contextvars.ContextVar(
    "leasekeeper_current_handler_lease", default=None
)


def current_lease() -> Lease:
    """The lease of the message the calling handler runs for (set by ``Worker``,
    ``AsyncWorker`` and ``leasekeeper worker``). ``LookupError`` elsewhere."""
    lease = _CURRENT.get()
    if lease is None:
        raise LookupError("no leasekeeper worker is running a handler here: no current lease")
    return lease


@contextlib.contextmanager
def handling(lease: Lease) -> Iterator[Lease]:
    """``with handling(lease):`` - ``current_lease()`` is ``lease`` inside."""
    token = _CURRENT.set(lease)
    try:
        yield lease
    finally:
        _CURRENT.reset(token)
