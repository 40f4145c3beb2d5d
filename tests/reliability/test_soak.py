"""Soak: two workers of 32 handler threads each, 100k messages, 5% transient faults, 10 min.

Run with ``make soak`` (deselected otherwise). ``LEASEKEEPER_SOAK_SECONDS`` and
``LEASEKEEPER_SOAK_MESSAGES`` shrink it for a trial. The figures are written to
``benchmarks/results/soak.json`` and quoted in docs/reliability.md.

What it checks, in real time with real threads:
- throughput, and that every message is deleted exactly once in the end;
- lapses (extends sent after a lease's deadline) are 0;
- leases lost == losses injected (lost answers + receipts gone stale);
- no message is handled by two handlers at once, except after an injected loss;
- leasekeeper's own memory (tracemalloc, leasekeeper's modules other than the
  MemoryQueue test tool) is flat between the first and the last minutes.
"""

from __future__ import annotations

import json
import os
import threading
import time
import tracemalloc
import zlib
from array import array
from pathlib import Path

import pytest

from leasekeeper import LeaseManager, Message, Worker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import Faults, FaultyBackend

SECONDS = float(os.environ.get("LEASEKEEPER_SOAK_SECONDS", "600"))
MESSAGES = int(os.environ.get("LEASEKEEPER_SOAK_MESSAGES", "100000"))
VISIBILITY = 5.0
TIMING = {"visibility_timeout": VISIBILITY, "timer_interval": 0.5, "minimal_life": 1.0}
RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "soak.json"


def _leasekeeper_bytes(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes allocated by leasekeeper's own code, not by the MemoryQueue test tool."""
    src = os.sep + "leasekeeper" + os.sep
    total = 0
    for stat in snapshot.statistics("filename"):
        name = stat.traceback[0].filename
        if src in name and not name.endswith(("memory.py", "faults.py")):
            total += stat.size
    return total


@pytest.mark.soak
@pytest.mark.timeout(int(SECONDS) + 600)  # the run itself, then the drain and checks
def test_soak() -> None:
    # No per-message history in the queue, and the bookkeeping below preallocated:
    # every tracemalloc snapshot walks all live traced blocks with the GIL held, so
    # state that grows with each message makes the snapshots themselves stall every
    # thread for longer and longer (half a second at 25k messages), and the stalls,
    # not leasekeeper, make extends late.
    queue = MemoryQueue(VISIBILITY, rotate_receipts=True, history=False)
    transient = Faults(retry=0.05)
    faulty = FaultyBackend(
        queue,
        seed=2026,
        extend=Faults(retry=0.05, lost=0.0005, stale=0.0005),
        delete=transient,
        release=transient,
        # The injector's own event log holds clock floats that tracemalloc charges to
        # leasekeeper/clock.py; keep it short so the memory figure is leasekeeper's.
        max_events=64,
    )
    lock = threading.Lock()
    # Indexed by job number ("job N"): handlers running it now, and runs finished.
    active = array("H", bytes(2 * MESSAGES))
    handled = array("H", bytes(2 * MESSAGES))
    overlaps = 0

    def handler(message: Message) -> None:
        nonlocal overlaps
        job = int(str(message.body).split()[1])
        with lock:
            if active[job]:
                overlaps += 1
            active[job] += 1
        # Mostly short jobs; one in fifty runs past the visibility timeout (7 s).
        spin = zlib.crc32(message.id.encode()) % 100
        try:
            time.sleep(7.0 if spin < 2 else 0.02 + spin / 500)
        finally:
            with lock:
                active[job] -= 1
                handled[job] = min(handled[job] + 1, 65535)

    managers = [LeaseManager(faulty, **TIMING, max_concurrency=16) for _ in range(2)]
    workers = [
        Worker(m, handler, concurrency=32, batch_size=10, wait_seconds=0.2) for m in managers
    ]
    tracemalloc.start(1)
    start = time.monotonic()
    sent = 0

    def produce() -> None:
        nonlocal sent
        # An even stream of MESSAGES over the first 90% of the run.
        span = SECONDS * 0.9
        while sent < MESSAGES:
            due = start + span * sent / MESSAGES
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(min(delay, 0.05))
                continue
            batch = min(50, MESSAGES - sent)
            queue.send_many([f"job {sent + i}" for i in range(batch)])
            sent += batch

    producer = threading.Thread(target=produce, name="soak-producer")
    producer.start()
    for worker in workers:
        worker.start()
    samples: list[tuple[float, int]] = []
    pauses: list[float] = []
    timeline: list[tuple[float, int, int]] = []
    while time.monotonic() - start < SECONDS:
        time.sleep(min(10.0, SECONDS / 20))
        t0 = time.monotonic()
        samples.append((t0 - start, _leasekeeper_bytes(tracemalloc.take_snapshot())))
        pauses.append(time.monotonic() - t0)  # the snapshot holds the GIL: report it
        st = [m.stats() for m in managers]
        timeline.append((round(t0 - start, 1), sum(s.lapses for s in st), sum(s.lost for s in st)))
    producer.join()
    drain_deadline = time.monotonic() + 120
    while len(queue) and time.monotonic() < drain_deadline:
        time.sleep(0.5)
    for worker in workers:
        worker.stop(timeout=30)
    elapsed = time.monotonic() - start
    tracemalloc.stop()
    stats = [m.stats() for m in managers]
    for manager in managers:
        manager.close()

    injected_losses = faulty.injected("lost", "extend") + faulty.injected("stale", "extend")
    lost = sum(s.lost for s in stats)
    lapses = sum(s.lapses for s in stats)
    completed = sum(w.stats.completed for w in workers)
    early = [b for t, b in samples if t <= SECONDS * 0.25]
    late = [b for t, b in samples if t >= SECONDS * 0.75]
    figures = {
        "seconds": round(elapsed, 1),
        "messages": MESSAGES,
        "handler_threads": 64,
        "completed": completed,
        "throughput_per_s": round(completed / elapsed, 1),
        "deleted": queue.deleted_count,
        "left_in_queue": len(queue),
        "lapses": lapses,
        "lost": lost,
        "injected_losses": injected_losses,
        "injected_transient": faulty.injected("retry"),
        "retries": sum(s.retries for s in stats),
        "handled_more_than_once": sum(1 for n in handled if n > 1),
        "never_handled": sum(1 for n in handled if n == 0),
        "concurrent_double_handling": overlaps,
        "send_lag_p99_ms": round(max(s.send_lag_p99 for s in stats) * 1000, 1),
        "leasekeeper_bytes_early": max(early) if early else None,
        "leasekeeper_bytes_late": max(late) if late else None,
        "snapshot_pause_max_s": round(max(pauses), 3) if pauses else None,
        "memory_samples": samples,
        "lapses_lost_timeline": timeline,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(figures, indent=2) + "\n")
    shown = {
        k: v for k, v in figures.items() if k not in ("memory_samples", "lapses_lost_timeline")
    }
    print(json.dumps(shown, indent=2))

    # A deleted record is gone from the queue, so MESSAGES deletes and an empty
    # queue mean each message was deleted exactly once.
    assert figures["left_in_queue"] == 0 and figures["deleted"] == MESSAGES
    assert figures["never_handled"] == 0
    assert lapses == 0
    assert lost == injected_losses
    assert overlaps <= injected_losses  # only where a loss made it unavoidable
    assert early and late
    # Flat: what leasekeeper holds late in the run is within 20% (+64 KiB) of early on.
    assert max(late) <= max(early) * 1.2 + 65536
