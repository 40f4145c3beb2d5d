"""Measure 3: scheduler CPU while N leases sit idle (none due).

In a fresh process per design: build N messages with a 1 h visibility, measure
the process's CPU time (all threads, ``time.process_time``) over a real-time
window with nothing registered (the idle baseline), register the N leases, let
them settle, and measure the same window again. The figure is
``(cpu - baseline) / window`` as a percentage of one core. Thread-per-message is
measured at the largest count this machine's thread limit allows comfortably.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from benchmarks.common import (
    BenchResult,
    Context,
    Row,
    fmt,
    fmt_ratio,
    ratio,
    run_child,
    synthetic_messages,
    thread_limit,
)
from benchmarks.designs import AUTOLOCK, HEARTBEAT, LABELS, LEASEKEEPER, SCAN, build
from benchmarks.latency import memory_backend

NAME = "idle_cpu"
TITLE = "3. scheduler CPU with idle leases"
VISIBILITY = 3600.0
TARGET_PERCENT = 1.0


def _cpu_over(window: float) -> float:
    start = time.process_time()
    time.sleep(window)
    return time.process_time() - start


def child(design: str, n: int, window: float, settle: float) -> dict[str, Any]:
    backend = memory_backend(0.0, visibility=VISIBILITY)
    messages = synthetic_messages(backend, n, now=time.monotonic(), visibility=VISIBILITY)
    gc.collect()
    base_window = min(window, 1.0)  # the idle process costs ~nothing: a shorter look will do
    baseline = _cpu_over(base_window) * window / base_window
    design_ = build(design, backend, visibility=VISIBILITY, threshold=10.0, timer_interval=1.0)
    prepared = [design_.prepare(m) for m in messages]
    t0 = time.perf_counter()
    for item in prepared:
        design_.track(item)
    register_seconds = time.perf_counter() - t0
    time.sleep(settle)
    gc.collect()
    busy = _cpu_over(window)
    design_.close()
    return {
        "n": n,
        "window": window,
        "baseline_cpu": baseline,
        "cpu": busy,
        "percent_core": 100.0 * max(0.0, busy - baseline) / window,
        "register_seconds": round(register_seconds, 2),
    }


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    n = 100_000
    window = ctx.pick(1.0, 10.0)
    limit = thread_limit() or 10_000
    sizes = {
        LEASEKEEPER: n,
        SCAN: n,
        AUTOLOCK: ctx.pick(10_000, n),
        HEARTBEAT: min(ctx.pick(2_000, 10_000), int(limit * 0.5)),
    }
    data = {
        design: run_child(
            "benchmarks.bench_idle_cpu:child",
            design=design,
            n=size,
            window=window,
            settle=ctx.pick(0.3, 2.0),
        )
        for design, size in sizes.items()
    }
    result.figures = data
    mine = data[LEASEKEEPER]
    if "error" in mine:
        result.error = mine["error"]
        return result
    parts, ratios = [], []
    for design in (HEARTBEAT, SCAN, AUTOLOCK):
        other = data[design]
        if "error" in other:
            parts.append(f"{LABELS[design]}: error {other['error']}")
            continue
        parts.append(f"{LABELS[design]}: {fmt(other['percent_core'], '%')} (n={other['n']:,})")
        if mine["percent_core"] > 0:
            ratios.append(
                f"{fmt_ratio(ratio(other['percent_core'], mine['percent_core']))} {design}"
            )
        else:
            ratios.append(f"{design}: leasekeeper's CPU was below the idle baseline's noise")
    result.rows.append(
        Row(
            measure=f"CPU with {n:,} idle leases ({window:g} s window, % of one core)",
            leasekeeper=fmt(mine["percent_core"], "%"),
            baselines="; ".join(parts),
            ratio="; ".join(ratios),
            target=f"<= {TARGET_PERCENT:g}% of one core",
            met=mine["percent_core"] <= TARGET_PERCENT,
        )
    )
    result.notes.append(
        "Idle CPU: process CPU time over the window minus the same process's idle "
        f"baseline; thread-per-message measured at n={sizes[HEARTBEAT]:,} (threads), "
        "its cost per lease is ~0 while idle (each thread blocks in Event.wait)."
    )
    return result
