"""A complete Aliyun MNS worker: long jobs on a queue with a short visibility timeout.

Each message is a job. leasekeeper's ``Worker`` receives messages, runs ``handle``
for each on a thread pool, keeps every message invisible while its job runs (one
background scheduler renews them with ChangeMessageVisibility), deletes it when
the job succeeds and releases it when the job raises. If this process dies, its
messages reappear after one short visibility timeout.

A job's body is JSON such as ``{"seconds": 90}`` (how long the pretend work
takes); any other body is a one-second job. ``{"fail": true}`` fails.

Environment (nothing is hard-coded; never put an AccessKey in code):
    MNS_ENDPOINT           e.g. https://<account id>.mns.cn-hangzhou.aliyuncs.com
    MNS_ACCESS_KEY_ID      the AccessKey id (of a RAM user, see below)
    MNS_ACCESS_KEY_SECRET  its secret
    MNS_SECURITY_TOKEN     optional: an STS token, with temporary keys above
    MNS_QUEUE              the queue name
    VISIBILITY_TIMEOUT     seconds each renewal keeps a message hidden; default:
                           the queue's own VisibilityTimeout (then a receive needs
                           no extra ChangeMessageVisibility)
    CONCURRENCY            jobs run at once (default 4)
    WAIT_SECONDS           long-poll time of a receive, 0-30 (default 10)

``python examples/mns_worker.py --send N [--seconds S]`` sends N jobs of S
seconds each and exits: handy to try it out.

SIGTERM or Ctrl-C: stop receiving and let running jobs finish (up to 30 s),
then release whatever still runs so other workers take it over at once.

Try it against the local MNS test server (no Aliyun account needed)::

    pip install 'leasekeeper[mns]'
    python -m leasekeeper.testing.mns_server --port 8765 --queue jobs \\
        --visibility-timeout 5 &
    export MNS_ENDPOINT=http://127.0.0.1:8765 MNS_QUEUE=jobs
    export MNS_ACCESS_KEY_ID=test-id MNS_ACCESS_KEY_SECRET=test-key
    python examples/mns_worker.py --send 3 --seconds 12
    python examples/mns_worker.py

Each 12-second job outlives the queue's 5-second timeout and is still processed
once; kill the worker with ``kill -9`` mid-job and start it again: the message
is back within about 5 seconds (its receive count says 2).

RAM permissions the worker needs (resource
``acs:mns:<region>:<account id>:/queues/<queue>/messages``, and ``.../queues/<queue>``
for the attribute read): mns:BatchReceiveMessage, mns:ChangeMessageVisibility,
mns:DeleteMessage, mns:GetQueueAttributes; and mns:SendMessage for ``--send``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

from mns.account import Account
from mns.queue import Message as SDKMessage

from leasekeeper import Message, ReceiveError, Worker
from leasekeeper.backends.mns import MNSBackend

log = logging.getLogger("mns_worker")


def env(name: str, default: str | None = None) -> str:
    value = os.environ.get(name, default)
    if not value:
        sys.exit(f"set {name} (see the docstring of {sys.argv[0]})")
    return value


def open_queue() -> Any:
    """The SDK Queue, from the environment. The backend never shares it across threads."""
    account = Account(
        env("MNS_ENDPOINT"),
        env("MNS_ACCESS_KEY_ID"),
        env("MNS_ACCESS_KEY_SECRET"),
        security_token=os.environ.get("MNS_SECURITY_TOKEN", ""),
    )
    return account.get_queue(env("MNS_QUEUE"))


def job_of(message: Message) -> dict[str, Any]:
    try:
        job = json.loads(message.body)
    except (TypeError, ValueError):
        return {"seconds": 1.0}
    return job if isinstance(job, dict) else {"seconds": 1.0}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--send", type=int, metavar="N", help="send N jobs and exit")
    parser.add_argument("--seconds", type=float, default=10.0, help="length of --send jobs")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")

    queue = open_queue()
    if args.send:
        for _ in range(args.send):
            queue.send_message(SDKMessage(json.dumps({"seconds": args.seconds})))
        print(f"sent {args.send} job(s) of {args.seconds:g}s")
        return 0

    backend = MNSBackend(queue)
    visibility = float(os.environ.get("VISIBILITY_TIMEOUT") or backend.queue_visibility_timeout())
    wait = min(30.0, float(os.environ.get("WAIT_SECONDS", "10")))

    def handle(message: Message) -> None:
        job = job_of(message)
        seconds = float(job.get("seconds", 1.0))
        log.info("job %s: %gs (receive #%d)", message.id, seconds, message.receive_count)
        lease = worker.manager.get(message)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if lease is not None:
                lease.check()  # LeaseLost: someone else may have it now; stop working
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
        if job.get("fail"):
            raise RuntimeError("the job asked to fail")
        log.info("job %s: done", message.id)

    worker = Worker(
        backend,
        handle,
        concurrency=int(os.environ.get("CONCURRENCY", "4")),
        batch_size=16,
        wait_seconds=wait,
        # The sample's QueueMessageVisibilityTimeout, TimerInterval, MessageMinimalLife:
        visibility_timeout=visibility,
        timer_interval=min(1.0, visibility / 10),
        minimal_life=min(2.0, visibility / 4),
    )
    log.info("working on %r (visibility %gs); Ctrl-C to stop", backend, visibility)
    try:
        stats = worker.run()  # until SIGTERM / Ctrl-C
    except ReceiveError as exc:
        # Fatal (queue deleted, key refused): the worker let running jobs finish
        # and stopped; retrying would not help.
        log.error("stopped: cannot receive: %s", exc.detail)
        return 1
    finally:
        backend.close()
    log.info(
        "stopped: %d completed, %d failed, %d lost",
        stats.completed,
        stats.failed,
        stats.lost,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
