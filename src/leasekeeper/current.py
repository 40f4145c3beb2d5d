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

import contextvars

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


class handling:  # a context manager named for its use: ``with handling(lease):``
    """``with handling(lease):`` - ``current_lease()`` is ``lease`` inside.

    A class, not a ``contextlib.contextmanager``: a worker enters one per message,
    and a generator's frame costs several times more."""

    __slots__ = ("_lease", "_token")

    def __init__(self, lease: Lease) -> None:
        self._lease = lease

    def __enter__(self) -> Lease:
        self._token = _CURRENT.set(self._lease)
        return self._lease

    def __exit__(self, *exc_info: object) -> None:
        _CURRENT.reset(self._token)
