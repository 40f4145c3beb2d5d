"""What ``leasekeeper send`` and ``leasekeeper stats`` share: a queue by URL (any URL
``leasekeeper.connect`` takes), the SQS flags that go with it, and the one-line
error (exit code 2) of a queue that cannot be used.

The queue is reached as ``leasekeeper worker`` reaches it: a service that cannot be
reached is tried again for ``REACH_WITHIN`` seconds (``--wait-for`` S), then an error
naming its endpoint (docs/guide.md, "When a service cannot be reached").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from leasekeeper.backends.contract import Backend
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.backends.urls import redact_url
from leasekeeper.command._options import number
from leasekeeper.command._reach import Doorbell, reach
from leasekeeper.command._usage import UsageError, one_line
from leasekeeper.errors import ReceiveError
from leasekeeper.receiving import REACH_WITHIN

__all__ = ["EXIT_USAGE", "Parser", "add_queue_flags", "connected", "reached"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
T = TypeVar("T")


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (and exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def add_queue_flags(p: argparse.ArgumentParser) -> None:
    """``URL``, and ``--region``/``--endpoint-url`` for an SQS one."""
    p.add_argument(
        "url",
        metavar="URL",
        help="the queue, as leasekeeper.connect takes it: https://sqs.REGION.amazonaws.com/"
        "ACCOUNT/NAME, sqs://NAME, mns://HOST/QUEUE, azure://ACCOUNT/QUEUE, "
        "redis://HOST:PORT/DB?stream=S&group=G, or an installed plug-in's scheme "
        "(credentials from the environment, as leasekeeper worker --help says)",
    )
    sqs = p.add_argument_group("SQS")
    sqs.add_argument("--region", help="the queue's AWS region (default: as boto3 finds it)")
    sqs.add_argument(
        "--endpoint-url",
        metavar="URL",
        help="the SQS endpoint, for a local or private one (default: AWS_ENDPOINT_URL_SQS, "
        "else AWS_ENDPOINT_URL, else AWS's own)",
    )
    p.add_argument(
        "--wait-for",
        type=number(float, 0),
        default=REACH_WITHIN,
        metavar="S",
        help="how long to keep trying a service that cannot be reached before giving up "
        f"(default: {REACH_WITHIN:g})",
    )


def sqs_options(args: argparse.Namespace) -> dict[str, str]:
    """``--region`` and ``--endpoint-url`` for ``connect``: SQS's, refused with another
    service's URL."""
    options = {
        name: value
        for name, value in (("region", args.region), ("endpoint_url", args.endpoint_url))
        if value
    }
    scheme = args.url.partition("://")[0].lower()
    if options and scheme not in ("sqs", "http", "https"):
        flags = " and ".join(f"--{name.replace('_', '-')}" for name in options)
        raise UsageError(f"{flags}: for SQS queues, and {redact_url(args.url)!r} is not one")
    return options


def connected(args: argparse.Namespace, doorbell: Doorbell, *, what: str) -> Any:
    """The backend of ``args.url`` (None: a signal came while it was tried), with
    what the commands ask of it (``send``, ``queue_counts``) where it has them. An
    in-memory queue is refused: it lives in this process, and ``what`` it would
    take ends with it."""
    from leasekeeper.backends.registry import connect

    options = sqs_options(args)

    def attempt() -> Backend:
        try:
            backend: Backend = connect(args.url, **options)
        except (ReceiveError, UsageError):
            raise
        except ImportError as exc:  # names the package to install
            raise UsageError(one_line(exc)) from exc
        except Exception as exc:
            raise UsageError(f"{redact_url(args.url)}: {one_line(exc)}") from exc
        return backend

    backend = reached(attempt, args, doorbell)
    if isinstance(backend, MemoryQueue):
        raise UsageError(
            f"{args.url!r} is an in-memory queue: it lives only in this process, so {what} "
            "would end with it; give the URL of a queue on a service"
        )
    return backend


def reached(attempt: Callable[[], T], args: argparse.Namespace, doorbell: Doorbell) -> T | None:
    """``attempt()`` by ``reach``: tried again for ``--wait-for`` seconds while the
    service cannot be reached; a fatal ReceiveError is a UsageError naming the queue."""
    try:
        return reach(
            attempt, f"the queue {redact_url(args.url)}", within=args.wait_for, doorbell=doorbell
        )
    except ReceiveError as exc:
        raise UsageError(f"the queue {redact_url(args.url)} cannot be used: {exc}") from exc


def fail(prog: str, message: str, code: int = EXIT_USAGE) -> int:
    sys.stderr.write(f"{prog}: error: {message}\n")
    return code
