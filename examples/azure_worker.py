"""A complete leasekeeper worker for an Azure Storage queue.

It receives messages, runs a (simulated) job for each one while leasekeeper keeps
the message invisible, deletes it when the job succeeds and releases it when the
job fails. The queue's visibility timeout stays short (30 s here), so when this
process dies its messages are back for other workers within 30 s, however long
the jobs run. SIGTERM (or Ctrl-C) stops it gracefully: no new messages are
received, running jobs get ``--shutdown-timeout`` seconds to finish, and whatever
is still running is then released so other workers get it at once.

A message body ``work:SECONDS`` makes a job that takes that long (default 1 s);
``fail`` makes one that raises (the message is released and comes back).

Configuration comes from the environment:

- ``AZURE_STORAGE_CONNECTION_STRING``: the storage account's connection string;
- ``AZURE_QUEUE_NAME``: the queue to work on.

The account needs the "Storage Queue Data Message Processor" role (receive,
update, delete) when you use Microsoft Entra ID instead of a key; with a
connection string's account key everything is allowed. See docs/backends/azure.md.

Run it against Azurite, the local Azure Storage emulator (``make test`` installs
it into ./node_modules; or ``npm install azurite@3.37.0``). Without a ``node`` on
PATH, put ``.venv/bin/node`` (which ``make test`` installs then) in front::

    node_modules/.bin/azurite-queue --queueHost 127.0.0.1 --queuePort 10001 \\
        --location /tmp/azurite --silent --disableTelemetry --skipApiVersionCheck &

    export AZURE_STORAGE_CONNECTION_STRING="DefaultEndpointsProtocol=http;\\
    AccountName=devstoreaccount1;AccountKey=Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50u\\
    SRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==;\\
    QueueEndpoint=http://127.0.0.1:10001/devstoreaccount1;"
    export AZURE_QUEUE_NAME=jobs

    python examples/azure_worker.py --create-queue --send 5 --job-seconds 45

(The key is Azurite's published development key, not a secret.) With
``--job-seconds 45`` each job outlives the 30 s visibility timeout several
times over; start a second worker meanwhile and see that it gets nothing until
the first one is killed (``kill -9``), then gets the messages within 30 s.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys

from azure.core.exceptions import ResourceExistsError
from azure.storage.queue import QueueClient

from leasekeeper import Message, ReceiveError, Worker
from leasekeeper.backends.azure import AzureQueueBackend

log = logging.getLogger("azure_worker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--create-queue", action="store_true", help="create the queue first")
    parser.add_argument("--send", type=int, default=0, metavar="N", help="send N jobs first")
    parser.add_argument("--job-seconds", type=float, default=1.0, help="length of sent jobs")
    parser.add_argument("--concurrency", type=int, default=4, help="jobs run at once")
    parser.add_argument("--visibility-timeout", type=float, default=30.0)
    parser.add_argument("--timer-interval", type=float, default=1.0)
    parser.add_argument("--minimal-life", type=float, default=5.0)
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=20.0,
        help="on SIGTERM, how long running jobs may take before their messages are released",
    )
    parser.add_argument(
        "--until-idle",
        type=float,
        default=None,
        metavar="SECONDS",
        help="exit once the queue has been empty this long (default: run until SIGTERM)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        conn = os.environ["AZURE_STORAGE_CONNECTION_STRING"]
        queue_name = os.environ["AZURE_QUEUE_NAME"]
    except KeyError as missing:
        print(f"set {missing.args[0]} (see this script's docstring)", file=sys.stderr)
        return 2

    # retry_total=0: when the service is unreachable the Worker retries receives
    # itself with a short backoff, instead of the SDK's 15 s one.
    client = QueueClient.from_connection_string(conn, queue_name, retry_total=0)
    if args.create_queue:
        with contextlib.suppress(ResourceExistsError):  # it exists already: fine
            client.create_queue()
    for i in range(args.send):
        client.send_message(f"work:{args.job_seconds:g}")
        log.info("sent job %d", i)

    backend = AzureQueueBackend(client)

    def handle(message: Message) -> None:
        """One job. Runs on a handler thread while its lease is renewed."""
        lease = worker.manager.get(message)
        assert lease is not None, "the Worker registers every message before handling it"
        body = message.body if isinstance(message.body, str) else message.body.decode()
        if body == "fail":
            raise RuntimeError("this job always fails")
        seconds = float(body.split(":", 1)[1]) if body.startswith("work:") else 1.0
        log.info(
            "message %s: working %gs (receive #%d)", message.id, seconds, message.receive_count
        )
        steps = max(1, round(seconds / 0.1))
        for _ in range(steps):
            # Between steps: stop if the lease is gone - lost, or released by a
            # shutdown - because another worker may have the message now.
            if lease.lost.wait(seconds / steps):
                lease.check()  # raises LeaseLost: nothing is deleted
        log.info("message %s: done after %d extension(s)", message.id, lease.extensions)

    # Given the backend, the Worker makes its own LeaseManager from these settings
    # and closes it on shutdown, releasing (and signalling) what is still running.
    worker = Worker(
        backend,
        handle,
        concurrency=args.concurrency,
        batch_size=min(args.concurrency, 32),
        wait_seconds=2.0,  # Azure has no long poll: the backend re-polls within this
        shutdown_timeout=args.shutdown_timeout,
        visibility_timeout=args.visibility_timeout,
        timer_interval=args.timer_interval,
        minimal_life=args.minimal_life,
        release_delay=5.0,  # a failed job comes back after 5 s, then 10 s, 20 s, ...
        release_backoff=2.0,
    )
    try:
        stats = worker.run(until_idle=args.until_idle)  # handles SIGTERM/SIGINT
    except ReceiveError as exc:
        # Fatal (queue deleted, key refused): the worker let running jobs finish
        # and stopped; retrying would not help.
        log.error("stopped: cannot receive from %s: %s", queue_name, exc.detail)
        return 1
    finally:
        backend.close()
        client.close()
    log.info(
        "stopped: %d received, %d completed, %d failed, %d lost",
        stats.received,
        stats.completed,
        stats.failed,
        stats.lost,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
