"""``await aio.receive(manager)``: messages leased the instant they arrive, for coroutines.

The asyncio form of ``manager.receive()``: the receive runs off the event loop, and
every message it returns is registered with the manager before the coroutine sees
it, so a message waiting its turn in the list is renewed meanwhile. Receiving a
batch from the backend and leasing each message only when its turn comes (``async
with aio.lease(message)`` after the one before it finished) lets the later ones
burn their invisibility while they wait: under load the second of two was refused
with ``LeaseTooShort`` because it had run out.
"""

from __future__ import annotations

import asyncio

from leasekeeper.aio.held import AsyncLeaseScope
from leasekeeper.aio.lost import relay_for
from leasekeeper.lease import Lease
from leasekeeper.manager import LeaseManager

__all__ = ["receive"]


async def receive(
    manager: LeaseManager,
    max_messages: int = 1,
    wait_seconds: float = 0.0,
    *,
    release_delay: float | None = None,
    cancel_on_lost: bool = False,
) -> list[AsyncLeaseScope]:
    """Receive up to ``max_messages`` messages from ``manager``'s backend (waiting up
    to ``wait_seconds`` for the first, on a thread: the loop goes on), each leased
    from the instant it arrived. Returns one scope per message: ``async with scope
    as held:`` deletes it on success and releases it on an exception, as
    ``aio.lease()`` does. A message whose scope is never entered stays renewed until
    the manager closes (then it is released).

    If the awaiting task is cancelled while the receive runs, what it still brings
    is released at once, not left renewed for nobody.
    """
    relay_for(manager)  # before anything is registered: the relay hears of every ending
    loop = asyncio.get_running_loop()
    received = loop.run_in_executor(None, manager.receive, max_messages, wait_seconds)
    try:
        leases = await asyncio.shield(received)
    except asyncio.CancelledError:
        received.add_done_callback(lambda done: _release_all(manager, done))
        raise
    return [
        AsyncLeaseScope(manager, lease.message, release_delay, cancel_on_lost) for lease in leases
    ]


def _release_all(manager: LeaseManager, done: asyncio.Future[list[Lease]]) -> None:
    if done.cancelled() or done.exception() is not None:
        return
    for lease in done.result():
        manager.release_soon(lease, 0)  # through the coalescer: the loop does not wait
