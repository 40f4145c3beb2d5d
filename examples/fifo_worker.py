"""Orders in order: a FIFO queue's message groups through one Worker.

    .venv/bin/python examples/fifo_worker.py          # on an in-memory FIFO queue
    QUEUE_URL=https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo \\
        .venv/bin/python examples/fifo_worker.py      # on a real one (it must exist)

Each order's events - created, paid, packed, shipped - are one message group
(the MessageGroupId is the order id), sent to a FIFO queue. One ``Worker`` of 8
threads handles them: the orders side by side, each order's events one at a time,
in the order they were sent - a "shipped" is never handled before its "paid".

The payment service times out once, on order o-2's "paid": that message is
released (after ``release_delay``) together with o-2's later events the worker
holds, unhandled, so the queue hands o-2 out again from "paid". The other orders
go on meanwhile. Nothing is configured for any of this: on a queue whose URL ends
in ``.fifo`` (or ``MemoryQueue(fifo=True)``), order is kept by default.

``QUEUE_URL`` is any FIFO queue ``leasekeeper.connect`` takes, with the usual AWS
credentials, region and endpoint in the environment.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter

from leasekeeper import Message, Worker, connect

ORDERS = ["o-1", "o-2", "o-3", "o-4"]
EVENTS = ["created", "paid", "packed", "shipped"]

handled: dict[str, list[str]] = {}
tries: Counter[tuple[str, str]] = Counter()
lock = threading.Lock()


class PaymentTimeout(Exception):
    """The payment service did not answer in time (this once)."""


def handle(message: Message) -> None:
    job = json.loads(message.body)
    order, event = job["order"], job["event"]
    with lock:
        tries[order, event] += 1
        first_try = tries[order, event] == 1
    time.sleep(0.05)  # the work
    if (order, event) == ("o-2", "paid") and first_try:
        raise PaymentTimeout(f"{order}: payment service timed out")
    with lock:
        handled.setdefault(order, []).append(event)


def main() -> None:
    logging.basicConfig(level=logging.ERROR)  # the one failure's WARNING is expected
    queue = connect(os.environ.get("QUEUE_URL", "memory://orders.fifo"))
    for event in EVENTS:  # every order's "created" first, then every "paid"...
        for order in ORDERS:
            body = json.dumps({"order": order, "event": event})
            queue.send(body, group_id=order)  # type: ignore[attr-defined]

    worker = Worker(queue, handle, concurrency=8, release_delay=0.5)
    started = time.monotonic()
    stats = worker.run(until_idle=2)
    took = time.monotonic() - started - 2  # the idle wait at the end is no work

    for order in ORDERS:
        retried = [event for event in EVENTS if tries[order, event] > 1]
        note = f" ({', '.join(retried)} tried twice)" if retried else ""
        print(f"{order}: {' '.join(handled.get(order, []))}{note}")
    print(
        f"completed {stats.completed}, failed {stats.failed}, held back {stats.held_back}, "
        f"in {took:.1f}s ({len(ORDERS) * len(EVENTS)} jobs of 0.05s)"
    )


if __name__ == "__main__":
    main()
