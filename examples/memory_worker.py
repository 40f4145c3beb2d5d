"""A complete worker on the built-in in-memory queue: no cloud account needed.

    .venv/bin/python examples/memory_worker.py

Twenty jobs, each taking twice the (2 s) visibility timeout, are handled by twenty
threads while leasekeeper keeps them invisible; once they are all running, a second
consumer polls the same queue the whole time and never gets one. Ctrl-C stops the
worker gracefully.
"""

from __future__ import annotations

import logging
import threading
import time

from leasekeeper import Message, Worker
from leasekeeper.backends.memory import MemoryQueue

VISIBILITY = 2.0


all_running = threading.Barrier(21)


def handle(message: Message) -> None:
    all_running.wait(timeout=10)
    time.sleep(2 * VISIBILITY)  # a "long" job
    print(f"done {message.id}: {message.body}")


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    queue = MemoryQueue(visibility_timeout=VISIBILITY)
    for n in range(20):
        queue.send(f"job {n}")

    stolen: list[str] = []
    stop = threading.Event()

    def competing_consumer() -> None:
        while not stop.is_set():
            stolen.extend(m.id for m in queue.receive(max_messages=10, wait_seconds=0.1))

    worker = Worker(
        queue,
        handle,
        concurrency=20,
        wait_seconds=0.2,
        visibility_timeout=VISIBILITY,
        timer_interval=0.2,
        minimal_life=0.5,
    )
    worker.start()
    all_running.wait(timeout=10)  # every job is now being handled under a lease
    thief = threading.Thread(target=competing_consumer, daemon=True)
    thief.start()
    time.sleep(3 * VISIBILITY)
    worker.stop()
    stats = worker.stats
    stop.set()
    thief.join()
    print(f"completed {stats.completed}, failed {stats.failed}, lost {stats.lost}")
    print(f"messages the competing consumer got: {len(stolen)}")


if __name__ == "__main__":
    main()
