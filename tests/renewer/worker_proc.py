"""A worker process for the failover tests: lease N messages with a renewer process,
say so, then hold them until killed.

``python -m tests.renewer.worker_proc ENDPOINT QUEUE_URL N [mixed]`` prints one line,
``ready <renewer pid> <message id> ...``, once every lease is registered. With
``mixed``, half of them are received with a 12 s timeout, so the renewer process
hands them to its engine within a second and renews them (the others it holds
back until their first renewal nears, 19 s on); ready once each of those was renewed.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from leasekeeper import LeaseManager
from leasekeeper.backends.sqs import SQSBackend
from tests.services import make_client


def main(argv: list[str]) -> int:
    endpoint, url, count = argv[1], argv[2], int(argv[3])
    mixed = argv[4:] == ["mixed"]
    backend = SQSBackend(make_client(endpoint), url)
    manager = LeaseManager(backend, renewer="process", visibility_timeout=30)

    def leased(n: int, visibility: int) -> list[Any]:
        got: list[Any] = []
        while len(got) < n:
            wanted = min(10, n - len(got))
            for message in backend.receive(
                max_messages=wanted, wait_seconds=1, visibility_timeout=visibility
            ):
                got.append(manager.register(message))
        return got

    half = count // 2 if mixed else count
    held = leased(half, 30) + leased(count - half, 12)
    renewed = held[half:]
    deadline = time.monotonic() + 20
    while any(lease.extensions < 1 for lease in renewed) and time.monotonic() < deadline:
        time.sleep(0.05)
    ids = " ".join(lease.id for lease in held)
    sys.stdout.write(f"ready {manager.renewer_pid} {ids}\n")
    sys.stdout.flush()
    threading.Event().wait()  # until killed
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
