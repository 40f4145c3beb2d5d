"""A worker process for test_moto.py's kill test: receive one message, lease it,
print ``READY <message id>``, then "work" until killed.

Environment: SQS_ENDPOINT, SQS_QUEUE_URL, and dummy AWS credentials.
"""

from __future__ import annotations

import os
import sys
import time

import boto3

from leasekeeper import LeaseManager
from leasekeeper.backends.sqs import SQSBackend


def main() -> int:
    client = boto3.client("sqs", endpoint_url=os.environ["SQS_ENDPOINT"], region_name="us-east-1")
    backend = SQSBackend(client, os.environ["SQS_QUEUE_URL"])
    manager = LeaseManager(
        backend, visibility_timeout=2, timer_interval=0.2, minimal_life=0.5, extend_threshold=1.2
    )
    deadline = time.monotonic() + 30  # never outlive a broken test
    while time.monotonic() < deadline:
        messages = backend.receive(max_messages=1, wait_seconds=1)
        if messages:
            manager.register(messages[0])
            print(f"READY {messages[0].id}", flush=True)
            break
    else:
        print("NOTHING", flush=True)
        return 1
    while time.monotonic() < deadline:  # the job: runs until SIGKILL
        time.sleep(0.1)
    return 2


if __name__ == "__main__":
    sys.exit(main())
