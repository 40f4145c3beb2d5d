"""Measure 4: backend calls per lease-hour with the same timeout settings.

Everything runs on a ``ManualClock``, so an hour of renewals is exact and takes
seconds: visibility 30 s, renewed when less than 10 s remain, timer 1 s, for
every design. Two arrival patterns:

- cohort: N leases received at the same instant (one receive burst), so every
  renewal has N leases due at once. The minimum is ceil(N / max_batch) calls
  per renewal, and leasekeeper must make exactly that many.
- staggered: N leases received evenly over 20 s (a steady stream), the common
  case, where a renewal has few leases due at any one moment.

Every extend call is logged as (time, entries). "Exactly the minimum" is checked
on every moment the design called the backend: calls == ceil(entries / max_batch).
scan-every-tick runs on the same clock and backend. thread-per-message and
AutoLockRenewer cannot run on a driven clock (they sleep in real threads); both
make one call per message per renewal, so their figures are computed:
thread-per-message extends every 20 s (3600/20 = 180 per lease-hour);
AutoLockRenewer renews when <= 10 s are left, checking each message every
>= 0.5 s, i.e. one call per 20-20.5 s (176-180 per lease-hour; 176 is used).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from benchmarks.common import (
    RENEW_EVERY,
    THRESHOLD,
    TIMER_INTERVAL,
    VISIBILITY,
    BenchResult,
    Context,
    Row,
    fmt,
    fmt_ratio,
    ratio,
)
from benchmarks.designs import LABELS, LEASEKEEPER, SCAN, build
from benchmarks.latency import memory_backend
from leasekeeper.backends.base import Handle
from leasekeeper.testing import ManualClock

NAME = "calls"
TITLE = "4. backend calls per lease-hour"
HOUR = 3600.0
TARGET_RATIO = 9.0
HEARTBEAT_PER_HOUR = HOUR / RENEW_EVERY
AUTOLOCK_PER_HOUR = HOUR / (RENEW_EVERY + 0.5)


def simulate(design: str, n: int, max_batch: int, pattern: str) -> dict[str, Any]:
    clock = ManualClock()
    backend = memory_backend(0.0, max_batch=max_batch, visibility=VISIBILITY, clock=clock)
    log: list[tuple[float, int]] = []

    def hook(sent: float, handles: Sequence[Handle], timeout: float) -> None:
        log.append((sent, len(handles)))

    backend.on_extend = hook
    design_ = build(
        design,
        backend,
        visibility=VISIBILITY,
        threshold=THRESHOLD,
        timer_interval=TIMER_INTERVAL,
        clock=clock,
    )
    backend.inner.send_many(["x"] * n)
    start = clock.now()
    registered: list[float] = []
    if pattern == "cohort":
        for message in backend.receive(max_messages=n):
            design_.track(message)
            registered.append(clock.now())
    else:
        gap = RENEW_EVERY / n
        for _ in range(n):
            (message,) = backend.receive(max_messages=1)
            design_.track(message)
            registered.append(clock.now())
            clock.advance(gap)
    end = start + HOUR
    clock.advance(end - clock.now())
    design_.close()
    lease_hours = sum(end - t for t in registered) / HOUR
    calls = len(log)
    entries = sum(size for _, size in log)
    by_moment: Counter[float] = Counter()
    calls_at: Counter[float] = Counter()
    for at, size in log:
        by_moment[at] += size
        calls_at[at] += 1
    excess = sum(
        max(0, calls_at[at] - math.ceil(total / max_batch)) for at, total in by_moment.items()
    )
    out: dict[str, Any] = {
        "n": n,
        "max_batch": max_batch,
        "pattern": pattern,
        "lease_hours": lease_hours,
        "calls": calls,
        "entries": entries,
        "calls_per_lease_hour": calls / lease_hours,
        "extends_per_lease_hour": entries / lease_hours,
        "moments": len(by_moment),
        "calls_above_minimum": excess,
        "lapses": backend.finish(),
    }
    if pattern == "cohort":
        rounds = len(by_moment)
        out["rounds"] = rounds
        out["minimum_calls"] = rounds * math.ceil(n / max_batch)
    if design == LEASEKEEPER:
        out["manager_lapses"] = design_.manager.stats().lapses
    return out


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    n_cohort = ctx.pick(123, 1234)
    n_stream = ctx.pick(200, 1000)
    data: dict[str, Any] = {}
    for batch in (10, 1):
        data[f"lk_cohort_b{batch}"] = simulate(LEASEKEEPER, n_cohort, batch, "cohort")
        data[f"lk_stream_b{batch}"] = simulate(LEASEKEEPER, n_stream, batch, "stream")
        data[f"scan_stream_b{batch}"] = simulate(SCAN, n_stream, batch, "stream")
    data["heartbeat_per_lease_hour_computed"] = HEARTBEAT_PER_HOUR
    data["autolock_per_lease_hour_computed"] = AUTOLOCK_PER_HOUR
    result.figures = data

    for batch in (10, 1):
        cohort = data[f"lk_cohort_b{batch}"]
        exact = cohort["calls"] == cohort["minimum_calls"] and cohort["calls_above_minimum"] == 0
        result.rows.append(
            Row(
                measure=(
                    f"calls per renewal, cohort of {n_cohort:,}, max_batch {batch} "
                    f"({cohort['rounds']} renewals in 1 h)"
                ),
                leasekeeper=(
                    f"{fmt(cohort['calls'] / max(1, cohort['rounds']))} per renewal "
                    f"({cohort['calls']:,} calls)"
                ),
                baselines=f"minimum ceil({n_cohort}/{batch}) = {math.ceil(n_cohort / batch)}",
                ratio=fmt_ratio(ratio(cohort["calls"], cohort["minimum_calls"]), "of minimum"),
                target="exactly ceil(due / max_batch) per renewal",
                met=exact,
            )
        )
    for batch in (10, 1):
        mine = data[f"lk_stream_b{batch}"]
        scan = data[f"scan_stream_b{batch}"]
        lk_rate = mine["calls_per_lease_hour"]
        ratios = {
            "heartbeat": ratio(HEARTBEAT_PER_HOUR, lk_rate),
            "scan": ratio(scan["calls_per_lease_hour"], lk_rate),
            "autolock": ratio(AUTOLOCK_PER_HOUR, lk_rate),
        }
        worst = min(r for r in ratios.values() if r is not None)
        sqs_like = batch == 10
        result.rows.append(
            Row(
                measure=f"calls per lease-hour, stream of {n_stream:,}, max_batch {batch}",
                leasekeeper=(
                    f"{fmt(lk_rate)} calls ({fmt(mine['extends_per_lease_hour'])} extends, "
                    f"{mine['calls_above_minimum']} calls above ceil(due/batch))"
                ),
                baselines=(
                    f"{LABELS['heartbeat']}: {fmt(HEARTBEAT_PER_HOUR)} (computed); "
                    f"{LABELS[SCAN]}: {fmt(scan['calls_per_lease_hour'])}; "
                    f"{LABELS['autolock']}: {fmt(AUTOLOCK_PER_HOUR)} (computed)"
                ),
                ratio="; ".join(f"{fmt_ratio(r)} fewer vs {k}" for k, r in ratios.items()),
                target=">= 9x fewer calls (SQS-like backend)" if sqs_like else "",
                met=(worst >= TARGET_RATIO and mine["calls_above_minimum"] == 0)
                if sqs_like
                else None,
                note="" if sqs_like else "no batch API: one call per lease per renewal",
            )
        )
    lapses = {k: v.get("lapses") for k, v in data.items() if isinstance(v, dict)}
    result.notes.append(f"Visible lapses in these runs (should all be 0): {lapses}")
    return result
