"""Urgent and bulk work in one worker: two queues, read 3 to 1.

    .venv/bin/python examples/priorities.py

A backlog of 60 bulk jobs waits when 20 urgent ones arrive. One worker reads both
queues with weights 3 and 1: while both have work, three receives in four go to
the urgent queue, so urgent jobs are done first - yet bulk work keeps moving (a
light queue is never starved), and once the urgent queue is empty the bulk queue
gets every receive (an empty queue does not hold the other up). One pool of handler
threads, one renewer, one manager: each message is renewed and deleted on its own
queue.

The queues here are in memory (``memory://``); give real ones the same way:
``Worker([connect(url_urgent), connect(url_bulk)], handle, weights=[3, 1])``, or
``leasekeeper worker jobs:handle --queue URL --queue URL --weights 3,1``.
"""

from __future__ import annotations

import logging
import threading
import time

from leasekeeper import Message, Worker, connect, current_lease
from leasekeeper.backends.memory import MemoryQueue

done: list[str] = []
lock = threading.Lock()


def handle(message: Message) -> None:
    time.sleep(0.01)  # a little work
    queue = current_lease().message.backend  # which queue this message came from
    assert isinstance(queue, MemoryQueue)
    with lock:
        done.append(queue.name)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    urgent, bulk = connect("memory://urgent"), connect("memory://bulk")
    assert isinstance(urgent, MemoryQueue) and isinstance(bulk, MemoryQueue)
    for n in range(60):
        bulk.send(f"bulk job {n}")
    for n in range(20):
        urgent.send(f"urgent job {n}")

    worker = Worker(
        [urgent, bulk],
        handle,
        weights=[3, 1],
        concurrency=2,
        batch_size=1,  # one message a receive: the weights decide every pick
        wait_seconds=0.2,
        renewer="thread",
    )
    stats = worker.run(until_idle=0.5)

    print("the first 24 jobs done, by queue:")
    print(" ".join("U" if name == "urgent" else "b" for name in done[:24]))
    last_urgent = max(i for i, name in enumerate(done) if name == "urgent")
    print(f"all 20 urgent jobs done among the first {last_urgent + 1} of {len(done)}")
    for name, figures in stats.per_queue.items():
        print(f"{name}: received {figures.received}, completed {figures.completed}")
    print(f"in total: completed {stats.completed}, left: {len(urgent) + len(bulk)}")


if __name__ == "__main__":
    main()
