"""``leasekeeper send URL BODY... | -``: put messages on a queue from the shell.

Each BODY is one message; ``-`` reads one message a line from stdin (empty lines
left out). ``--attribute NAME=VALUE`` (repeatable) sets message attributes where the
service carries them (SQS, Azure's none: refused), ``--group`` an SQS FIFO queue's
message group, ``--delay`` the seconds before a message is visible. The new
messages' ids go to stdout, one a line; a summary to stderr. Exit code 0 when every
message was sent, 1 when the service failed part-way (how many were sent is said),
2 for a usage error or a queue that cannot be used (as ``leasekeeper worker``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from leasekeeper.backends.urls import redact_url
from leasekeeper.command._options import add_version_flag, number
from leasekeeper.command._queue_url import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    add_queue_flags,
    connected,
    fail,
    reached,
)
from leasekeeper.command._reach import Doorbell
from leasekeeper.command._usage import UsageError
from leasekeeper.errors import LeaseError

__all__ = ["main", "parser"]

PROG = "leasekeeper send"

EXAMPLES = """\
examples:
  leasekeeper send sqs://jobs one two three          three messages
  seq 100 | leasekeeper send sqs://jobs -             a hundred, one a line
  leasekeeper send https://sqs.eu-west-1.amazonaws.com/123456789012/jobs.fifo \\
      --group customer-42 '{"order": 1}'             on a FIFO queue
  leasekeeper send 'redis://localhost:6379/0?stream=jobs' -a kind=report job"""


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Send messages to a queue: each BODY is one message, and - reads one\n"
        "message a line from stdin. The new messages' ids are printed, one a line.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_flag(p)
    add_queue_flags(p)
    p.add_argument("bodies", nargs="+", metavar="BODY", help="a message body, or - for stdin")
    p.add_argument(
        "-a",
        "--attribute",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a message attribute, on every message (repeatable; SQS, Redis)",
    )
    p.add_argument(
        "--group",
        metavar="GROUP",
        help="the message group of an SQS FIFO queue (its MessageGroupId); a FIFO queue needs one",
    )
    p.add_argument(
        "--delay",
        type=number(float, 0),
        default=0.0,
        metavar="S",
        help="seconds before each message is visible (SQS: up to 900; MNS; Azure)",
    )
    return p


def attributes_of(given: Sequence[str]) -> dict[str, str]:
    attributes: dict[str, str] = {}
    for item in given:
        name, equals, value = item.partition("=")
        if not equals or not name:
            raise UsageError(f"--attribute {item!r}: give it as NAME=VALUE")
        attributes[name] = value
    return attributes


def bodies_of(given: Sequence[str], stdin: Iterable[str]) -> Iterator[str]:
    """The bodies in order; ``-`` stands for stdin's lines (empty ones left out)."""
    for each in given:
        if each != "-":
            yield each
            continue
        for line in stdin:
            body = line.rstrip("\r\n")
            if body:
                yield body


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(format=f"{PROG}: %(message)s", level=logging.WARNING)
    doorbell = Doorbell()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: doorbell.ring())
    try:
        started = _start(args, doorbell)
    except (UsageError, LeaseError, ValueError) as exc:
        return fail(PROG, str(exc))
    finally:
        signal.signal(signal.SIGINT, previous)
    if started is None:
        return EXIT_USAGE  # interrupted while the queue could not be reached
    send, bodies = started
    count = 1
    try:
        for body in bodies:
            _say(send(body))
            count += 1
    except (LeaseError, ValueError) as exc:
        sys.stderr.write(f"{PROG}: stopped after {count} message(s): {exc}\n")
        return EXIT_FAILED
    except KeyboardInterrupt:
        sys.stderr.write(f"{PROG}: interrupted after {count} message(s)\n")
        return EXIT_FAILED
    sys.stderr.write(f"{PROG}: {count} message(s) sent to {redact_url(args.url)}\n")
    return EXIT_OK


def _start(
    args: argparse.Namespace, doorbell: Doorbell
) -> tuple[Callable[[str], str], Iterator[str]] | None:
    """Reach the queue and send the first message (tried again while the queue
    cannot be reached); returns how to send the next and the bodies left. None: a
    signal came meanwhile."""
    if args.bodies.count("-") > 1:
        raise UsageError("- (stdin) may be given once")
    attributes = attributes_of(args.attribute)
    backend = connected(args, doorbell, what="the messages sent")
    if backend is None:
        return None
    options = _send_options(backend, args)

    def send(body: str) -> str:
        return str(backend.send(body, attributes or None, **options))

    bodies = bodies_of(args.bodies, sys.stdin)
    first = next(bodies, None)
    if first is None:
        raise UsageError("nothing to send: stdin had no line")
    sent = reached(lambda: send(first), args, doorbell)
    if sent is None:
        return None
    _say(sent)
    return send, bodies


def _say(message_id: str) -> None:
    sys.stdout.write(f"{message_id}\n")
    sys.stdout.flush()


def _send_options(backend: Any, args: argparse.Namespace) -> dict[str, Any]:
    """``send``'s keywords: the delay, and for an SQS FIFO queue its group."""
    options: dict[str, Any] = {"delay": args.delay}
    fifo = getattr(backend, "fifo", None)
    if args.group is not None:
        if fifo is None:
            raise UsageError(f"--group: for SQS FIFO queues, and {backend!r} is not one")
        options["group_id"] = args.group
    elif fifo:
        raise UsageError(
            f"{backend.queue_url} is a FIFO queue: give each message a group (--group GROUP)"
        )
    if fifo and args.delay:
        raise UsageError("--delay: a FIFO queue takes no per-message delay")
    return options
