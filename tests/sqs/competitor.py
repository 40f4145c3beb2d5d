"""A competing consumer in a process of its own: polls a queue and keeps what it gets.

``python -m tests.sqs.competitor --endpoint URL --queue-url URL [--interval 0.05]
[--visibility 30]`` prints ``READY`` once it can reach the service and waits for
a ``GO`` line on stdin; then it polls with short receives every ``interval``
seconds, hides what it receives for ``visibility`` seconds and never deletes it.
It prints ``GOT <message id> <receive count>`` for each message it receives, and
``POLLS <n>`` when stdin closes (then it exits).

In a process of its own it goes on polling while a thread of the test process
holds the GIL, as another worker on another machine would. ``Competitor`` runs
it from a test.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--queue-url", required=True)
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--visibility", type=int, default=30)
    options = parser.parse_args()

    import boto3
    from botocore.config import Config

    client = boto3.client(
        "sqs",
        endpoint_url=options.endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"max_attempts": 2, "mode": "standard"}, read_timeout=30),
    )
    client.get_queue_attributes(QueueUrl=options.queue_url, AttributeNames=["VisibilityTimeout"])
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        print("POLLS 0", flush=True)
        return 0
    stop = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    polls = 0
    while not stop.is_set():
        response = client.receive_message(
            QueueUrl=options.queue_url,
            MaxNumberOfMessages=10,
            VisibilityTimeout=options.visibility,
            MessageSystemAttributeNames=["ApproximateReceiveCount"],
        )
        polls += 1
        lines = [
            f"GOT {m['MessageId']} {m.get('Attributes', {}).get('ApproximateReceiveCount', '?')}"
            for m in response.get("Messages", [])
        ]
        if lines:
            print("\n".join(lines), flush=True)
        stop.wait(options.interval)
    print(f"POLLS {polls}", flush=True)
    return 0


class Competitor:
    """``with Competitor(endpoint, queue_url) as other:`` starts the process and waits
    until it is ready; ``other.go()`` starts its polling (from any thread: one
    write to a pipe). ``other.received`` (ids, in order), ``other.wait_for(ids,
    timeout)``; ``other.polls`` once it has ended."""

    def __init__(self, endpoint: str, queue_url: str, **options: Any) -> None:
        self._args = [
            sys.executable,
            "-m",
            "tests.sqs.competitor",
            "--endpoint",
            endpoint,
            "--queue-url",
            queue_url,
        ]
        for name, value in options.items():
            self._args += ["--" + name.replace("_", "-"), str(value)]
        self.received: list[str] = []
        self.polls = 0
        self._changed = threading.Condition()
        self._ready = False
        self._go_lock = threading.Lock()
        self._went = False
        self._proc: subprocess.Popen[str] | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> Competitor:
        env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}
        self._proc = subprocess.Popen(
            self._args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=str(REPO),
            env=env,
        )
        self._reader = threading.Thread(target=self._read, name="competitor-reader", daemon=True)
        self._reader.start()
        with self._changed:
            # Its imports and a first request, on a loaded machine.
            if not self._changed.wait_for(lambda: self._ready or self._ended(), timeout=60):
                raise AssertionError("the competing consumer was not ready in 60 s")
            if not self._ready:
                raise AssertionError(f"the competing consumer exited ({self._proc.poll()})")
        return self

    def _ended(self) -> bool:
        return self._proc is not None and self._proc.poll() is not None

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            words = line.split()
            with self._changed:
                if words[:1] == ["READY"]:
                    self._ready = True
                elif words[:1] == ["GOT"]:
                    self.received.append(words[1])
                elif words[:1] == ["POLLS"]:
                    self.polls = int(words[1])
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def go(self) -> None:
        """Start polling (once; later calls do nothing)."""
        with self._go_lock:
            if self._went:
                return
            self._went = True
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.write("GO\n")
        self._proc.stdin.flush()

    def wait_for(self, ids: set[str], timeout: float) -> bool:
        """Wait until the competitor has received every one of ``ids``."""
        with self._changed:
            return self._changed.wait_for(lambda: ids <= set(self.received), timeout=timeout)

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        self._proc.stdin.close()  # it finishes its poll, prints POLLS and exits
        try:
            self._proc.wait(30)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(10)
        if self._reader is not None:
            self._reader.join(10)
        assert self._proc.stdout is not None
        self._proc.stdout.close()


if __name__ == "__main__":
    sys.exit(main())
