"""Measure 10: the adaptive margin (``extend_threshold="auto"``) against the static one.

Two scenarios, each run with the default static threshold (a third of the
visibility timeout) and with ``"auto"``, in one run; counted are lapses (the
manager's own count, plus the leases it reported lost) and extend calls per
lease-hour:

- slow calls: 200 leases at visibility 3 s on an SQS-like queue (receipts do not
  rotate, 10 a call), every extend taking 0.2 s and one in twenty 1.2 s - longer
  than the static 1 s margin, so those are answered after the deadline (the
  lease is lost: rule 5). (A small timescale, to fit a benchmark run.)
- CPU-bound handlers (real time): 300 leases at visibility 6 s, 20 ms calls, two
  threads spinning in pure Python beside the scheduler for the whole window.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from benchmarks.common import BenchResult, Context, Row, run_child

NAME = "adaptive"
TITLE = "10. adaptive margin: static vs auto"


def slow_calls(threshold: Any, window: float) -> dict[str, Any]:
    from leasekeeper import LeaseManager
    from leasekeeper.backends.memory import MemoryQueue
    from leasekeeper.testing import Faults, FaultyBackend

    queue = MemoryQueue(3.0, max_batch=10)
    backend = FaultyBackend(
        queue, seed=4, extend=Faults(latency=0.2, spike=0.05, spike_latency=1.0)
    )
    manager = LeaseManager(
        backend,
        visibility_timeout=3.0,
        timer_interval=0.5,
        minimal_life=0.5,
        extend_threshold=threshold,
        max_concurrency=32,
        jitter_seed=4,
    )
    queue.send_many(["x"] * 200)
    messages: list[Any] = []
    while len(messages) < 200:
        messages += backend.receive(max_messages=10, visibility_timeout=3.0)
    for message in messages:
        manager.register(message)
    time.sleep(window)
    stats = manager.stats()
    manager.close(release=False)
    backend.close()
    hours = 200 * window / 3600
    return {
        "lapses": stats.lapses,
        "lost": stats.lost,
        "calls_per_lease_hour": stats.extend_calls / hours,
        "threshold": stats.extend_threshold,
    }


def _burn(stop: threading.Event) -> None:
    while not stop.is_set():
        total = 0
        for i in range(20_000):
            total += i * i


def cpu_bound(threshold: Any, window: float) -> dict[str, Any]:
    from benchmarks.latency import memory_backend
    from leasekeeper import LeaseManager

    backend = memory_backend(0.02, max_batch=10, visibility=6.0)
    manager = LeaseManager(
        backend, visibility_timeout=6.0, timer_interval=0.5, extend_threshold=threshold
    )
    backend.inner.send_many(["x"] * 300)
    messages: list[Any] = []
    while len(messages) < 300:
        messages += backend.receive(max_messages=10, visibility_timeout=6.0)
    stop = threading.Event()
    burners = [threading.Thread(target=_burn, args=(stop,)) for _ in range(2)]
    for thread in burners:
        thread.start()
    try:
        for message in messages:
            manager.register(message)
        time.sleep(window)
    finally:
        stop.set()
        for thread in burners:
            thread.join()
    stats = manager.stats()
    manager.close(release=False)
    hours = 300 * window / 3600
    return {
        "lapses": stats.lapses,
        "lost": stats.lost,
        "calls_per_lease_hour": stats.extend_calls / hours,
        "threshold": stats.extend_threshold,
    }


def _cell(label: str, figures: dict[str, Any]) -> str:
    if "error" in figures:
        return f"{label}: error ({figures['error']})"
    return (
        f"{label}: {figures['lapses']} lapses, {figures['lost']} lost, "
        f"{figures['calls_per_lease_hour']:.1f} calls per lease-hour, "
        f"threshold {figures['threshold']:.2f} s"
    )


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    window = ctx.pick(15.0, 45.0)
    data: dict[str, dict[str, Any]] = {}
    for label, threshold in (("static", None), ("auto", "auto")):
        data[f"slow-{label}"] = run_child(
            "benchmarks.bench_adaptive:slow_calls", threshold=threshold, window=window
        )
        data[f"cpu-{label}"] = run_child(
            "benchmarks.bench_adaptive:cpu_bound", threshold=threshold, window=window
        )
    result.figures = data
    for scenario, title in (
        ("slow", f"slow calls (0.2 s, 5% at 1.2 s), 200 leases at 3 s, {window:g} s"),
        ("cpu", f"2 CPU-bound threads, 300 leases at 6 s, 20 ms calls, {window:g} s"),
    ):
        auto, static = data[f"{scenario}-auto"], data[f"{scenario}-static"]
        met = None
        if "error" not in auto and "error" not in static:
            met = auto["lapses"] + auto["lost"] <= static["lapses"] + static["lost"]
        result.rows.append(
            Row(
                measure=f"adaptive margin: {title}",
                leasekeeper=_cell("auto", auto),
                baselines=_cell("static", static),
                target="auto: no more lapses and losses than static",
                met=met,
            )
        )
    return result
