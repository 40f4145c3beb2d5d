"""``leasekeeper stats URL``: how many messages a queue holds, from the shell.

One line a queue: visible (waiting for a worker), in flight (received, not yet
deleted), delayed, and the total, as the service counts them (``queue_counts()``:
approximate on SQS, MNS and Azure, exact on Redis) - "-" where the service does not
say (Azure counts only a total). Then the queue's dead-letter queue, where there is
one: SQS's redrive policy's ``deadLetterTargetArn``; on Azure ``<queue>-poison``
when it exists (the convention ``--dead-letter poison`` follows); or the queue
``--dead-letter URL|NAME`` names (leasekeeper worker's flag: MNS and Redis keep
none of their own). ``--json`` prints the same as one JSON object a line.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from leasekeeper.backends.contract import QueueCounts
from leasekeeper.backends.urls import redact_url
from leasekeeper.command._options import add_version_flag
from leasekeeper.command._queue_url import (
    EXIT_OK,
    EXIT_USAGE,
    Parser,
    add_queue_flags,
    connected,
    fail,
    reached,
)
from leasekeeper.command._reach import Doorbell
from leasekeeper.command._usage import UsageError, one_line
from leasekeeper.errors import LeaseError, ReceiveError

__all__ = ["dead_letter_queue", "main", "parser"]

PROG = "leasekeeper stats"
COLUMNS = ("visible", "in flight", "delayed", "total")


def parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="How many messages a queue holds (visible, in flight, delayed, total,\n"
        "as the service counts them), and its dead-letter queue's, where it has one.",
        epilog="examples:\n  leasekeeper stats sqs://jobs\n"
        "  leasekeeper stats 'redis://localhost:6379/0?stream=jobs' --dead-letter dead",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_flag(p)
    add_queue_flags(p)
    p.add_argument(
        "--dead-letter",
        metavar="URL|NAME",
        help="a dead-letter queue to count too: a URL, or the name of a queue beside it "
        "(default: the queue's own - SQS's redrive policy, Azure's <queue>-poison)",
    )
    p.add_argument("--json", action="store_true", help="one JSON object a queue, a line each")
    return p


def dead_letter_queue(backend: Any, named: str | None) -> tuple[Any, str] | None:
    """The dead-letter queue of ``backend`` and why it is that one, or None. Never
    creates a queue."""
    if named is not None:
        return _named(backend, named), "--dead-letter"
    policy = getattr(backend, "redrive_policy", None)
    if policy is not None:  # SQS
        target = (policy() or {}).get("deadLetterTargetArn")
        if not target:
            return None
        dead = backend.sibling(str(target).rsplit(":", 1)[-1], create=False)
        return dead, "the redrive policy"
    if hasattr(backend, "poison_queue"):  # Azure: the convention, where the queue exists
        poison = backend.sibling(f"{backend.queue_name}-poison", create=False)
        try:
            poison.queue_counts()
        except ReceiveError as exc:
            if exc.retryable:
                raise
            return None
        return poison, "<queue>-poison"
    return None


def _named(backend: Any, named: str) -> Any:
    """The queue ``--dead-letter`` names: a URL, or a name beside ``backend``."""
    if "://" in named:
        from leasekeeper.backends.registry import connect

        return connect(named)
    if named == "poison" and hasattr(backend, "poison_queue"):
        named = f"{backend.queue_name}-poison"
    sibling = getattr(backend, "sibling", None)
    if sibling is None:
        raise UsageError(f"--dead-letter {named}: {backend!r} cannot open a queue by name")
    return sibling(named, create=False)


def row(name: str, counts: QueueCounts, found_by: str = "") -> dict[str, Any]:
    """One queue's counts; ``found_by``: why a dead-letter queue is that one."""
    total = counts.total
    if total is None and None not in (counts.visible, counts.in_flight, counts.delayed):
        total = (counts.visible or 0) + (counts.in_flight or 0) + (counts.delayed or 0)
    return {
        "queue": name,
        "role": "dead letters" if found_by else "",
        "found_by": found_by,
        "visible": counts.visible,
        "in_flight": counts.in_flight,
        "delayed": counts.delayed,
        "total": total,
    }


def table(rows: list[dict[str, Any]]) -> str:
    def cell(value: object) -> str:
        return "-" if value is None else str(value)

    names = [f"{r['queue']}" + (f" ({r['role']})" if r["role"] else "") for r in rows]
    width = max(len("queue"), *(len(name) for name in names))
    lines = [f"{'queue':<{width}}  " + "  ".join(f"{c:>9}" for c in COLUMNS)]
    for name, r in zip(names, rows, strict=True):
        values = (r["visible"], r["in_flight"], r["delayed"], r["total"])
        lines.append(f"{name:<{width}}  " + "  ".join(f"{cell(v):>9}" for v in values))
    return "\n".join(lines)


def name_of(backend: Any, fallback: str) -> str:
    return str(getattr(backend, "queue_url", None) or redact_url(fallback))


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(format=f"{PROG}: %(message)s", level=logging.WARNING)
    doorbell = Doorbell()
    previous = signal.signal(signal.SIGINT, lambda signum, frame: doorbell.ring())
    try:
        backend = connected(args, doorbell, what="its counts")
        if backend is None:
            return EXIT_USAGE
        if not callable(getattr(backend, "queue_counts", None)):
            return fail(PROG, f"{backend!r} does not count its messages (no queue_counts())")
        counts = reached(backend.queue_counts, args, doorbell)
        if counts is None:
            return EXIT_USAGE
        rows = [row(name_of(backend, args.url), counts)]
        found = dead_letter_queue(backend, args.dead_letter)
        if found is not None:
            dead, why = found
            rows.append(row(name_of(dead, str(args.dead_letter)), dead.queue_counts(), why))
    except (UsageError, LeaseError, ValueError) as exc:
        return fail(PROG, one_line(exc) if not isinstance(exc, UsageError) else str(exc))
    finally:
        signal.signal(signal.SIGINT, previous)
    text = "\n".join(json.dumps(r) for r in rows) if args.json else table(rows)
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
    return EXIT_OK
