"""An asyncio worker on the built-in in-memory queue: no cloud account needed.

    .venv/bin/python examples/async_worker.py

Twenty jobs, each taking twice the (2 s) visibility timeout, run as twenty
coroutines on one event loop while leasekeeper keeps them invisible from its own
thread. One of them blocks the loop for a second - a blocking call a coroutine
should not make, but sometimes does - and the renewals go on regardless. Once all
twenty are running, a second consumer polls the same queue the whole time and never
gets one. Ctrl-C stops the worker gracefully.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

from leasekeeper import Message, aio
from leasekeeper.backends.memory import MemoryQueue

VISIBILITY = 2.0


async def handle(message: Message) -> None:
    held = aio.current_lease()  # this handler's lease
    if message.body == "job 0":
        time.sleep(1.0)  # blocks the event loop; renewals run on leasekeeper's thread
    for _step in range(4):
        await asyncio.sleep(VISIBILITY / 2)  # one step of a "long" job
        held.check()  # LeaseLost if another worker may have it: stop before the next step
    print(f"done {message.id}: {message.body}")


async def main() -> None:
    queue = MemoryQueue(visibility_timeout=VISIBILITY)
    for n in range(20):
        queue.send(f"job {n}")
    worker = aio.AsyncWorker(
        queue,
        handle,
        concurrency=20,
        wait_seconds=0.2,
        max_receives=3,  # a job that fails three times goes to the dead-letter queue
        dead_letter=MemoryQueue(),
        visibility_timeout=VISIBILITY,
        timer_interval=0.2,
        minimal_life=0.5,
    )

    stolen: list[str] = []
    stop = threading.Event()

    def competing_consumer() -> None:
        while not stop.is_set():
            stolen.extend(m.id for m in queue.receive(max_messages=10, wait_seconds=0.1))

    running = asyncio.ensure_future(worker.run(until_idle=0.5))
    while queue.in_flight_count() < 20 and not running.done():
        await asyncio.sleep(0.05)  # until every job is being handled under a lease
    thief = threading.Thread(target=competing_consumer, daemon=True)
    thief.start()
    stats = await running
    stop.set()
    thief.join()
    print(f"completed {stats.completed}, failed {stats.failed}, lost {stats.lost}")
    print(f"messages the competing consumer got: {len(stolen)}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(main())
