"""moto's server with each ReceiveMessage atomic: ``python tests/moto_serial.py -H HOST -p PORT``.

moto serves every request on a thread of its own, and its ReceiveMessage checks
that a message is visible, then marks it received, with no lock between the two:
two receives at once can both take one message. Under load it happens - one
message handed to two Spark executors within the same second, at the start of a
drain. SQS hides a message from the moment one receive takes it (its rare
at-least-once duplicates aside, which no test here is about). So here each
receive's scan-and-mark holds one lock, which a long poll lets go of while it
waits for messages to arrive.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from moto.server import main
from moto.sqs import models

_scan_lock = threading.Lock()  # guards one receive's look for visible messages
_receive = models.SQSBackend.receive_message
_wait = models.Queue.wait_for_messages


def receive_message(self: Any, *args: Any, **kwargs: Any) -> Any:
    with _scan_lock:
        return _receive(self, *args, **kwargs)


def wait_for_messages(self: Any, timeout: int) -> None:
    # Called only by receive_message, which holds the lock: a long poll waits without it.
    _scan_lock.release()
    try:
        _wait(self, timeout)
    finally:
        _scan_lock.acquire()


models.SQSBackend.receive_message = receive_message  # type: ignore[method-assign]
models.Queue.wait_for_messages = wait_for_messages  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
