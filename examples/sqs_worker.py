"""A complete SQS worker: long jobs on a queue with a short visibility timeout.

Each message is a job. ``with lease(message):`` keeps it invisible while the job
runs (leasekeeper renews it in the background), deletes it when the job succeeds,
and releases it (visible again at once) when the job fails. If this process
dies, its messages reappear after one short visibility timeout.

A job's body is JSON such as ``{"seconds": 90}`` (how long the pretend work
takes); any other body is a one-second job. A body ``{"fail": true}`` fails.

Environment:
    SQS_QUEUE_URL       the queue (required)
    AWS_REGION          its region (or AWS_DEFAULT_REGION, which boto3 reads itself)
    AWS_ENDPOINT_URL    optional: another endpoint, e.g. a local moto server
    VISIBILITY_TIMEOUT  seconds each renewal keeps a message hidden (default 30)
    WAIT_SECONDS        long-poll time of a receive, 0-20 (default 10; at most a
                        third of VISIBILITY_TIMEOUT)
    SHUTDOWN_GRACE      seconds a running job may go on after SIGTERM (default 10)
    plus the usual AWS credentials (environment, profile or instance role).

SIGTERM or Ctrl-C: stop receiving; the running job may finish within
SHUTDOWN_GRACE seconds, after which it is interrupted and its message released,
so another worker takes it over without waiting for the timeout.

Try it against moto (no AWS account needed)::

    pip install 'leasekeeper[sqs]' 'moto[server]'
    moto_server -H 127.0.0.1 -p 5000 &
    export AWS_ENDPOINT_URL=http://127.0.0.1:5000 AWS_DEFAULT_REGION=us-east-1
    export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
    python - <<'EOF'
    import boto3, json
    sqs = boto3.client("sqs")
    url = sqs.create_queue(QueueName="jobs", Attributes={"VisibilityTimeout": "5"})["QueueUrl"]
    for _ in range(3):
        sqs.send_message(QueueUrl=url, MessageBody=json.dumps({"seconds": 12}))
    EOF
    export SQS_QUEUE_URL=http://127.0.0.1:5000/123456789012/jobs
    VISIBILITY_TIMEOUT=5 python examples/sqs_worker.py

(``AWS_ENDPOINT_URL`` is read by boto3 >= 1.28 itself; the script passes it on
explicitly too.) Each 12-second job outlives the 5-second timeout and is still
processed once; kill the worker with ``kill -9`` mid-job and start it again: the
message is back within about 5 seconds.

IAM permissions the worker needs on the queue: sqs:ReceiveMessage,
sqs:ChangeMessageVisibility, sqs:DeleteMessage, sqs:GetQueueAttributes.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
from types import FrameType

import boto3

from leasekeeper import Lease, LeaseLost, Message, ReceiveError, configure, lease, shutdown
from leasekeeper.backends.sqs import SQSBackend

log = logging.getLogger("sqs_worker")

stop_requested = threading.Event()
stop_requested_at = 0.0


class Interrupted(Exception):
    """The job was cut short by shutdown; its message is released."""


def on_signal(signum: int, frame: FrameType | None) -> None:
    global stop_requested_at  # noqa: PLW0603 - set once, read by the job
    if not stop_requested.is_set():
        stop_requested_at = time.monotonic()
        stop_requested.set()
        log.info("%s: finishing the current job, then stopping", signal.Signals(signum).name)


def run_job(message: Message, held: Lease, grace: float) -> None:
    """The pretend work: ``seconds`` of steps, each checking the lease and shutdown."""
    try:
        job = json.loads(message.body)
    except (TypeError, ValueError):
        job = {}
    if not isinstance(job, dict):
        job = {}
    if job.get("fail"):
        raise RuntimeError("the job asked to fail")
    end = time.monotonic() + float(job.get("seconds", 1.0))
    while time.monotonic() < end:
        held.check()  # raises LeaseLost if another worker may have the message now
        if stop_requested.is_set() and time.monotonic() - stop_requested_at > grace:
            raise Interrupted(f"shutdown after {grace:g}s of grace")
        time.sleep(min(0.1, max(0.0, end - time.monotonic())))


def main() -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    queue_url = os.environ.get("SQS_QUEUE_URL")
    if not queue_url:
        print("set SQS_QUEUE_URL to the queue's URL", file=sys.stderr)
        return 2
    visibility = float(os.environ.get("VISIBILITY_TIMEOUT", "30"))
    # A message's lease counts from just before the receive was sent, so a long poll
    # eats into it: keep the wait well under the visibility timeout.
    wait = min(float(os.environ.get("WAIT_SECONDS", "10")), 20.0, visibility / 3)
    grace = float(os.environ.get("SHUTDOWN_GRACE", "10"))

    client = boto3.client(
        "sqs",
        region_name=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION"),
        endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
    )
    backend = SQSBackend(client, queue_url)
    # Renew when a third of the timeout is left; a renewal keeps it hidden for
    # `visibility` more seconds. Short timeouts need a quick timer.
    configure(
        visibility_timeout=visibility,
        timer_interval=min(1.0, visibility / 10),
        minimal_life=min(2.0, visibility / 4),
    )
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("worker on %r (visibility %gs)", backend, visibility)

    done = failed = 0
    receive_failures = 0
    while not stop_requested.is_set():
        try:
            messages = backend.receive(
                max_messages=1, wait_seconds=wait, visibility_timeout=visibility
            )
            receive_failures = 0
        except ReceiveError as exc:  # what every backend's receive raises
            if not exc.retryable:  # the queue is gone, the credentials are refused
                log.error("cannot receive from %s: %s", queue_url, exc.detail)
                shutdown()
                return 1
            receive_failures += 1
            pause = min(30.0, 0.5 * 2**receive_failures)
            log.warning("receive failed (%s); retrying in %.1fs", exc.detail, pause)
            stop_requested.wait(pause)
            continue
        for message in messages:
            try:
                # Leaving the block normally deletes the message; an exception
                # releases it (visible again at once) and propagates.
                with lease(message) as held:
                    run_job(message, held, grace)
            except LeaseLost as exc:
                failed += 1
                log.warning("gave up message %s: %s", message.id, exc.reason)
            except Interrupted:
                log.info("message %s released for another worker", message.id)
            except Exception as exc:
                failed += 1
                log.warning("job %s failed (%s); released", message.id, exc)
            else:
                done += 1
                print(f"processed {message.id}", flush=True)
    shutdown()  # releases whatever is still leased (nothing, normally)
    log.info("stopped: %d processed, %d failed", done, failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
