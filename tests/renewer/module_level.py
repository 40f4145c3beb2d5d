"""A script in the module-level form, for test_default_renewer.py: receive one message
with ``leasekeeper.receive``, print ``working <id>``, and work on it ``with held:``
until stopped (SIGTERM, Ctrl-C).

``python -m tests.renewer.module_level ENDPOINT QUEUE_URL``, with the local
services' dummy AWS credentials in the environment.
"""

from __future__ import annotations

import sys
import time

import boto3

import leasekeeper
from leasekeeper.backends.sqs import SQSBackend


def main(endpoint: str, url: str) -> int:
    queue = SQSBackend(boto3.client("sqs", endpoint_url=endpoint), url)
    deadline = time.monotonic() + 60  # never outlive a broken test
    while time.monotonic() < deadline:
        for held in leasekeeper.receive(queue, wait_seconds=1):
            with held:
                print("working", held.id, flush=True)
                while time.monotonic() < deadline:
                    time.sleep(0.1)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
