"""Measure 2: memory per in-flight lease, excluding the message (and its body).

The messages are built before measuring, so neither the Message object nor its
body is counted: only what the design adds to keep one message invisible.
Two methods, each in a fresh process per design:

- tracemalloc: Python allocations made while N leases are registered (for
  thread-per-message this misses the threads' native stacks);
- RSS: resident set growth of the process over the same registration, which does
  include thread stacks and allocator overhead (and is coarser).

AutoLockRenewer and scan-every-tick keep working while idle (re-queued tasks,
futures), so they are measured after a short settling time, as they sit.
For leasekeeper the run also checks what happens to *completed* leases: heap
entries are invalidated, not removed, so a completed Lease (and the Message and
body it references) stays reachable until the heap is next rebuilt.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
import weakref
from typing import Any

from benchmarks.common import (
    BenchResult,
    Context,
    Row,
    fmt,
    fmt_ratio,
    ratio,
    received_messages,
    rss_bytes,
    run_child,
    synthetic_messages,
    thread_limit,
)
from benchmarks.designs import AUTOLOCK, HEARTBEAT, LABELS, LEASEKEEPER, SCAN, build
from benchmarks.latency import memory_backend

NAME = "memory"
TITLE = "2. memory per in-flight lease"
VISIBILITY = 3600.0
TARGET_BYTES = 1024


def _measure(design: str, n: int, method: str, settle: float) -> dict[str, Any]:
    backend = memory_backend(0.0, visibility=VISIBILITY)
    messages = synthetic_messages(backend, n, now=time.monotonic(), visibility=VISIBILITY)
    design_ = build(design, backend, visibility=VISIBILITY, threshold=10.0, timer_interval=1.0)
    prepared = [design_.prepare(m) for m in messages]
    track = design_.track
    tokens: list[Any] = []
    gc.collect()
    if method == "tracemalloc":
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
    else:
        before = rss_bytes()
    for item in prepared:
        tokens.append(track(item))
    if design in (SCAN, AUTOLOCK, HEARTBEAT):
        time.sleep(settle)  # let pools/threads reach their idle steady state
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] if method == "tracemalloc" else rss_bytes()
    if method == "tracemalloc":
        tracemalloc.stop()
    design_.close()
    return {"n": n, "bytes_per_lease": (after - before) / n}


def child(design: str, n: int, settle: float = 1.0) -> dict[str, Any]:
    """RSS first (before tracemalloc has allocated anything), then tracemalloc."""
    out: dict[str, Any] = {"rss": _measure(design, n, "rss", settle)}
    gc.collect()
    out["tracemalloc"] = _measure(design, n, "tracemalloc", settle)
    if design == LEASEKEEPER:
        out["tracemalloc"].update(_retention(max(1000, n // 10), n))
    return out


def _retention(completed: int, in_flight: int) -> dict[str, Any]:
    """Complete ``completed`` leases while ``in_flight`` others stay; count survivors."""
    backend = memory_backend(0.0, visibility=VISIBILITY)
    design_ = build(LEASEKEEPER, backend, visibility=VISIBILITY, threshold=10.0, timer_interval=1.0)
    held = synthetic_messages(backend, in_flight, now=time.monotonic(), visibility=VISIBILITY)
    for message in held:
        design_.track(message)
    done = received_messages(backend, completed, VISIBILITY)
    refs = []
    for message in done:
        lease = design_.track(message)
        lease.complete()
        refs.append(weakref.ref(lease))
    del done, lease, message
    gc.collect()
    alive = sum(ref() is not None for ref in refs)
    design_.close()
    return {"retention_completed": completed, "retention_alive": alive}


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    n = ctx.pick(20_000, 100_000)
    limit = thread_limit() or 10_000
    sizes = {
        LEASEKEEPER: n,
        SCAN: n,
        AUTOLOCK: ctx.pick(5_000, n),  # its idle polling makes tracemalloc slow
        HEARTBEAT: min(ctx.pick(2_000, 10_000), int(limit * 0.5)),
    }
    data: dict[str, Any] = {}
    for design, size in sizes.items():
        got = run_child(
            "benchmarks.bench_memory:child", design=design, n=size, settle=ctx.pick(0.5, 1.0)
        )
        data[design] = got if "error" not in got else {"rss": got, "tracemalloc": got}
    result.figures = data
    if "error" in data[LEASEKEEPER]["rss"]:
        result.error = data[LEASEKEEPER]["rss"]["error"]
        return result

    def per(design: str, method: str) -> float | None:
        value = data[design][method].get("bytes_per_lease")
        return None if value is None else float(value)

    for method in ("tracemalloc", "rss"):
        mine = per(LEASEKEEPER, method)
        parts, ratios = [], []
        for design in (HEARTBEAT, SCAN, AUTOLOCK):
            other = per(design, method)
            if other is None:
                parts.append(f"{LABELS[design]}: error {data[design][method].get('error')}")
                continue
            parts.append(f"{LABELS[design]}: {fmt(other, 'B')} (n={data[design][method]['n']:,})")
            ratios.append(f"{fmt_ratio(ratio(other, mine))} vs {design}")
        result.rows.append(
            Row(
                measure=f"memory per lease ({method}, n={n:,})",
                leasekeeper=fmt(mine, "B"),
                baselines="; ".join(parts),
                ratio="; ".join(ratios),
                target=f"<= {TARGET_BYTES} B",
                met=None if mine is None else mine <= TARGET_BYTES,
            )
        )
    lk = data[LEASEKEEPER]["tracemalloc"]
    if "retention_alive" in lk:
        alive, total = lk["retention_alive"], lk["retention_completed"]
        result.rows.append(
            Row(
                measure=f"completed leases still reachable ({n:,} in flight)",
                leasekeeper=f"{alive:,} of {total:,}",
                note="stale heap entries keep Lease+Message+body alive until a heap rebuild",
            )
        )
    result.notes.append(
        "tracemalloc does not see thread stacks; RSS does (thread-per-message's cost "
        "is mostly there). RSS figures are coarse: the allocator may reuse freed arenas."
    )
    return result
