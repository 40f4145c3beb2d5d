"""The ``leasekeeper`` command: ``demo``, ``config`` (check a configuration) and
``worker`` (run a handler on a queue: ``leasekeeper.worker_command``)."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Sequence

from leasekeeper.config import LeaseConfig
from leasekeeper.errors import ConfigError


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="leasekeeper", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the three-way comparison on the in-memory queue")
    demo.add_argument(
        "--seconds", type=_positive, default=30.0, help="wall time to scale the demo to (30)"
    )
    demo.add_argument(
        "--svg", metavar="FILE", default=None, help="also write the timelines as an SVG picture"
    )
    demo.add_argument("-v", "--verbose", action="store_true", help="show leasekeeper's log")
    # Parsed by leasekeeper.worker_command (main() hands it over); listed here for --help.
    sub.add_parser(
        "worker",
        help="run MODULE:HANDLER on a queue's messages under leases (leasekeeper worker --help)",
        add_help=False,
    )
    check = sub.add_parser("config", help="validate a LeaseConfig and show derived values")
    for f in dataclasses.fields(LeaseConfig):
        check.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["worker"]:
        from leasekeeper.worker_command import main as worker_main

        return worker_main(argv[1:])
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from leasekeeper.demo import run_demo

        logging.basicConfig(
            level=logging.INFO if args.verbose else logging.ERROR,
            format="%(asctime)s %(threadName)s %(name)s: %(message)s",
        )
        outcomes = run_demo(args.seconds, svg=args.svg)
        if args.svg is not None:
            print(f"timelines written to {args.svg}")
        return 0 if outcomes[2].duplicates == 0 else 1
    fields: dict[str, object] = {}
    for f in dataclasses.fields(LeaseConfig):
        raw = getattr(args, f.name)
        if raw is None:
            continue
        try:
            if f.name == "extend_threshold" and raw == "auto":
                fields[f.name] = raw
            else:
                fields[f.name] = int(raw) if f.name == "max_concurrency" else float(raw)
        except ValueError:
            fields[f.name] = raw  # let LeaseConfig say what is wrong with it
    try:
        config = LeaseConfig(**fields)  # type: ignore[arg-type]
    except ConfigError as exc:
        print(f"invalid: {exc}", file=sys.stderr)
        return 2
    for name, value in dataclasses.asdict(config).items():
        print(f"{name:20} {value}")
    print(f"{'threshold in force':20} {config.threshold:g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
