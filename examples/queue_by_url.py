"""A worker on any queue named by URL: the same code on every backend.

    .venv/bin/python examples/queue_by_url.py                      # memory://example
    .venv/bin/python examples/queue_by_url.py "redis://localhost:6379/0?stream=jobs"
    AWS_REGION=eu-west-1 .venv/bin/python examples/queue_by_url.py sqs://jobs

It puts ten jobs on the queue, each with an attribute (where the service carries
attributes), then runs a Worker until the queue has been idle for a second, and
prints what each handler saw. Credentials come from the environment, as
docs/queues-by-url.md says for each service.
"""

from __future__ import annotations

import sys
import time

import leasekeeper
from leasekeeper import Message, Worker


def handle(message: Message) -> None:
    time.sleep(0.2)  # a job
    tenant = message.attributes.get("tenant", "-")
    # One write a line: print() from several threads can split a line from its end.
    sys.stdout.write(f"{message.body} (tenant {tenant}, delivery {message.receive_count})\n")


def main(url: str) -> None:
    queue = leasekeeper.connect(url)
    carries = getattr(queue, "carries_attributes", False)
    for n in range(10):
        queue.send(f"job {n}", {"tenant": f"t{n % 3}"} if carries else None)  # type: ignore[attr-defined]
    worker = Worker(queue, handle, concurrency=4, wait_seconds=0.5, visibility_timeout=30)
    stats = worker.run(until_idle=1.0)
    print(f"completed {stats.completed}, failed {stats.failed}, lost {stats.lost}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "memory://example")
