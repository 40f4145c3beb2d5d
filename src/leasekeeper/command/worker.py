"""``leasekeeper worker MODULE:HANDLER``: run a handler on a queue from the shell.

The command's parts: its parser (a man page of a ``--help``: every LeaseConfig
field is a flag, with the field's own description), loading the handler, building
the backend from a spec (``SQSSpec``, ``MNSSpec``, ``AzureQueueSpec``: credentials
from the environment), running it on a ``Worker`` or, for an ``async def``
handler, an ``AsyncWorker``, and a periodic status line. ``leasekeeper.command.cli``
dispatches ``worker`` here. Errors in what the user gave - a flag, the handler
path, a missing SDK, a queue that cannot be built - are one line on stderr and
exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import logging
import os
import re
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any, NoReturn

from leasekeeper.backends.contract import Backend
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.command._fleet import (
    check_fleet_flags,
    fleet_flags,
    serve_health,
    worker_options,
)
from leasekeeper.command._options import (
    add_config_flags,
    add_version_flag,
    config_from,
    glue_weights,
    in_flag_terms,
    number,
    weights,
)
from leasekeeper.command._reach import Doorbell, one_queue, queue_spelled, reach_queues
from leasekeeper.command._status import PROG, StatusLine, queues_text
from leasekeeper.command._usage import (
    UsageError,
    check_handler,
    is_async,
    load_handler,
    one_line,
)
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import ConfigError, LeaseError, ReceiveError

__all__ = [
    "UsageError",
    "build_backend",
    "check_handler",
    "check_queue",
    "load_handler",
    "main",
    "metrics_server",
    "parser",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

DESCRIPTION = """\
Run HANDLER on every message of a queue, each under a lease that leasekeeper
renews while the handler runs, so the queue can keep a short visibility timeout
(a crashed worker's messages come back quickly) and still run long jobs (no
second worker receives a message that is being handled).

HANDLER is called with one leasekeeper Message (.id, .body, .receive_count).
A normal return deletes the message; an exception releases it (visible again
after --release-delay); a lease lost meanwhile deletes nothing. The handler
reaches its lease with leasekeeper.current_lease(): .progress() for
--stall-timeout, .checkpoint(state) and raise leasekeeper.Rollover for
--on-cap rollover (a job longer than the service's cap). A plain
function runs on a Worker, --concurrency threads; an "async def" function on
an AsyncWorker, --concurrency coroutines on one event loop whose renewals and
service calls run off the loop.

The worker runs until SIGTERM or SIGINT (Ctrl-C): it stops receiving, lets the
running handlers finish (their leases still renewed) for up to
--shutdown-timeout seconds, sends the deletes it owes, releases whatever is
left so other workers get it at once, and exits 0; it says at once how many
handlers it waits for and for how long. A second signal skips the wait. Every
--status-every seconds it writes one status line to stderr."""

EPILOG = """\
environment:
  SQS (--sqs)      AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY
                   (AWS_SESSION_TOKEN for temporary credentials), or
                   AWS_PROFILE, or boto3's other sources (config files, an
                   instance or task role). The region: --region, else the one
                   in an amazonaws.com queue URL, else AWS_REGION, else
                   AWS_DEFAULT_REGION, else the config files. The endpoint:
                   --endpoint-url, else AWS_ENDPOINT_URL_SQS, else
                   AWS_ENDPOINT_URL.
  MNS (--mns)      MNS_ACCESS_KEY_ID, MNS_ACCESS_KEY_SECRET, and
                   MNS_SECURITY_TOKEN for temporary credentials.
  Azure (--azure)  AZURE_STORAGE_CONNECTION_STRING; or
                   AZURE_STORAGE_ACCOUNT_URL with AZURE_STORAGE_SAS_TOKEN or
                   AZURE_STORAGE_ACCOUNT_KEY, or with azure-identity's
                   DefaultAzureCredential when neither is set.
  --queue URL      the variables of the URL's service, as above (redis://: the
                   URL's password, or REDIS_PASSWORD).
  The renewer process (the default) reads the same variables.
  Credentials are never logged or shown.
  --scale-in-protection      ECS_AGENT_URI (ECS sets it in a task's container).
  --interruption-notice aws  AWS_EC2_METADATA_SERVICE_ENDPOINT (botocore's).

exit status:
  0  stopped by SIGTERM/SIGINT (or --until-idle) after a graceful shutdown
  1  stopped because the queue refused for good while the worker ran (it was
     deleted, the credentials were revoked): running handlers were let finish
  2  a usage error, found before anything is received: a bad flag or value, a
     handler that cannot be imported or cannot take one message, a missing SDK,
     missing credentials, a queue that does not exist or refuses the
     credentials; or a queue that cannot be reached (tried for 20 s, or
     --until-idle S), named by its endpoint's host:port

example:
  # jobs.py:  def handle(message): process(message.body)
  AWS_REGION=eu-west-1 leasekeeper worker jobs:handle \\
      --sqs https://sqs.eu-west-1.amazonaws.com/123456789012/jobs \\
      --concurrency 8 --visibility-timeout 60 --stall-timeout 600

  leasekeeper config --visibility-timeout 60 ...  checks a LeaseConfig alone."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Flags wrapped to the terminal (at most 88 columns, at least 60); the
    description and epilog are written to fit 80 columns as they stand."""

    def __init__(self, prog: str) -> None:
        columns = shutil.get_terminal_size((88, 24)).columns - 1
        super().__init__(prog, max_help_position=28, width=max(60, min(88, columns)))


# ------------------------------------------------------------------ the parser
#
# One function per group of flags; parser() calls them in order. A new flag goes in
# its group's function, with a type from command._options.number() when it is a
# number (so a bad value gets the message every number gets); main() reads it.


def queue_flags(p: argparse.ArgumentParser) -> None:
    group = p.add_argument_group(
        "queue (one kind of flag; repeat it for one worker on several queues)"
    )
    queue = group.add_mutually_exclusive_group(required=True)
    queue.add_argument(
        "--sqs", metavar="QUEUE_URL", action="append", help="an Amazon SQS queue, by its URL"
    )
    queue.add_argument(
        "--mns",
        nargs=2,
        action="append",
        metavar=("ENDPOINT", "QUEUE"),
        help="an Aliyun MNS queue: the account endpoint (http://ID.mns.REGION.aliyuncs.com) "
        "and the queue name",
    )
    queue.add_argument(
        "--azure", metavar="QUEUE", action="append", help="an Azure Storage queue, by its name"
    )
    queue.add_argument(
        "--queue",
        metavar="URL",
        action="append",
        help="any queue by URL, as leasekeeper.connect takes it: https://sqs.REGION."
        "amazonaws.com/ACCOUNT/NAME, sqs://NAME, mns://HOST/QUEUE, azure://ACCOUNT/QUEUE, "
        "redis://HOST:PORT/DB?stream=S&group=G, or an installed plug-in's scheme. Repeat it "
        "to run one worker on several queues (one pool of handlers, one renewer)",
    )
    group.add_argument(
        "--weights",
        type=weights,
        metavar="W,W,...",
        help="with several queues: how the receives are shared, one integer >= 1 a queue in "
        "their order (3,1: three receives from the first for one from the second, while "
        "both have messages; an empty queue never holds the others up). Default: equal",
    )


def sqs_flags(p: argparse.ArgumentParser) -> None:
    sqs = p.add_argument_group("SQS")
    sqs.add_argument(
        "--region",
        help="the queue's AWS region (default: the region in an amazonaws.com queue URL, "
        "else AWS_REGION, else AWS_DEFAULT_REGION, else the AWS configuration files)",
    )
    sqs.add_argument(
        "--endpoint-url",
        metavar="URL",
        help="the SQS endpoint, for a local or private one (default: AWS_ENDPOINT_URL_SQS, "
        "else AWS_ENDPOINT_URL, else AWS's own)",
    )


def worker_flags(p: argparse.ArgumentParser) -> None:
    run = p.add_argument_group("worker")
    run.add_argument(
        "--concurrency",
        type=number(int, 1),
        metavar="N",
        help="messages handled at once (default: 4 threads for a plain function, "
        "16 coroutines for an async one)",
    )
    run.add_argument(
        "--batch-size",
        type=number(int, 1),
        default=10,
        metavar="N",
        help="at most this many messages a receive call (default: 10, the most SQS allows)",
    )
    run.add_argument(
        "--wait-seconds",
        type=number(float, 0),
        default=1.0,
        metavar="S",
        help="a receive's long-poll wait (default: 1); longer waits make fewer calls on an "
        "idle queue but can hold up a shutdown by as much",
    )
    run.add_argument(
        "--shutdown-timeout",
        type=number(float, 0),
        default=30.0,
        metavar="S",
        help="how long a shutdown waits for running handlers before it releases their "
        "messages (default: 30)",
    )
    run.add_argument(
        "--until-idle",
        type=number(float, 0, inclusive=False),
        metavar="S",
        help="exit 0 once nothing was received and nothing ran for S seconds, whether the "
        "queue answers or not (exit 2 if it never did) (default: run until a signal)",
    )
    run.add_argument(
        "--renewer",
        choices=("thread", "process"),
        default=None,
        help="where renewals run: a process of their own (the default), which keeps "
        "renewing while a handler holds the GIL and releases this worker's messages at "
        "once if it is killed - when it cannot start, the worker says so and renews in "
        "a thread; or a thread of this process (--renewer thread)",
    )


def failure_flags(p: argparse.ArgumentParser) -> None:
    dead = p.add_argument_group("poison messages")
    dead.add_argument(
        "--dead-letter",
        metavar="URL|NAME",
        help="where a message goes once it failed --max-receives times (default 5 with "
        "this flag): copied there, then deleted from its queue. A queue URL, or the name "
        "of a queue on the same service (on Azure, 'poison' is <queue>-poison, created "
        "if missing). Without it, failing messages are retried with growing delays, and "
        "left to the queue's own redrive policy if it has one",
    )


def lease_flags(p: argparse.ArgumentParser) -> None:
    add_config_flags(
        p.add_argument_group(
            "lease settings (the LeaseConfig fields; seconds unless said otherwise)"
        )
    )


def output_flags(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("output")
    out.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        default="info",
        help="leasekeeper's and the handler's log on stderr (default: info)",
    )
    out.add_argument(
        "--status-every",
        type=number(float, 0),
        default=30.0,
        metavar="S",
        help="write a status line to stderr every S seconds: messages in flight, done, "
        "failed, lost, and the scheduler's lag (default: 30; 0: never)",
    )
    out.add_argument(
        "--metrics-port",
        type=number(int, 1),
        metavar="PORT",
        help="serve Prometheus metrics at http://ADDR:PORT/metrics (needs leasekeeper[prometheus])",
    )
    out.add_argument(
        "--metrics-addr",
        default="127.0.0.1",
        metavar="ADDR",
        help="the address --metrics-port binds (default: 127.0.0.1, this machine only; "
        "0.0.0.0 for a scraper in another container or host)",
    )


FLAG_GROUPS: tuple[Callable[[argparse.ArgumentParser], None], ...] = (
    queue_flags,
    sqs_flags,
    worker_flags,
    lease_flags,
    failure_flags,
    fleet_flags,
    output_flags,
)


def parser() -> argparse.ArgumentParser:
    """The parser of ``leasekeeper worker``."""
    p = _Parser(
        prog=PROG,
        usage=(
            f"{PROG} MODULE:HANDLER\n"
            "         (--queue URL [--queue URL ... [--weights W,W,...]] |\n"
            "          --sqs QUEUE_URL ... | --mns ENDPOINT QUEUE ... | --azure QUEUE ...)\n"
            "         [options]"
        ),
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    add_version_flag(p)
    p.add_argument(
        "handler",
        metavar="MODULE:HANDLER",
        help="the handler: a module importable from the current directory or PYTHONPATH, "
        "a colon, and the name of a callable in it (jobs:handle, or jobs:Jobs.handle) "
        "that takes one message",
    )
    for add_flags in FLAG_GROUPS:
        add_flags(p)
    return p


# ------------------------------------------------------------------ the parts


_AWS_HOST = re.compile(r"^(?:https?://)?sqs[.-]([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?(?:/|$)")

SQS_CREDENTIALS = (
    "--sqs found no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
    "(and AWS_SESSION_TOKEN for temporary ones), or AWS_PROFILE for a profile of "
    "~/.aws/credentials"
)
SQS_NO_REGION = (
    "--sqs found no AWS region: pass --region, or set AWS_REGION (or AWS_DEFAULT_REGION)"
)


def sqs_region(args: argparse.Namespace) -> str | None:
    """--region, else the region an amazonaws.com URL names (the queue lives there,
    whatever the environment says), else AWS_REGION, else AWS_DEFAULT_REGION; None
    leaves it to the AWS configuration files."""
    if args.region:
        return str(args.region)
    match = _AWS_HOST.match(one_queue(args).sqs)
    if match:
        return match.group(1)
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def sqs_endpoint(args: argparse.Namespace) -> str | None:
    """--endpoint-url, else AWS_ENDPOINT_URL_SQS, else AWS_ENDPOINT_URL."""
    endpoint = (
        args.endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_SQS")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    return str(endpoint) if endpoint else None


def _sqs_spec(args: argparse.Namespace) -> Any:
    from leasekeeper.backends.sqs import SQSSpec

    # Imported after the backend's module, whose ImportError names the extra to install.
    boto3 = importlib.import_module("boto3")
    session = boto3.session.Session(region_name=sqs_region(args))
    if session.region_name is None:
        raise UsageError(SQS_NO_REGION)
    if session.get_credentials() is None:
        raise UsageError(SQS_CREDENTIALS)
    return SQSSpec(args.sqs, region=session.region_name, endpoint_url=sqs_endpoint(args))


def sqs_options(args: argparse.Namespace, url: str) -> dict[str, str]:
    """``--region`` and ``--endpoint-url`` for ``connect(url)``: they are SQS's, and a
    URL of another service refuses them."""
    options = {
        name: value
        for name, value in (("region", args.region), ("endpoint_url", args.endpoint_url))
        if value
    }
    scheme = url.partition("://")[0].lower()
    if options and scheme not in ("sqs", "http", "https"):
        flags = " and ".join(f"--{name.replace('_', '-')}" for name in options)
        raise UsageError(f"{flags}: for SQS queues, and {url!r} is not one")
    return options


def build_backend(args: argparse.Namespace) -> Backend:
    """The backend the queue flags name, from its spec (credentials from the
    environment): a missing credential or region is a UsageError naming what to set."""
    args = one_queue(args)
    try:
        if getattr(args, "queue", None) is not None:
            from leasekeeper.backends.registry import connect

            url = args.queue[0] if isinstance(args.queue, list) else args.queue
            return connect(url, **sqs_options(args, url))
        if args.sqs is not None:
            spec: Any = _sqs_spec(args)
        elif args.mns is not None:
            from leasekeeper.backends.mns import MNSSpec

            _require_env("--mns", ["MNS_ACCESS_KEY_ID", "MNS_ACCESS_KEY_SECRET"])

            spec = MNSSpec(endpoint=args.mns[0], queue_name=args.mns[1])
        else:
            from leasekeeper.backends.azure import AzureQueueSpec

            if not os.environ.get("AZURE_STORAGE_ACCOUNT_URL"):
                _require_env("--azure", ["AZURE_STORAGE_CONNECTION_STRING"], or_else=AZURE_ELSE)
            spec = AzureQueueSpec(
                args.azure, account_url=os.environ.get("AZURE_STORAGE_ACCOUNT_URL") or None
            )
        backend: Backend = spec.build()
    except (ImportError, UsageError) as exc:  # ImportError: names the extra to install
        raise UsageError(one_line(exc)) from exc
    except Exception as exc:
        raise UsageError(f"cannot set up the queue: {one_line(exc)}") from exc
    return backend


QUEUE_HINTS = {
    "sqs": "check the queue URL, the region (--region, AWS_REGION) and the credentials",
    "mns": "check the endpoint, the queue name, MNS_ACCESS_KEY_ID and MNS_ACCESS_KEY_SECRET",
    "azure": "check the queue name and the storage account's credentials",
    "queue": "check the URL and its service's credentials",
}


def check_queue(args: argparse.Namespace, backend: Backend) -> None:
    """Ask the service about the queue once, before the first receive: a queue that
    does not exist, or credentials it refuses, are a UsageError; a service that
    cannot be reached raises its retryable ReceiveError (``reach`` tries again)."""
    if isinstance(backend, MemoryQueue):  # nothing to ask; but say what it cannot do
        logging.getLogger("leasekeeper.worker").warning(
            "%r is an in-memory queue: it lives only in this process (nothing else can "
            "send to it; what is left in it is gone when the worker ends)",
            backend,
        )
        return
    kind = "sqs" if args.sqs is not None else "mns" if args.mns is not None else "azure"
    if getattr(args, "queue", None):
        kind = "queue"
    try:
        read_queue(backend)
    except ReceiveError as exc:
        if exc.retryable:
            raise
        raise UsageError(
            f"the queue {queue_spelled(args, backend)} cannot be used: {one_line(exc)} "
            f"({QUEUE_HINTS[kind]})"
        ) from exc


def read_queue(backend: Any) -> None:
    """One read of the queue's attributes, failing as a receive would (ReceiveError)."""
    if hasattr(backend, "queue_visibility_timeout"):  # SQS, MNS
        backend.queue_visibility_timeout()
        return
    counts = getattr(backend, "queue_counts", None)
    if callable(counts):  # Azure (one attempt), Redis, a plug-in's
        counts()


AZURE_ELSE = (
    "or AZURE_STORAGE_ACCOUNT_URL (with AZURE_STORAGE_SAS_TOKEN or AZURE_STORAGE_ACCOUNT_KEY, "
    "or azure-identity's DefaultAzureCredential)"
)


def _require_env(flag: str, names: list[str], *, or_else: str = "") -> None:
    missing = [name for name in names if not os.environ.get(name)]
    if missing:
        alternative = f" {or_else}" if or_else else ""
        raise UsageError(
            f"{flag} needs {' and '.join(names)} in the environment{alternative}; "
            f"not set: {', '.join(missing)}"
        )


def metrics_server() -> Callable[..., Any]:
    """``leasekeeper.prometheus.serve_metrics``, which ``--metrics-port`` calls as
    ``serve_metrics(worker, port, addr=..., backlog_every=...)`` once the worker exists
    (its manager's metrics, its figures per queue, its backlog); whatever it
    returns is closed (``close()``, ``shutdown()`` or ``stop()``) when the worker stops."""
    try:
        module = importlib.import_module("leasekeeper.prometheus")
        serve: Callable[..., Any] = module.serve_metrics
    except (ImportError, AttributeError) as exc:
        raise UsageError(f"--metrics-port: {one_line(exc)}") from exc
    return serve


# ------------------------------------------------------------------ running


SDK_LOGGERS = ("boto3", "botocore", "urllib3", "azure", "mns")


def _fail(message: str) -> int:
    sys.stderr.write(f"{PROG}: error: {message}\n")
    return EXIT_USAGE


def main(argv: Sequence[str] | None = None) -> int:
    """``leasekeeper worker ...``; returns the exit code."""
    args = parser().parse_args(glue_weights(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.log_level != "debug":  # the SDKs' chatter ("Found credentials in ...")
        for sdk in SDK_LOGGERS:
            logging.getLogger(sdk).setLevel(logging.WARNING)
    # A signal before the worker runs (while importing the handler, say) ends the
    # command as quietly as one while it runs.
    early: list[int] = []
    doorbell = Doorbell()

    def noted(signum: int, frame: FrameType | None) -> None:
        early.append(signum)
        doorbell.ring()

    previous = {sig: signal.signal(sig, noted) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        try:
            # Everything that can be found out before the first receive, is.
            serve_metrics = metrics_server() if args.metrics_port is not None else None
            check_fleet_flags(args)
            handler = load_handler(args.handler)
            check_handler(handler, args.handler)
            config = config_from(args)
            backends = reach_queues(args, built_and_checked, doorbell)
            if backends is None:
                logging.getLogger("leasekeeper.worker").info(
                    "signal %d before the worker started: not starting", early[0]
                )
                return EXIT_OK
            asynchronous = is_async(handler)
            worker = _make_worker(args, backends, handler, config, is_async=asynchronous)
        except (UsageError, LeaseError) as exc:
            return _fail(str(exc))
        return _run(args, worker, early, serve_metrics, is_async=asynchronous)
    finally:
        for sig, before in previous.items():
            signal.signal(sig, before)
        doorbell.close()


def built_and_checked(args: argparse.Namespace) -> Backend:
    """The backend of one queue's ``args``, asked about once (``check_queue``)."""
    backend = build_backend(args)
    try:
        check_queue(args, backend)
    except BaseException:
        close = getattr(backend, "close", None)
        if callable(close):
            close()
        raise
    return backend


def _make_worker(
    args: argparse.Namespace,
    backends: list[Backend],
    handler: Callable[..., object],
    config: LeaseConfig,
    *,
    is_async: bool,
) -> Any:
    common: dict[str, Any] = {
        "batch_size": args.batch_size,
        "wait_seconds": args.wait_seconds,
        "shutdown_timeout": args.shutdown_timeout,
        "config": config,
        # Unless told: the renewer process, or a thread when it cannot start (a warning).
        "renewer": args.renewer or "auto",
        "dead_letter": args.dead_letter,
        **worker_options(args),  # ECS protection, interruption notices
    }
    if args.concurrency is not None:
        common["concurrency"] = args.concurrency
    queues: Backend | list[Backend] = backends[0]
    if len(backends) > 1:
        queues, common["weights"] = backends, args.weights
    try:
        if is_async:
            from leasekeeper.aio import AsyncWorker

            return AsyncWorker(queues, handler, **common)  # type: ignore[arg-type]
        from leasekeeper.worker import Worker

        return Worker(queues, handler, **common)
    except (ValueError, TypeError, LeaseError) as exc:
        raise UsageError(in_flag_terms(one_line(exc))) from exc


def _serve(serve_metrics: Callable[..., Any], args: argparse.Namespace, worker: Any) -> Any:
    """``--metrics-port``'s server; one that cannot be served is a usage error."""
    try:
        return serve_metrics(
            worker,
            args.metrics_port,
            addr=args.metrics_addr,
            backlog_every=args.backlog_every or None,
        )
    except Exception as exc:
        where = f"{args.metrics_addr}:{args.metrics_port}"
        raise UsageError(f"cannot serve metrics on {where}: {one_line(exc)}") from exc


def _run(
    args: argparse.Namespace,
    worker: Any,
    early: list[int],
    serve_metrics: Callable[..., Any] | None,
    *,
    is_async: bool,
) -> int:
    log = logging.getLogger("leasekeeper.worker")
    status = StatusLine(worker, args.status_every)
    server = probes = None
    try:
        try:
            if serve_metrics is not None:
                server = _serve(serve_metrics, args, worker)
            probes = serve_health(args, worker)
        except UsageError as exc:
            return _fail(str(exc))
        if early:
            log.info("signal %d before the worker started: not starting", early[0])
            return EXIT_OK
        log.info(
            "%s running %s on %s, concurrency %d, renewer %s",
            type(worker).__name__,
            args.handler,
            queues_text(worker),
            worker.concurrency,
            worker.manager.renewer.name,
        )
        status.start()
        try:
            if is_async:
                asyncio.run(worker.run(until_idle=args.until_idle))
            else:
                worker.run(until_idle=args.until_idle)
        except ReceiveError as exc:
            if exc.retryable:  # a queue never reached: as at start (docs/guide.md)
                return _fail(f"cannot reach the queue: {exc}")
            sys.stderr.write(f"{PROG}: stopped: the queue refused for good: {exc}\n")
            return EXIT_FAILED
        except ConfigError as exc:  # the renewer process could not build its backend
            return _fail(str(exc))
        return EXIT_OK
    finally:
        status.stop()
        if status.every > 0:
            status.write()  # the final figures
        if worker.manager is not None and not worker.manager.closed:
            worker.manager.close()
        if probes is not None:
            probes.close()
        for stop in ("close", "shutdown", "stop"):
            method = getattr(server, stop, None)
            if callable(method):
                method()
                break
