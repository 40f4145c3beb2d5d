"""``python -m benchmarks.run [--quick] [--only NAME ...]``: run the benchmarks, write the report.

Runs every measure (or those named) in this one run - leasekeeper and each
baseline side by side - then writes ``benchmarks/results/latest.json`` (machine,
every figure, every target with pass/miss) and ``latest.md`` (the table), and
prints the table. ``--quick`` runs the same code with smaller sizes (< 2 min).
A missed target is reported as missed; the exit status is 1 only when a
benchmark itself failed to run.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks import (
    bench_adaptive,
    bench_calls,
    bench_capacity,
    bench_cluster,
    bench_failover,
    bench_fifo,
    bench_idle_cpu,
    bench_lag,
    bench_memory,
    bench_queues,
    bench_register,
    bench_renewer,
    bench_sqs_path,
    bench_stream,
    bench_worker_calls,
)
from benchmarks.common import (
    REPO_ROOT,
    RESULTS_DIR,
    BenchResult,
    Context,
    machine_info,
    quiet_logs,
    yes_no,
)

BENCHMARKS: dict[str, tuple[str, Callable[[Context], BenchResult]]] = {
    mod.NAME: (mod.TITLE, mod.run)
    for mod in (
        bench_register,
        bench_memory,
        bench_idle_cpu,
        bench_calls,
        bench_capacity,
        bench_lag,
        bench_failover,
        bench_renewer,
        bench_worker_calls,
        bench_queues,
        bench_sqs_path,
        bench_adaptive,
        bench_stream,
        bench_cluster,
        bench_fifo,
    )
}
DOCS = REPO_ROOT / "docs" / "performance.md"
DOCS_START = "<!-- results:start -->"
DOCS_END = "<!-- results:end -->"
HEADER = ("measure", "leasekeeper", "baselines", "ratio", "target", "met?")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or "-"


def render_markdown(report: dict[str, Any]) -> str:
    m = report["machine"]
    lines = [
        f"# leasekeeper benchmarks ({report['mode']} run)",
        "",
        f"- date: {m['date']}; total {report['total_seconds']:.0f} s",
        f"- CPU: {m['cpu_model']}, {m['cores']} cores; load average at start: "
        f"{m['load_average_at_start']}",
        f"- Python {m['python']} ({m['implementation']}), {m['platform']}; "
        f"azure-servicebus {m['azure_servicebus']}",
        "- every figure in a row was measured in this same run; ratios are baseline / "
        "leasekeeper (higher = leasekeeper better)",
        *(
            f"- re-run on {rerun['date']} and spliced in: {', '.join(rerun['names'])}"
            for rerun in report.get("rerun") or ()
        ),
        "",
        "| " + " | ".join(HEADER) + " |",
        "|" + "---|" * len(HEADER),
    ]
    notes: list[str] = []
    for bench in report["benchmarks"]:
        if bench["error"]:
            lines.append(
                f"| {_cell(bench['title'])} | **did not run**: {_cell(bench['error'][:300])} "
                "| - | - | - | - |"
            )
        for row in bench["rows"]:
            measure = row["measure"] + (f" ({row['note']})" if row["note"] else "")
            lines.append(
                "| "
                + " | ".join(
                    _cell(x)
                    for x in (
                        measure,
                        row["leasekeeper"],
                        row["baselines"],
                        row["ratio"],
                        row["target"],
                        yes_no(row["met"]),
                    )
                )
                + " |"
            )
        notes.extend(f"{bench['title']}: {note}" for note in bench["notes"])
    missed = [t for t in report["targets"] if t["met"] is False]
    lines.append("")
    if missed:
        lines.append(f"**{len(missed)} target(s) missed:**")
        lines.extend(f"- {t['measure']}: {t['leasekeeper']} (target {t['target']})" for t in missed)
    else:
        lines.append("All targets met in this run.")
    if notes:
        lines += ["", "Notes:", *(f"- {note}" for note in notes)]
    lines += ["", "Method for each measure: docs/performance.md.", ""]
    return "\n".join(lines)


def update_docs(markdown: str) -> bool:
    """Replace the Results section of docs/performance.md with ``markdown``."""
    if not DOCS.exists():
        return False
    text = DOCS.read_text(encoding="utf-8")
    start, end = text.find(DOCS_START), text.find(DOCS_END)
    if start < 0 or end < start:
        return False
    body = markdown.split("\n", 1)[1]  # drop the top-level title
    DOCS.write_text(
        text[: start + len(DOCS_START)] + "\n" + body.strip() + "\n" + text[end:],
        encoding="utf-8",
    )
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (~9 min on 2 cores)")
    parser.add_argument(
        "--only", nargs="+", choices=sorted(BENCHMARKS), metavar="NAME",
        help=f"run only these: {', '.join(BENCHMARKS)}",
    )  # fmt: skip
    parser.add_argument("--output", type=Path, default=RESULTS_DIR, help="where latest.json/.md go")
    parser.add_argument(
        "--merge", action="store_true",
        help="with --only: replace those benchmarks in the existing latest.json, keep the rest",
    )  # fmt: skip
    parser.add_argument(
        "--update-docs", action="store_true",
        help="also write the table into docs/performance.md's Results section",
    )  # fmt: skip
    args = parser.parse_args(argv)
    quiet_logs()
    ctx = Context(quick=args.quick)
    names = [name for name in BENCHMARKS if not args.only or name in args.only]
    machine = machine_info()
    started = time.monotonic()
    results: list[BenchResult] = []
    for name in names:
        title, func = BENCHMARKS[name]
        print(f"[bench] {title} ...", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            result = func(ctx)
        except Exception:
            result = BenchResult(name, title, error=traceback.format_exc(limit=5))
        result.seconds = round(time.monotonic() - t0, 1)
        print(f"[bench] {title}: {result.seconds:.1f} s", file=sys.stderr, flush=True)
        results.append(result)
    benches = [r.as_dict() for r in results]
    rerun: list[dict[str, Any]] = []
    total = time.monotonic() - started
    if args.merge and (args.output / "latest.json").exists():
        # A re-run of some benchmarks spliced into the last report, in its order; the
        # report keeps the first run's machine info and says what was re-run, when.
        previous = json.loads((args.output / "latest.json").read_text(encoding="utf-8"))
        fresh = {b["name"]: b for b in benches}
        # Every splice is kept, oldest first (an older report holds one, as a dict).
        earlier = previous.get("rerun") or []
        rerun = [*(earlier if isinstance(earlier, list) else [earlier])]
        rerun.append({"names": sorted(fresh), "date": machine["date"]})
        machine, total = previous["machine"], previous["total_seconds"] + total
        kept = [fresh.pop(b["name"], b) for b in previous["benchmarks"]]
        benches = kept + list(fresh.values())
    targets = [
        {"benchmark": b["name"], **row}
        for b in benches
        for row in b["rows"]
        if row["met"] is not None
    ]
    report: dict[str, Any] = {
        "mode": "quick" if args.quick else "full",
        "only": args.only,
        "rerun": rerun or None,
        "machine": machine,
        "total_seconds": round(total, 1),
        "targets": targets,
        "targets_met": sum(t["met"] is True for t in targets),
        "targets_missed": sum(t["met"] is False for t in targets),
        "benchmarks": benches,
    }
    markdown = render_markdown(report)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "latest.json").write_text(
        json.dumps(report, indent=2, default=str) + "\n", encoding="utf-8"
    )
    (args.output / "latest.md").write_text(markdown, encoding="utf-8")
    if args.update_docs and not update_docs(markdown):
        print(f"[bench] could not update {DOCS} (markers missing)", file=sys.stderr)
    print(markdown)
    print(f"[bench] wrote {args.output / 'latest.json'} and latest.md", file=sys.stderr)
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    raise SystemExit(main())
