"""A worker process for the crash tests: leasekeeper's Worker on a real service,
journaling what it does, optionally SIGKILLing itself at a chosen point.

Run from the repository root (the test does)::

    python -m tests.crash.worker --backend sqs|azure|mns --journal PATH --worker N
        [--kill-point POINT] [--work 3.0] [--stagger 0.1] [--concurrency 8]

Connection details come from the environment, as for the other process tests:
SQS_ENDPOINT + SQS_QUEUE_URL (+ dummy AWS credentials), AZURE_STORAGE_CONNECTION_STRING
+ AZURE_QUEUE_NAME, or MNS_ENDPOINT + MNS_QUEUE + MNS_ACCESS_KEY_ID +
MNS_ACCESS_KEY_SECRET.

The process imports everything, builds its backend, prints ``READY`` and waits
for a line on stdin (``GO``): so the test can start the next worker while the
current one still runs, and a restart after a kill costs no start-up time. It
then runs ``Worker.run()`` until SIGTERM (graceful: it finishes and deletes
what it holds) or SIGKILL.

The handler journals ``start <id>``, sleeps ``work + stagger * n`` seconds (``n``
from the body ``job-<n>``; longer than the 2 s visibility timeout, so every
message needs extends), then journals ``done <id>``; leasekeeper deletes the
message after that. Kill points (the first time the point is reached, the
process journals ``kill <point> <ids>`` and SIGKILLs itself):

- ``before_register``: a receive returned messages, before the Worker registers them
- ``extending_before_call``: in the first extend call, before it is sent
- ``extending_after_call``: in the first extend call, after the service answered
  (MNS and Azure rotated the receipt: the new one dies with the process)
- ``after_handler_before_delete``: a handler is done, its delete not yet sent
- ``during_delete``: the delete was sent and answered, before leasekeeper (and
  the journal) recorded it
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict

from leasekeeper import LeaseConfig, LeaseManager, Message, Worker
from leasekeeper.backends.base import Backend, ForwardingBackend, Handle, Outcome
from leasekeeper.lease import Lease
from tests.crash.journal import Journal

KILL_POINTS = (
    "before_register",
    "extending_before_call",
    "extending_after_call",
    "after_handler_before_delete",
    "during_delete",
)
BACKENDS = ("sqs", "azure", "mns")
# The lease settings of the other process tests: a 2 s visibility timeout, renewed
# when less than 1.2 s is left (the derived default would be 0.7 s; 1.2 s leaves
# room for a loaded 2-core test machine).
LEASE_CONFIG = LeaseConfig(
    visibility_timeout=2.0, timer_interval=0.2, minimal_life=0.5, extend_threshold=1.2
)
MAX_LIFETIME = 120.0  # seconds: never outlive a broken test


def build_backend(kind: str) -> Backend:
    env = os.environ
    if kind == "sqs":
        import boto3
        from botocore.config import Config

        from leasekeeper.backends.sqs import SQSBackend

        client = boto3.client(
            "sqs",
            endpoint_url=env["SQS_ENDPOINT"],
            region_name=env.get("AWS_REGION", "us-east-1"),
            config=Config(
                retries={"max_attempts": 2, "mode": "standard"}, connect_timeout=2, read_timeout=30
            ),
        )
        return SQSBackend(client, env["SQS_QUEUE_URL"])
    if kind == "azure":
        from azure.storage.queue import QueueClient

        from leasekeeper.backends.azure import AzureQueueBackend

        queue_client = QueueClient.from_connection_string(
            env["AZURE_STORAGE_CONNECTION_STRING"], env["AZURE_QUEUE_NAME"]
        )
        return AzureQueueBackend(queue_client)
    if kind == "mns":
        from mns.account import Account

        from leasekeeper.backends.mns import MNSBackend

        queue = Account(
            env["MNS_ENDPOINT"], env["MNS_ACCESS_KEY_ID"], env["MNS_ACCESS_KEY_SECRET"]
        ).get_queue(env["MNS_QUEUE"])
        return MNSBackend(queue, queue_visibility_timeout=LEASE_CONFIG.visibility_timeout)
    raise ValueError(f"unknown backend {kind!r}")


def die(journal: Journal, point: str, ids: Sequence[str]) -> None:
    """Journal the kill, then SIGKILL this process: no cleanup, no finally, no atexit."""
    journal.write("kill", point, *ids)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the signal is delivered at once; never reached


class CrashingBackend(ForwardingBackend):
    """Forwards to a real backend, journals receives and deletes, and SIGKILLs the
    process at ``kill_point``. Received messages are re-pointed at this wrapper, so
    the manager's extends and deletes come through it."""

    def __init__(self, inner: Backend, journal: Journal, kill_point: str | None) -> None:
        super().__init__(inner)
        self._journal = journal
        self._kill_point = kill_point
        # Taken (and never given back: the process dies holding it) by the call that
        # reaches the kill point, so no other call of that kind slips through meanwhile.
        self._gate = threading.Lock()

    def _armed(self, *points: str) -> bool:
        return self._kill_point in points

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        out = super().receive(max_messages, wait_seconds, visibility_timeout)
        for message in out:
            self._journal.write("recv", message.id)
        if out and self._armed("before_register"):
            self._gate.acquire()
            die(self._journal, "before_register", [m.id for m in out])
        return out

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        ids = [h.message_id for h in handles]
        if self._armed("extending_before_call"):
            self._gate.acquire()
            die(self._journal, "extending_before_call", ids)
        if self._armed("extending_after_call"):
            self._gate.acquire()
            self.inner.extend(handles, timeout)
            die(self._journal, "extending_after_call", ids)
        return self.inner.extend(handles, timeout)

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        ids = [h.message_id for h in handles]
        if self._armed("after_handler_before_delete"):
            self._gate.acquire()
            die(self._journal, "after_handler_before_delete", ids)
        if self._armed("during_delete"):
            self._gate.acquire()
            self.inner.delete(handles)
            die(self._journal, "during_delete", ids)
        outcomes = self.inner.delete(handles)
        for mid, outcome in zip(ids, outcomes, strict=True):
            if outcome.kind == "ok":
                self._journal.write("deleted", mid)
            else:
                self._journal.write("delfail", mid, outcome.kind, outcome.detail.replace(" ", "_"))
        return outcomes

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        outcomes = self.inner.release(handles, delay)
        for handle, outcome in zip(handles, outcomes, strict=True):
            self._journal.write("released", handle.message_id, outcome.kind)
        return outcomes


def work_seconds(body: str | bytes, work: float, stagger: float) -> float:
    text = body.decode() if isinstance(body, bytes) else body
    _, _, number = text.rpartition("-")
    return work + stagger * int(number) if number.isdigit() else work


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--backend", choices=BACKENDS, required=True)
    parser.add_argument("--journal", required=True)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--kill-point", choices=KILL_POINTS, default=None)
    parser.add_argument("--work", type=float, default=3.0)
    parser.add_argument("--stagger", type=float, default=0.1)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)

    # Never outlive a broken test, whatever state the process is in.
    watchdog = threading.Timer(MAX_LIFETIME, os.kill, (os.getpid(), signal.SIGKILL))
    watchdog.daemon = True
    watchdog.start()

    journal = Journal(args.journal, args.worker)
    backend = CrashingBackend(build_backend(args.backend), journal, args.kill_point)

    def on_lost(lease: Lease, reason: str) -> None:
        journal.write("lost", lease.id, reason.replace(" ", "_")[:60])

    # The thread renewer: the kill points are hooks in this process's backend calls.
    manager = LeaseManager(backend, LEASE_CONFIG, on_lost=on_lost, renewer="thread")

    def handler(message: Message) -> None:
        journal.write("start", message.id)
        time.sleep(work_seconds(message.body, args.work, args.stagger))
        journal.write("done", message.id)

    worker = Worker(
        manager,
        handler,
        concurrency=args.concurrency,
        batch_size=args.concurrency,
        wait_seconds=1.0,
        shutdown_timeout=15.0,
    )
    print("READY", flush=True)
    if sys.stdin.readline().strip() != "GO":
        return 3  # the test went away before starting this worker
    journal.write("go")
    stats = worker.run()
    manager.close()
    summary = {**asdict(stats), "manager": manager.stats().as_dict()}
    journal.write("exit", "-", json.dumps(summary, separators=(",", ":")).replace(" ", ""))
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
