"""A worker process for test_processes.py: lease one message, then "work" forever.

Usage: python crash_worker.py VISIBILITY_TIMEOUT TIMER_INTERVAL, with
AZURE_STORAGE_CONNECTION_STRING and AZURE_QUEUE_NAME set. Prints ``LEASED <id>``
once the message is leased and ``EXTENDED <n>`` after every extension, so the
test knows when to kill it (SIGKILL: no cleanup runs, the lease just stops).
"""

from __future__ import annotations

import os
import sys
import time

from azure.storage.queue import QueueClient

from leasekeeper import LeaseManager
from leasekeeper.backends.azure import AzureQueueBackend


def main() -> None:
    visibility, tick = float(sys.argv[1]), float(sys.argv[2])
    client = QueueClient.from_connection_string(
        os.environ["AZURE_STORAGE_CONNECTION_STRING"], os.environ["AZURE_QUEUE_NAME"]
    )
    backend = AzureQueueBackend(client)
    # The thread renewer: the test bounds a failover that waits out the lease (a
    # renewer process releases at once, tests/renewer).
    manager = LeaseManager(
        backend,
        renewer="thread",
        visibility_timeout=visibility,
        timer_interval=tick,
        minimal_life=0.5,
    )
    messages = backend.receive(wait_seconds=20, visibility_timeout=visibility)
    if not messages:
        print("NOTHING", flush=True)
        return
    lease = manager.register(messages[0])
    print(f"LEASED {lease.id}", flush=True)
    seen = 0
    while True:  # the job: never finishes
        time.sleep(0.01)
        if lease.extensions != seen:
            seen = lease.extensions
            print(f"EXTENDED {seen}", flush=True)


if __name__ == "__main__":
    main()
