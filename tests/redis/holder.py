"""A consumer that receives one entry, leases it, says so, and sleeps (to be killed).

``python -m tests.redis.holder URL``: prints ``held <id>`` once the lease is registered.
"""

from __future__ import annotations

import sys
import time

import leasekeeper
from leasekeeper import LeaseManager


def main(url: str) -> None:
    backend = leasekeeper.connect(url, consumer="doomed", visibility_timeout=4)
    # The thread renewer: the test waits out a killed consumer's lease, which a
    # renewer process would release at once.
    manager = LeaseManager(
        backend, renewer="thread", visibility_timeout=4, timer_interval=0.5, minimal_life=1
    )
    for _ in range(100):
        messages = backend.receive(wait_seconds=1)
        if messages:
            lease = manager.register(messages[0])
            print(f"held {lease.message.id}", flush=True)
            time.sleep(600)  # renewed until killed
    sys.exit("no message to hold")


if __name__ == "__main__":
    main(sys.argv[1])
