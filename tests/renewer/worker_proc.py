"""A worker process for the failover tests: lease N messages with a renewer process,
say so, then hold them until killed.

``python -m tests.renewer.worker_proc ENDPOINT QUEUE_URL N`` prints one line,
``ready <renewer pid> <message id> ...``, once every lease is registered.
"""

from __future__ import annotations

import sys
import threading

from leasekeeper import LeaseManager
from leasekeeper.backends.sqs import SQSBackend
from tests.services import make_client


def main(argv: list[str]) -> int:
    endpoint, url, count = argv[1], argv[2], int(argv[3])
    backend = SQSBackend(make_client(endpoint), url)
    manager = LeaseManager(backend, renewer="process", visibility_timeout=30)
    held = []
    while len(held) < count:
        for message in backend.receive(max_messages=10, wait_seconds=1, visibility_timeout=30):
            held.append(manager.register(message))
    ids = " ".join(lease.id for lease in held)
    sys.stdout.write(f"ready {manager.renewer_pid} {ids}\n")
    sys.stdout.flush()
    threading.Event().wait()  # until killed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
