"""A worker process for test_mns_backend.py's SIGKILL test.

Receives one message through MNSBackend, leases it (visibility_timeout=2,
timer_interval=0.2, minimal_life=0.5, extend_threshold=1.2), prints
``READY <message id>`` once the lease has been extended at least once, then
"works" until it is killed.

Environment: MNS_ENDPOINT, MNS_QUEUE, MNS_ACCESS_KEY_ID, MNS_ACCESS_KEY_SECRET.
"""

from __future__ import annotations

import os
import sys
import time

from mns.account import Account

from leasekeeper import LeaseManager
from leasekeeper.backends.mns import MNSBackend


def main() -> int:
    queue = Account(
        os.environ["MNS_ENDPOINT"],
        os.environ["MNS_ACCESS_KEY_ID"],
        os.environ["MNS_ACCESS_KEY_SECRET"],
    ).get_queue(os.environ["MNS_QUEUE"])
    backend = MNSBackend(queue)
    # extend_threshold 1.2 s (derived: 0.7 s) leaves room for a loaded test box.
    manager = LeaseManager(
        backend, visibility_timeout=2, timer_interval=0.2, minimal_life=0.5, extend_threshold=1.2
    )
    deadline = time.monotonic() + 30  # never outlive a broken test
    while time.monotonic() < deadline:
        messages = backend.receive(max_messages=1, wait_seconds=1, visibility_timeout=2)
        if messages:
            lease = manager.register(messages[0])
            break
    else:
        print("NOTHING", flush=True)
        return 1
    while lease.extensions < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    print(f"READY {lease.id}", flush=True)
    while time.monotonic() < deadline:  # the job: runs until SIGKILL
        time.sleep(0.1)
    return 2


if __name__ == "__main__":
    sys.exit(main())
