"""The leasekeeper command: worker, send, stats, demo and config.

leasekeeper.command.worker, .send and .stats are those commands; this module
dispatches to them.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

from leasekeeper.command._options import (
    add_config_flags,
    add_version_flag,
    config_from,
    flag,
    number,
)
from leasekeeper.errors import ConfigError

DESCRIPTION = """\
Keep queue messages invisible while workers process them.

  leasekeeper worker MODULE:HANDLER --sqs URL  run a handler on a queue
  leasekeeper send URL BODY... | -             put messages on a queue
  leasekeeper stats URL                        count a queue's messages
  leasekeeper demo                             the trade it ends, in memory
  leasekeeper config --visibility-timeout 60   check a lease configuration

leasekeeper COMMAND --help says more."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="leasekeeper",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_version_flag(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser("demo", help="run the three-way comparison on the in-memory queue")
    demo.add_argument(
        "--seconds",
        type=number(float, 0, inclusive=False),
        default=30.0,
        help="wall time to scale the demo to (default: 30)",
    )
    demo.add_argument(
        "--svg", metavar="FILE", default=None, help="also write the timelines as an SVG picture"
    )
    demo.add_argument("-v", "--verbose", action="store_true", help="show leasekeeper's log")
    # Parsed by leasekeeper.command.worker (main() hands it over); listed here for --help.
    sub.add_parser(
        "worker",
        help="run MODULE:HANDLER on a queue's messages under leases (leasekeeper worker --help)",
        add_help=False,
    )
    sub.add_parser(
        "send",
        help="send messages to a queue, by URL (leasekeeper send --help)",
        add_help=False,
    )
    sub.add_parser(
        "stats",
        help="count a queue's messages, and its dead-letter queue's (leasekeeper stats --help)",
        add_help=False,
    )
    check = sub.add_parser(
        "config",
        help="check a lease configuration and show the values it derives",
        description="Check a lease configuration (the flags of leasekeeper worker's lease "
        "settings) and show every value, the derived ones included.",
    )
    add_config_flags(check)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        from leasekeeper.command.worker import main as worker_main

        return worker_main(argv[1:])
    if argv[:1] == ["send"]:
        from leasekeeper.command.send import main as send_main

        return send_main(argv[1:])
    if argv[:1] == ["stats"]:
        from leasekeeper.command.stats import main as stats_main

        return stats_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from leasekeeper.command.demo import run_demo

        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.ERROR,
            format="%(asctime)s %(threadName)s %(name)s: %(message)s",
        )
        outcomes = run_demo(args.seconds, svg=args.svg)
        if args.svg is not None:
            print(f"timelines written to {args.svg}")
        return 0 if outcomes[2].duplicates == 0 else 1
    try:
        config = config_from(args)
    except ConfigError as exc:
        print(f"leasekeeper config: invalid: {exc}", file=sys.stderr)
        return 2
    for name, value in dataclasses.asdict(config).items():
        shown = "unset" if value is None else value
        if name == "extend_threshold":  # the value in force, derived or adapted
            shown = {None: f"{config.threshold:g} (derived)"}.get(
                value, f"auto (starts at {config.threshold:g})" if value == "auto" else value
            )
        print(f"{flag(name):22} {shown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
