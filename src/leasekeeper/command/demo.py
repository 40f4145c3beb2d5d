"""The seed scenario, side by side, on the in-memory queue in real time.

Five workers share a queue of three long jobs (each takes 3x the short visibility
timeout). Worker 1 takes the first job and crashes one time unit in, holding it.
Three set-ups run at once, each on its own queue:

(a) a long visibility timeout (20 units), no leasekeeper: nothing is processed
    twice, but the crashed worker's job is stuck for the whole timeout;
(b) a short timeout (1 unit), no leasekeeper: the crashed job is back quickly,
    but every long job reappears while it is still being processed and idle
    workers pick it up again;
(c) a short timeout with leasekeeper: each worker leases what it receives; no
    duplicates, and the crashed worker's job is back within one short timeout.

A "crash" stops the worker and, in (c), kills its LeaseManager without releasing
anything, exactly as a process that dies takes its scheduler with it.

While it runs, each scenario's timeline (``leasekeeper.timeline``) is drawn: per
job, which worker ran it when, each renewal, the crash, the re-delivery and the
duplicates - live in a terminal, once at the end when the output is not one, and
as an SVG file with ``--svg``.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.errors import LeaseError
from leasekeeper.manager import LeaseManager
from leasekeeper.timeline import Timeline, TimelineObserver, legend, render_svg, render_text

JOBS = 3
WORKERS = 5
JOB_UNITS = 3.0  # a job takes 3 short timeouts
LONG_UNITS = 20.0  # the "long" timeout of (a)
CRASH_UNITS = 1.0  # worker 1 dies this far into its job
LIMIT_UNITS = 24.0  # nothing runs past this


@dataclass
class Outcome:
    title: str
    visibility: float
    completed: int = 0
    duplicates: int = 0  # a job handed to a worker while a live worker was processing it
    processed: int = 0  # job runs started
    failover: float | None = None  # crash -> crashed job received again, seconds
    extensions: int = 0
    drained_after: float | None = None
    started: float = 0.0
    crash_at: float | None = None
    crashed_job: str | None = None
    working: dict[str, set[str]] = field(default_factory=dict)  # job -> live workers on it
    lock: threading.Lock = field(default_factory=threading.Lock)
    timeline: Timeline = field(default_factory=lambda: Timeline("", 1.0))


class _Scenario:
    def __init__(self, outcome: Outcome, unit: float, leased: bool) -> None:
        self.outcome = outcome
        self.unit = unit
        self.leased = leased
        self.queue = MemoryQueue(visibility_timeout=outcome.visibility, name=outcome.title[:3])
        outcome.timeline = Timeline(outcome.title, (LIMIT_UNITS + 1.0) * unit, unit)
        for n in range(JOBS):
            message_id = self.queue.send(f"job-{n + 1}")
            outcome.timeline.names[message_id] = f"job-{n + 1}"
        self.stop = threading.Event()
        # The crashing worker takes the first job; the others receive once it holds it.
        # Left to the threads' start order, the crash was a race: under load four other
        # workers could take all three jobs first, and then nothing crashed at all.
        self.crasher_holds_a_job = threading.Event()
        self.managers: list[LeaseManager] = []

    def run(self) -> None:
        o = self.outcome
        o.started = o.timeline.origin = time.monotonic()
        threads = [
            threading.Thread(target=self._worker, args=(f"w{i + 1}", i == 0), daemon=True)
            for i in range(WORKERS)
        ]
        for thread in threads:
            thread.start()
        deadline = o.started + LIMIT_UNITS * self.unit
        while time.monotonic() < deadline and not self.stop.is_set():
            if len(self.queue) == 0:
                o.drained_after = time.monotonic() - o.started
                o.timeline.mark("queue drained", at=o.drained_after)
                break
            time.sleep(0.02)
        self.stop.set()
        self.crasher_holds_a_job.set()  # no worker waits on it any more
        for thread in threads:
            thread.join(timeout=JOB_UNITS * self.unit + 1)
        for manager in self.managers:
            o.extensions += manager.stats().extended
            manager.close()
        o.timeline.finish()

    def _worker(self, name: str, crashes: bool) -> None:
        o, unit = self.outcome, self.unit
        manager = None
        if self.leased:
            manager = LeaseManager(
                self.queue,
                visibility_timeout=unit,
                timer_interval=0.1 * unit,
                minimal_life=0.2 * unit,
            )
            manager.add_observer(TimelineObserver(o.timeline, name))
            self.managers.append(manager)
        timeline = o.timeline
        if not crashes:
            self.crasher_holds_a_job.wait()
        while not self.stop.is_set():
            got = self.queue.receive(max_messages=1, wait_seconds=0.05 * unit)
            if not got:
                continue
            message = got[0]
            if crashes:
                self.crasher_holds_a_job.set()
            lease = manager.register(message) if manager is not None else None
            now = time.monotonic()
            with o.lock:
                o.processed += 1
                duplicate = bool(o.working.get(message.id))
                o.duplicates += duplicate
                redelivery = message.id == o.crashed_job and o.failover is None and o.crash_at
                if redelivery and o.crash_at:
                    o.failover = now - o.crash_at
                o.working.setdefault(message.id, set()).add(name)
                run = timeline.start_run(
                    message.id, name, duplicate=duplicate, redelivery=bool(redelivery)
                )
            if crashes:
                self.stop.wait(CRASH_UNITS * unit)
                with o.lock:
                    o.crash_at = time.monotonic()
                    o.crashed_job = message.id
                    o.working[message.id].discard(name)
                    timeline.end_run(run, "crashed")
                    timeline.mark(f"{name} crashes")
                if manager is not None:
                    manager.close(release=False)  # the process died with its scheduler
                return
            finished = not self.stop.wait(JOB_UNITS * unit)
            with o.lock:
                o.working[message.id].discard(name)
            if not finished:
                return
            try:
                if lease is not None:
                    lease.complete()
                    deleted = True
                else:
                    deleted = self.queue.delete([message.handle])[0].kind == "ok"
            except LeaseError:
                deleted = False
            timeline.end_run(run, "completed" if deleted else "refused")
            if deleted:
                with o.lock:
                    o.completed += 1


def _fmt_seconds(value: float | None, unit: float, missing: str) -> str:
    if value is None:
        return missing
    return f"{value:5.1f}s ({value / unit:.1f} units)"


def _fmt_failover(o: Outcome, unit: float) -> str:
    if o.failover is not None and o.failover < 0.05 * unit:
        # Another worker had it before the crash: its visibility ran out mid-job.
        return "none needed: re-delivered mid-job"
    return _fmt_seconds(o.failover, unit, f"> demo ({o.visibility / unit:g}-unit timeout)")


def run_demo(
    seconds: float = 30.0,
    out: TextIO | None = None,
    *,
    tty: bool | None = None,
    svg: str | Path | None = None,
) -> list[Outcome]:
    """Run the three scenarios at once in about ``seconds`` of wall time, drawing
    their timelines to ``out`` (live when it is a terminal, or ``tty=True``; else
    a progress line every 5 s and the timelines once at the end), then the summary
    table. With ``svg``, also write the timelines there as an SVG picture.
    Returns the outcomes."""
    import sys

    stream: TextIO = out if out is not None else sys.stdout
    interactive = stream.isatty() if tty is None else tty
    unit = seconds / (LIMIT_UNITS + 1.0)
    outcomes = [
        Outcome("(a) long timeout, no leasekeeper", LONG_UNITS * unit),
        Outcome("(b) short timeout, no leasekeeper", unit),
        Outcome("(c) short timeout + leasekeeper", unit),
    ]
    scenarios = [
        _Scenario(outcomes[0], unit, leased=False),
        _Scenario(outcomes[1], unit, leased=False),
        _Scenario(outcomes[2], unit, leased=True),
    ]
    write: Callable[[str], object] = stream.write
    write(_heading(unit, seconds) + "\n")
    picture = _Picture(stream, interactive)
    threads = [threading.Thread(target=s.run, daemon=True) for s in scenarios]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    last_line = 0.0
    while any(thread.is_alive() for thread in threads):
        time.sleep(0.2 if picture.live else 0.1)
        for o in outcomes:
            o.timeline.summary = _summary(o, unit, final=False)
        if picture.live and picture.draw(outcomes):
            continue
        elapsed = time.monotonic() - start
        if interactive or elapsed - last_line >= 5.0:
            last_line = elapsed
            parts = "  ".join(
                f"{o.title[:3]} done {o.completed}/{JOBS} dup {o.duplicates}" for o in outcomes
            )
            write(
                ("\r" if interactive else "")
                + f"[{elapsed:5.1f}s] {parts}"
                + ("" if interactive else "\n")
            )
            if interactive:
                stream.flush()
    for o in outcomes:
        o.timeline.summary = _summary(o, unit, final=False)
    if interactive and not picture.live:
        write("\n")  # ends the progress line
    picture.draw(outcomes, final=True)
    write(_table(outcomes, unit))
    stream.flush()
    if svg is not None:
        for o in outcomes:
            o.timeline.summary = _summary(o, unit, final=True)
        Path(svg).write_text(
            render_svg(
                [o.timeline for o in outcomes],
                heading=_heading(unit, seconds).split("\n")[0],
                footnote=f"1 unit = the short visibility timeout ({unit:.2f} s in this run); "
                f"the long one of (a) is {LONG_UNITS:g} units. Drawn by leasekeeper demo --svg.",
            ),
            encoding="utf-8",
        )
    return outcomes


def _heading(unit: float, seconds: float) -> str:
    return (
        f"leasekeeper demo: {WORKERS} workers, {JOBS} jobs of {JOB_UNITS:g} units each; "
        f"worker w1 crashes {CRASH_UNITS:g} unit into its job.\n"
        f"1 unit = {unit:.2f}s = the short visibility timeout; the long one is "
        f"{LONG_UNITS:g} units. Running about {seconds:g}s..."
    )


def _summary(o: Outcome, unit: float, *, final: bool) -> str:
    renewals = sum(len(run.renewals) for run in o.timeline.snapshot())
    text = f"done {o.completed}/{JOBS}, {o.duplicates} duplicate runs, {renewals} renewals"
    if final:
        text += f", crash failover {_fmt_failover(o, unit).strip()}"
    return text


class _Picture:
    """The timelines in the terminal: redrawn in place while they grow when the
    output is a terminal that fits them, else drawn once at the end."""

    def __init__(self, stream: TextIO, interactive: bool) -> None:
        self.stream = stream
        encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("-", "")
        self.unicode = encoding.startswith("utf")
        self.color = (
            interactive and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        )
        size = shutil.get_terminal_size((80, 24))
        self.rows = size.lines
        self.columns = size.columns
        # Whole columns per time unit, so the axis's ticks fall evenly.
        units = int(LIMIT_UNITS + 1)
        per_unit = max(2, min(4, (size.columns - 16) // units)) if interactive else 3
        self.width = per_unit * units
        self.live = interactive
        self.drawn = 0  # lines of the frame on screen, to move back over

    def lines(self, outcomes: list[Outcome]) -> list[str]:
        lines: list[str] = []
        for o in outcomes:
            lines += render_text(
                o.timeline, width=self.width, color=self.color, unicode=self.unicode
            )
            lines.append("")
        return lines

    def draw(self, outcomes: list[Outcome], *, final: bool = False) -> bool:
        """Draw a frame; False (and no more live frames) when it does not fit."""
        lines = self.lines(outcomes)
        if final:
            lines += legend(unicode=self.unicode).split("\n")
        elif self.live:
            if len(lines) >= self.rows - 1:
                self.live = False  # taller than the terminal: it could not be redrawn in place
                return False
            # A line that wrapped would take two rows and throw the redraw off by one.
            lines = [_clip(line, self.columns - 1) for line in lines]
        write = self.stream.write
        if self.live and self.drawn:
            write(f"\x1b[{self.drawn}F\x1b[J")  # back to the frame's first line; clear
        elif not self.live or not self.drawn:
            write("\n")
        write("\n".join(lines) + "\n")
        self.stream.flush()
        self.drawn = len(lines)
        return True


def _table(outcomes: list[Outcome], unit: float) -> str:
    header = ("scenario", "done", "duplicates", "crash failover", "extensions", "drained in")
    rows = [
        (
            o.title,
            f"{o.completed}/{JOBS}",
            str(o.duplicates),
            _fmt_failover(o, unit),
            str(o.extensions),
            _fmt_seconds(o.drained_after, unit, "not drained"),
        )
        for o in outcomes
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
        for row in [header, *rows]
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    _, b, c = outcomes
    verdict = [
        "",
        f"(a) no duplicates, but the crashed job waited the whole {LONG_UNITS:g}-unit timeout.",
        f"(b) fast failover, but {b.duplicates} duplicate run(s): long jobs reappeared mid-run.",
        f"(c) {c.duplicates} duplicates and failover within one short timeout "
        f"({c.extensions} extensions kept {JOBS} long jobs hidden).",
        "",
    ]
    return "\n" + "\n".join(lines + verdict)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _clip(line: str, width: int) -> str:
    """``line`` cut to ``width`` visible characters (ANSI colour codes kept whole)."""
    if len(_ANSI.sub("", line)) <= width:
        return line
    out: list[str] = []
    visible = 0
    position = 0
    while position < len(line) and visible < width:
        code = _ANSI.match(line, position)
        if code:
            out.append(code.group())
            position = code.end()
            continue
        out.append(line[position])
        visible += 1
        position += 1
    return "".join(out) + "\x1b[0m"
