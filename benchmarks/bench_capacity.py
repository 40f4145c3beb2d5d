"""Measure 5: how many leases can be held with zero lapses.

Settings (issue #7): visibility 30 s, renewed when < 10 s remain, 50 ms per backend
call, max_concurrency 32, held for 10 minutes. A lapse is an extend sent after
the lease's own deadline (``stats().lapses``) or - refereed by the latency
wrapper, independently of the design - a message that became visible while
leased (an extend applied after its service-side deadline, or none at all).
Leases arrive as a steady stream over the first 20 s (the renewal period), as
they would from a worker's receive loop; a burst of N at one instant is a
different, harsher test (the first renewal then has all N due at once).

Theoretical limits: each lease needs one extend per 20 s; 32 connections at 50 ms
make 640 calls/s, so a no-batch backend can renew 640 * 20 = 12,800 leases *on
time* and a batch-10 backend 128,000. Past that, extends queue for a connection;
a lease renewed late is next due later too, so the queue settles instead of
growing, and leases only lapse once the wait exceeds the 10 s threshold: the
zero-lapse ceiling is about 640 * (30 - 0.05) = 19,168 (191,680 with batches of
10), reached with every extend up to ~10 s late. The rows report the largest
size tested with zero lapses and the longest any call waited for a connection.

Two methods, both reported:

- simulated (``ManualClock`` + ``LatencyBackend`` in simulated mode +
  ``SimPool``): the real LeaseManager code decides what to extend and when, on a
  driven clock; its dispatch pool is replaced by ``SimPool``, 32 simulated
  workers that each stay busy 50 ms per call, so a batch waits for a free worker
  exactly as it waits in the real ThreadPoolExecutor, and the manager's own
  "sent at" time is the moment the call really starts. Each call is applied at
  its end. This runs the full 10 minutes at sizes around the limits in seconds,
  but it does not charge Python's own CPU time or the GIL.
- real time: the threaded LeaseManager, its scheduler thread and 32 dispatch
  threads, with every call really sleeping 50 ms, on the system clock, for as long
  as the run allows (shorter than 10 minutes; stated in the row). This charges
  CPU, locks and the GIL but is too slow to search sizes with.

scan-every-tick is simulated the same way (it never batches, so on a batch-10
backend it has the no-batch limit). thread-per-message has no concurrency cap
(each thread is its own connection): its limit is the OS thread limit.
AutoLockRenewer runs in real time only (it reads the wall clock).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
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
    run_child,
    thread_limit,
)
from benchmarks.designs import AUTOLOCK, LABELS, LEASEKEEPER, SCAN, build
from benchmarks.latency import memory_backend
from benchmarks.simpool import SimPool
from leasekeeper.testing import ManualClock

NAME = "capacity"
TITLE = "5. capacity with zero lapses"
LATENCY = 0.05
CONCURRENCY = 32
RAMP = RENEW_EVERY  # leases arrive evenly over one renewal period
THEORY = {
    1: int(CONCURRENCY / LATENCY * RENEW_EVERY),
    10: int(CONCURRENCY / LATENCY * RENEW_EVERY * 10),
}
LATE_LIMIT = {b: int(CONCURRENCY / LATENCY * (VISIBILITY - LATENCY) * b) for b in (1, 10)}
TARGET = {1: 10_000, 10: 100_000}


def simulate(design: str, n: int, max_batch: int, minutes: float) -> dict[str, Any]:
    started = time.perf_counter()
    clock = ManualClock()
    backend = memory_backend(
        LATENCY,
        max_batch=max_batch,
        visibility=VISIBILITY,
        clock=clock,
        track_deadlines=True,
    )
    pool = SimPool(clock, CONCURRENCY, LATENCY)
    design_ = build(
        design,
        backend,
        visibility=VISIBILITY,
        threshold=THRESHOLD,
        timer_interval=TIMER_INTERVAL,
        max_concurrency=CONCURRENCY,
        clock=clock,
        executor=pool,  # the simulated pool (see benchmarks.simpool)
    )
    backend.inner.send_many(["x"] * n)
    start = clock.now()
    steps = 400
    given = 0
    for step in range(steps):
        want = n * (step + 1) // steps - given
        if want:
            for message in backend.receive(max_messages=want):
                design_.track(message)
            given += want
        clock.advance(RAMP / steps)
    clock.advance(start + minutes * 60.0 - clock.now())
    lapses = backend.finish()
    out: dict[str, Any] = {
        "design": design,
        "n": n,
        "max_batch": max_batch,
        "minutes": minutes,
        "visible_lapses": lapses,
        "extend_calls": backend.extend_calls,
        "max_queue_wait": pool.max_wait,
        "wall_seconds": round(time.perf_counter() - started, 2),
    }
    if design == LEASEKEEPER:
        out["manager_lapses"] = design_.manager.stats().lapses
    pool.shutdown(cancel_futures=True)
    design_.close()
    return out


def real(design: str, n: int, max_batch: int, seconds: float) -> dict[str, Any]:
    backend = memory_backend(
        LATENCY, max_batch=max_batch, visibility=VISIBILITY, track_deadlines=True
    )
    design_ = build(
        design,
        backend,
        visibility=VISIBILITY,
        threshold=THRESHOLD,
        timer_interval=TIMER_INTERVAL,
        max_concurrency=CONCURRENCY,
    )
    backend.inner.send_many(["x"] * n)
    cpu0 = time.process_time()
    t0 = time.monotonic()
    given = 0
    while given < n:
        elapsed = time.monotonic() - t0
        want = min(n, int(n * min(1.0, (elapsed + 0.05) / RAMP))) - given
        while want > 0:  # receives of at most 10, as SQS gives them
            got = backend.receive(max_messages=min(10, want))
            for message in got:
                design_.track(design_.prepare(message))
            given += len(got)
            want -= len(got)
        time.sleep(0.05)
    remaining = t0 + seconds - time.monotonic()
    if remaining > 0:
        time.sleep(remaining)
    lapses = backend.finish()
    out: dict[str, Any] = {
        "design": design,
        "n": n,
        "max_batch": max_batch,
        "seconds": seconds,
        "visible_lapses": lapses,
        "extend_calls": backend.extend_calls,
        "extend_entries": backend.extend_entries,
        "cpu_percent": 100.0 * (time.process_time() - cpu0) / (time.monotonic() - t0),
    }
    if design == LEASEKEEPER:
        stats = design_.manager.stats()
        out.update(
            manager_lapses=stats.lapses,
            scheduler_lag_p99=stats.scheduler_lag_p99,
            extend_latency_p99=stats.extend_latency_p99,
            margin_warnings=stats.margin_warnings,
        )
    design_.close()
    return out


def _search(design: str, batch: int, sizes: list[int], minutes: float) -> dict[str, Any]:
    runs = [
        run_child(
            "benchmarks.bench_capacity:simulate",
            design=design,
            n=n,
            max_batch=batch,
            minutes=minutes,
        )
        for n in sizes
    ]
    clean = [r["n"] for r in runs if r.get("visible_lapses") == 0 and not r.get("manager_lapses")]
    dirty = [r["n"] for r in runs if r.get("visible_lapses") or r.get("manager_lapses")]
    return {
        "runs": runs,
        "largest_clean": max(clean) if clean else None,
        "smallest_lapsing": min(dirty) if dirty else None,
    }


def _describe(search: dict[str, Any]) -> str:
    clean, dirty = search["largest_clean"], search["smallest_lapsing"]
    text = f">= {clean:,} (0 lapses)" if clean is not None else "no tested size was clean"
    if clean is not None:
        wait = next(r for r in search["runs"] if r.get("n") == clean)["max_queue_wait"]
        text += f", longest wait for a connection {fmt(wait, 's')}"
    if dirty is not None:
        lapses = next(r for r in search["runs"] if r.get("n") == dirty)["visible_lapses"]
        text += f"; lapses at {dirty:,} ({lapses:,})"
    errors = [r["error"] for r in search["runs"] if "error" in r]
    if errors:
        text += f"; errors: {errors}"
    return text


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    minutes = ctx.pick(2.0, 10.0)
    grids = {
        1: ctx.pick([10_000], [10_000, 12_800, 19_000, 20_000]),
        10: ctx.pick([100_000], [100_000, 150_000]),
    }
    scan_grid = ctx.pick([20_000], [10_000, 16_000, 20_000])
    real_seconds = ctx.pick(30.0, 90.0)
    real_plan = ctx.pick(
        [(LEASEKEEPER, 1, 10_000)],
        [(LEASEKEEPER, 1, 10_000), (LEASEKEEPER, 10, 100_000), (AUTOLOCK, 1, 10_000)],
    )

    def run_real(design: str, batch: int, n: int) -> dict[str, Any]:
        return run_child(
            "benchmarks.bench_capacity:real",
            timeout=real_seconds + 300,
            design=design,
            n=n,
            max_batch=batch,
            seconds=real_seconds,
        )

    # Quick mode runs the real-time check alongside the simulations (a harsher
    # setting for it: they take a core); the full run keeps them apart.
    with ThreadPoolExecutor(max_workers=1) as background:
        early = background.submit(run_real, *real_plan[0]) if ctx.quick else None
        sims = {b: _search(LEASEKEEPER, b, grid, minutes) for b, grid in grids.items()}
        scan = _search(SCAN, 10, scan_grid, minutes)
        reals = [early.result()] if early is not None else []
    reals += [run_real(*plan) for plan in real_plan[len(reals) :]]
    result.figures = {
        "simulated_minutes": minutes,
        "leasekeeper_simulated": {str(b): s for b, s in sims.items()},
        "scan_simulated_batch10": scan,
        "real_time": reals,
        "theoretical": THEORY,
    }
    limit = thread_limit()
    for batch in (1, 10):
        search = sims[batch]
        clean = search["largest_clean"]
        kind = "no-batch (MNS/Azure-like)" if batch == 1 else "batch-10 (SQS-like)"
        baselines = [
            f"theory: {THEORY[batch]:,} renewed on time, {LATE_LIMIT[batch]:,} renewed "
            "up to 10 s late"
        ]
        if batch == 10:
            baselines.append(f"{LABELS[SCAN]} (simulated, no batching): {_describe(scan)}")
        baselines.append(
            f"{LABELS['heartbeat']}: no concurrency cap, bounded by threads "
            f"(this machine: ~{limit:,})"
            if limit
            else f"{LABELS['heartbeat']}: bounded by threads"
        )
        result.rows.append(
            Row(
                measure=f"capacity, {kind}, simulated {minutes:g} min",
                leasekeeper=_describe(search),
                baselines="; ".join(baselines),
                ratio=(
                    f"{clean / THEORY[batch]:.0%} of on-time limit"
                    + (
                        f"; {fmt_ratio(ratio(clean, scan['largest_clean']))} "
                        "scan-every-tick's largest clean size"
                        if batch == 10 and clean and scan["largest_clean"]
                        else ""
                    )
                    if clean
                    else "n/a"
                ),
                target=f">= {TARGET[batch]:,}",
                met=None if clean is None else clean >= TARGET[batch],
                note="" if minutes >= 10 else "quick mode: shorter than the 10 min asked",
            )
        )
    for entry, (design, batch, n) in zip(reals, real_plan, strict=True):
        if "error" in entry:
            text = f"error: {entry['error']}"
            ok: bool | None = None
        else:
            lapses = entry["visible_lapses"] + entry.get("manager_lapses", 0)
            text = f"{lapses:,} lapses holding {n:,}; CPU {fmt(entry['cpu_percent'], '%')}" + (
                f"; lag p99 {fmt(entry['scheduler_lag_p99'] * 1000, 'ms')}"
                if "scheduler_lag_p99" in entry
                else ""
            )
            ok = lapses == 0
        mine = design == LEASEKEEPER
        result.rows.append(
            Row(
                measure=(
                    f"capacity check in real time, {'no-batch' if batch == 1 else 'batch-10'}, "
                    f"{n:,} leases, {real_seconds:g} s"
                ),
                leasekeeper=text if mine else "",
                baselines="" if mine else f"{LABELS[design]}: {text}",
                target=f"0 lapses at {TARGET[batch]:,}" if mine else "",
                met=ok if mine else None,
                note=(
                    f"real sleeps of 50 ms, {CONCURRENCY} threads; shorter than 10 min"
                    + ("; ran alongside the simulations" if ctx.quick and mine else "")
                ),
            )
        )
    return result
