"""The status line of ``leasekeeper worker``: every ``--status-every`` seconds, one
line on stderr with the worker's figures (per queue, for a worker of several)."""

from __future__ import annotations

import logging
import sys
import threading
from typing import Any

__all__ = ["PROG", "StatusLine", "queues_text"]

PROG = "leasekeeper worker"


class StatusLine:
    """Writes the worker's status to stderr every ``every`` seconds, from a thread."""

    def __init__(self, worker: Any, every: float) -> None:
        self.worker = worker
        self.every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lag = (0.0, 0.0)  # the scheduler lag last read while the manager ran

    def line(self) -> str:
        manager = self.worker.manager
        in_flight = 0
        if not manager.closed:  # a closed renewer process has no figures to give
            stats = manager.stats()
            in_flight = stats.in_flight
            self._lag = (stats.scheduler_lag_p50, stats.scheduler_lag_p99)
        done = self.worker.stats
        p50, p99 = self._lag
        queues = ""
        if len(done.per_queue) > 1:  # done and failed per queue, in the queues' order
            queues = (
                " ("
                + ", ".join(
                    f"{name} {each.completed}/{each.failed}"
                    for name, each in done.per_queue.items()
                )
                + " done/failed)"
            )
        groups = ""
        if self.worker.intake.ordering.any:  # a FIFO queue: its groups, never by id
            groups = f", groups waiting {done.groups_waiting}, held back {done.held_back}"
        return (
            f"{PROG}: in flight {in_flight}, done {done.completed}, failed {done.failed}, "
            f"lost {done.lost}{groups}{queues}, scheduler lag p50 {p50 * 1000:.0f} ms "
            f"p99 {p99 * 1000:.0f} ms"
        )

    def start(self) -> None:
        if self.every > 0:
            self._thread = threading.Thread(
                target=self._run, name="leasekeeper-status", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.write()

    def write(self) -> None:
        try:
            sys.stderr.write(self.line() + "\n")
            sys.stderr.flush()
        except Exception as exc:  # a status line must never stop the worker
            logging.getLogger("leasekeeper.worker").debug("status line failed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def queues_text(worker: Any) -> str:
    """The worker's queue, or its queues with their weights."""
    sources = worker.intake.sources.all
    if len(sources) == 1:
        return repr(worker.backend)
    return ", ".join(f"{s.name} (weight {s.weight}) {s.backend!r}" for s in sources)
