"""Print the fault matrix's figures as a Markdown table (docs/reliability.md quotes it).

    .venv/bin/python -m tests.reliability.figures            # every case, seed 1
    .venv/bin/python -m tests.reliability.figures --queues rotating-b10,fixed-b1
    .venv/bin/python -m tests.reliability.figures --seed 2 --messages 120 --concurrency 40

Each row is one ManualClock run of ``tests/reliability/matrix.py``; the runs are
deterministic, so the same arguments print the same table on any machine
(apart from the wall-clock column).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time

from tests.reliability.matrix import SPIKE, Case, all_cases, run_case

COLUMNS = (
    ("fault", "{fault}"),
    ("queue", "{queue}"),
    ("lease h", "{lease_hours:.1f}"),
    ("extend calls", "{extend_calls}"),
    ("extended", "{extended}"),
    ("injected", "{injected}"),
    ("retries", "{retries}"),
    ("lost", "{lost}"),
    ("abandoned", "{abandoned}"),
    ("lapses", "{lapses}"),
    ("exposed", "{exposures}"),
    ("stolen", "{stolen_while_active}"),
    ("redelivered", "{redelivered}"),
    ("margin warn.", "{margin_warnings}"),
    ("violations", "{violations}"),
    ("wall s", "{wall_seconds:.2f}"),
)


def describe(case: Case) -> str:
    if case.kind == "none":
        return "none"
    if case.kind == "latency":
        return f"latency {case.rate * 5:g}s"
    if case.kind == "spike":
        return f"spike {case.rate:.0%} +{SPIKE:g}s"
    return f"{case.kind} {case.rate:.0%}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--messages", type=int, default=30)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument(
        "--queues", default="", help="comma-separated queue shapes, e.g. rotating-b10,fixed-b1"
    )
    args = parser.parse_args(argv)
    shapes = {name for name in args.queues.split(",") if name}
    logging.disable(logging.CRITICAL)  # thousands of expected warnings
    started = time.perf_counter()
    out = sys.stdout
    out.write("| " + " | ".join(name for name, _ in COLUMNS) + " |\n")
    out.write("|" + "---|" * len(COLUMNS) + "\n")
    failures = 0
    for case in all_cases(seed=args.seed, messages=args.messages, concurrency=args.concurrency):
        if shapes and case.queue.name not in shapes:
            continue
        run = run_case(case)
        values = vars(run.figures) | {
            "fault": describe(case),
            "queue": case.queue.name,
            "violations": len(run.checker.violations) + (0 if run.finished else 1),
        }
        failures += values["violations"]
        out.write("| " + " | ".join(fmt.format(**values) for _, fmt in COLUMNS) + " |\n")
    out.write(f"\n{time.perf_counter() - started:.1f}s in all\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
