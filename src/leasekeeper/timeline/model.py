"""What happened to each job, on which worker, when: the data a timeline draws.

A ``Timeline`` collects *runs*: one job (a message) processed by one worker from
the moment it received the message until the run ended - completed (deleted),
crashed, refused (the work was done but the delete was refused: somebody else
had the message by then) or cut off (still running when the picture was taken).
A run carries its renewals, and whether it was a *duplicate* (it started while
another live worker was processing the same job) or a *re-delivery* (it started
after a crash dropped the job). ``TimelineObserver`` adds the renewals a
``LeaseManager`` makes. Times are seconds since ``Timeline.origin`` on the
monotonic clock; every method is thread-safe.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from leasekeeper.observers import Observer

if TYPE_CHECKING:
    from leasekeeper.record import LeaseRecord

__all__ = ["ENDINGS", "Run", "Timeline", "TimelineObserver", "lanes"]

#: How a run ends: "running" until it does.
ENDINGS = ("running", "completed", "crashed", "refused", "cut off")


@dataclass
class Run:
    """One job on one worker, from receipt to its end (see the module docstring)."""

    job: str
    worker: str
    start: float
    end: float | None = None
    ending: str = "running"
    duplicate: bool = False
    redelivery: bool = False
    renewals: list[float] = field(default_factory=list)

    def last(self, now: float) -> float:
        """Where the run ends on the picture: its end, or ``now`` while it runs."""
        return self.end if self.end is not None else now


@dataclass
class Timeline:
    """The runs of one scenario. ``horizon`` is how long the picture's time axis is
    (seconds); ``unit`` the seconds per tick of it; ``summary`` a line of figures the
    pictures show under the title; ``names`` what to call a job (by message id) on
    the picture."""

    title: str
    horizon: float
    unit: float = 1.0
    summary: str = ""
    origin: float = field(default_factory=time.monotonic)
    runs: list[Run] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)
    marks: list[tuple[float, str]] = field(default_factory=list)  # (when, what): a crash, ...
    finished: float | None = None  # when the scenario stopped (seconds since origin)
    _lock: threading.Lock = field(
        default_factory=threading.Lock, init=False, repr=False, compare=False
    )

    def now(self) -> float:
        return time.monotonic() - self.origin

    def start_run(
        self,
        job: str,
        worker: str,
        *,
        duplicate: bool = False,
        redelivery: bool = False,
        at: float | None = None,
    ) -> Run:
        run = Run(
            job,
            worker,
            self.now() if at is None else at,
            duplicate=duplicate,
            redelivery=redelivery,
        )
        with self._lock:
            self.runs.append(run)
        return run

    def end_run(self, run: Run, ending: str, *, at: float | None = None) -> None:
        if ending not in ENDINGS[1:]:
            raise ValueError(f"a run ends {', '.join(ENDINGS[1:])}; got {ending!r}")
        with self._lock:
            if run.end is None:
                run.end = self.now() if at is None else at
                run.ending = ending

    def renewed(self, job: str, worker: str, *, at: float | None = None) -> None:
        """A renewal of ``job`` by ``worker``: added to that worker's running run of it."""
        when = self.now() if at is None else at
        with self._lock:
            for run in reversed(self.runs):
                if run.job == job and run.worker == worker and run.end is None:
                    run.renewals.append(when)
                    return

    def mark(self, label: str, *, at: float | None = None) -> None:
        """A moment worth a line across the picture (a crash, the queue drained)."""
        when = self.now() if at is None else at
        with self._lock:
            self.marks.append((when, label))

    def finish(self, *, at: float | None = None) -> None:
        """The scenario stopped: runs still going are cut off there."""
        when = self.now() if at is None else at
        with self._lock:
            self.finished = when
            for run in self.runs:
                if run.end is None:
                    run.end, run.ending = when, "cut off"

    def marked(self) -> list[tuple[float, str]]:
        with self._lock:
            return sorted(self.marks)

    def snapshot(self) -> list[Run]:
        """Copies of the runs, ordered by job then start (safe to read while it runs)."""
        with self._lock:
            runs = [replace(run, renewals=list(run.renewals)) for run in self.runs]
        return sorted(runs, key=lambda r: (r.job, r.start))


class TimelineObserver(Observer):
    """Adds the renewals a manager makes for ``worker`` to ``timeline``."""

    def __init__(self, timeline: Timeline, worker: str) -> None:
        self.timeline = timeline
        self.worker = worker

    def on_extended(self, lease: LeaseRecord, headroom: float) -> None:
        self.timeline.renewed(lease.message.id, self.worker)


def lanes(
    runs: list[Run], now: float, names: dict[str, str] | None = None, *, gap: float = 0.0
) -> list[tuple[str, list[Run]]]:
    """``runs`` packed into rows: per job, as few rows as keep its runs at least
    ``gap`` seconds apart (duplicates need rows of their own). Returns (job's name,
    runs) per row, jobs in order of their names."""
    rows: list[tuple[str, list[Run]]] = []
    by_job: dict[str, list[Run]] = {}
    for run in runs:
        name = run.job if names is None else names.get(run.job, run.job)
        by_job.setdefault(name, []).append(run)
    for job in sorted(by_job, key=_job_order):
        job_rows: list[list[Run]] = []
        for run in sorted(by_job[job], key=lambda r: r.start):
            for row in job_rows:
                if row[-1].last(now) + gap < run.start:
                    row.append(run)
                    break
            else:
                job_rows.append([run])
        rows.extend((job, row) for row in job_rows)
    return rows


def _job_order(job: str) -> tuple[int, str]:
    """job-2 before job-10: by the number at its end, then by name."""
    digits = job[len(job.rstrip("0123456789")) :]
    return (int(digits) if digits else 0, job)
