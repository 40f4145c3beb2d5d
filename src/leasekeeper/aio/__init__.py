"""leasekeeper for asyncio: leases held by coroutines, and a worker on an event loop.

::

    from leasekeeper import aio

    for scope in await aio.receive(manager, max_messages=10, wait_seconds=5):
        async with scope as held:               # each leased the instant it arrived
            await work(held.message)

    async with aio.lease(message) as held:      # the default manager of its backend
        await work(message)                     # renewed meanwhile, off the loop
        held.check()                            # LeaseLost if another worker may have it
    # success: deleted.  exception: released.  lost: LeaseLost, nothing deleted.

    @aio.leased                                 # or @aio.leased(manager=m, release_delay=30)
    async def handle(message): ...

    await aio.AsyncWorker(backend, handle, concurrency=16, visibility_timeout=60).run()

Renewals never run on the event loop: the manager's scheduler thread (or its
renewer process) does them, so a coroutine that blocks the loop does not stop
them. Deletes and releases go through the manager's coalescer and receives run on
a thread, so the loop never waits on the service. ``await held.lost.wait()``
returns when the lease is lost; ``cancel_on_lost=True`` cancels the handler then.
See docs/guide.md, "asyncio".
"""

from leasekeeper.aio.decorator import leased
from leasekeeper.aio.held import AsyncLease, AsyncLeaseScope, LostEvent, current_lease, lease
from leasekeeper.aio.receive import receive
from leasekeeper.aio.worker import AsyncWorker

__all__ = [
    "AsyncLease",
    "AsyncLeaseScope",
    "AsyncWorker",
    "LostEvent",
    "current_lease",
    "lease",
    "leased",
    "receive",
]
