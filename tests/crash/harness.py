"""The crash tests' side of things: queues on the three local services, worker
processes started, killed and restarted, and the final check against the service.

Timing is tolerant of a loaded 2-core machine: workers are started ahead of
time (``spawn``, then ``go``), so a restart costs no import time; every wait
is a poll with a generous deadline, never a fixed sleep that must be "enough";
the lease settings leave 1.2 s of margin for each 2 s extension.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from leasekeeper.backends.base import Backend
from tests.crash.journal import Analysis, analyse, read_journal
from tests.crash.worker import LEASE_CONFIG

REPO = Path(__file__).resolve().parents[2]

MESSAGES = 8
CONCURRENCY = 8  # every message in flight at once: one round of work per worker
WORK = 3.0  # seconds of handler work, longer than the 2 s visibility timeout
STAGGER = 0.1  # message n works WORK + n * STAGGER s, so deletes are spread out
READY_TIMEOUT = 45.0  # a worker's imports, on a loaded machine
KILL_POINT_TIMEOUT = 30.0  # until a worker reaches its kill point
RECEIVE_TIMEOUT = 20.0  # until a restarted worker gets the messages a dead one held
DRAIN_TIMEOUT = 60.0  # until the queue is empty after the last kill
STOP_TIMEOUT = 25.0  # a SIGTERMed worker finishes what it holds (shutdown_timeout 15 s)
# After this long since the last kill, any lease a killed worker held has run out
# (visibility rounded up to whole seconds by every service, plus slack).
LAPSE_AFTER = LEASE_CONFIG.visibility_timeout + 1.0

# Figures of every scenario that ran in this session, for the terminal summary.
RECORDED: list[dict[str, Any]] = []


class QueueTarget(Protocol):
    """One queue on one local service, as the test sees it (not through a worker)."""

    kind: str
    env: dict[str, str]  # what a worker process needs to reach the queue

    def send(self, body: str) -> str:
        """Send a message; return the service's message id."""
        ...

    def remaining(self) -> int:
        """Messages still in the queue: visible, in flight (invisible) or delayed."""
        ...

    def probe(self) -> Backend:
        """A new leasekeeper backend on the queue, for the test's own receive."""
        ...

    def deleted_count(self) -> int | None:
        """How many messages the service deleted, where it can tell (MNS)."""
        ...


@dataclass
class WorkerProcess:
    index: int
    kill_point: str | None
    popen: subprocess.Popen[str]
    log_path: Path
    ready: bool = False
    go_at: float | None = None
    first_receive_at: float | None = None
    ended_at: float | None = None
    killed_by_test: bool = False

    @property
    def returncode(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""


@dataclass
class KillRecord:
    worker: int
    how: str  # "self:<kill point>" or "test"
    after_go: float  # seconds between the worker's go-ahead and its death
    after_receive: float | None  # ... and between its first receive and its death


@dataclass
class CrashRun:
    """Worker processes on one queue, sharing one journal."""

    target: QueueTarget
    directory: Path
    scenario: str
    work: float = WORK
    stagger: float = STAGGER
    concurrency: int = CONCURRENCY
    workers: list[WorkerProcess] = field(default_factory=list)
    kills: list[KillRecord] = field(default_factory=list)
    sent: list[str] = field(default_factory=list)
    started_at: float = field(default_factory=time.monotonic)
    last_kill_at: float | None = None
    counts: list[tuple[float, int]] = field(default_factory=list)

    @property
    def journal(self) -> Path:
        return self.directory / "journal.log"

    # ------------------------------------------------------------------ workers

    def fill(self, count: int = MESSAGES) -> list[str]:
        self.sent = [self.target.send(f"job-{n}") for n in range(count)]
        assert len(set(self.sent)) == count, self.sent
        return self.sent

    def spawn(self, kill_point: str | None = None) -> WorkerProcess:
        """Start a worker process; it imports, connects and waits for ``go``."""
        index = len(self.workers)
        log_path = self.directory / f"worker-{index}.log"
        command = [
            sys.executable,
            "-m",
            "tests.crash.worker",
            "--backend",
            self.target.kind,
            "--journal",
            str(self.journal),
            "--worker",
            str(index),
            "--work",
            str(self.work),
            "--stagger",
            str(self.stagger),
            "--concurrency",
            str(self.concurrency),
        ]
        if kill_point is not None:
            command += ["--kill-point", kill_point]
        env = {**os.environ, **self.target.env, "PYTHONUNBUFFERED": "1"}
        with log_path.open("w") as log_file:
            popen = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log_file,
                text=True,
                env=env,
                cwd=str(REPO),
            )
        proc = WorkerProcess(index, kill_point, popen, log_path)
        self.workers.append(proc)
        return proc

    def _wait_ready(self, proc: WorkerProcess) -> None:
        stdout = proc.popen.stdout
        assert stdout is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while not proc.ready:
            left = deadline - time.monotonic()
            if left <= 0 or proc.returncode is not None:
                raise AssertionError(
                    f"worker {proc.index} did not get ready (exit code {proc.returncode}):\n"
                    + proc.log_tail()
                )
            readable, _, _ = select.select([stdout], [], [], min(left, 0.5))
            if readable:
                line = stdout.readline()
                if line.strip() == "READY":
                    proc.ready = True
                elif not line:
                    proc.popen.wait(5)  # EOF: the process is ending

    def go(self, proc: WorkerProcess) -> None:
        self._wait_ready(proc)
        stdin = proc.popen.stdin
        assert stdin is not None
        stdin.write("GO\n")
        stdin.flush()
        proc.go_at = time.monotonic()

    def _record_kill(self, proc: WorkerProcess, how: str) -> None:
        now = time.monotonic()
        proc.ended_at = now
        self.last_kill_at = now
        since_receive = None if proc.first_receive_at is None else now - proc.first_receive_at
        self.kills.append(KillRecord(proc.index, how, now - (proc.go_at or now), since_receive))

    def wait_self_kill(self, proc: WorkerProcess) -> None:
        """Wait for a worker with a kill point to SIGKILL itself there."""
        try:
            code = proc.popen.wait(KILL_POINT_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {proc.index} did not reach its kill point {proc.kill_point!r} in "
                f"{KILL_POINT_TIMEOUT:g}s:\n{proc.log_tail()}"
            ) from None
        assert code == -signal.SIGKILL, (
            f"worker {proc.index} ended with {code}, not by SIGKILL at {proc.kill_point!r}:\n"
            + proc.log_tail()
        )
        self._record_kill(proc, f"self:{proc.kill_point}")

    def wait_for_receive(self, proc: WorkerProcess) -> float:
        """Wait until ``proc`` journals its first receive; return when that was seen
        (monotonic; polled every 50 ms)."""
        deadline = time.monotonic() + RECEIVE_TIMEOUT
        while True:
            entries = read_journal(self.journal)
            if any(e.worker == proc.index and e.event == "recv" for e in entries):
                proc.first_receive_at = time.monotonic()
                return proc.first_receive_at
            if proc.returncode is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"worker {proc.index} received nothing in {RECEIVE_TIMEOUT:g}s "
                    f"(exit code {proc.returncode}), {self.target.remaining()} message(s) "
                    f"left\n{self.describe()}"
                )
            time.sleep(0.05)

    def sigkill(self, proc: WorkerProcess) -> None:
        """SIGKILL a running worker from the test (a random moment)."""
        if proc.returncode is None:
            proc.popen.send_signal(signal.SIGKILL)
        code = proc.popen.wait(10)
        assert code == -signal.SIGKILL, f"worker {proc.index} ended with {code}:\n{proc.log_tail()}"
        proc.killed_by_test = True
        self._record_kill(proc, "test")

    def unprocessed(self) -> list[str]:
        """Sent messages no worker has journaled "done" for yet."""
        done = {e.arg for e in read_journal(self.journal) if e.event == "done"}
        return [mid for mid in self.sent if mid not in done]

    def drain(self, proc: WorkerProcess) -> None:
        """Let ``proc`` run until the queue is empty, then stop it gracefully (SIGTERM).

        Empty means: the service counts no message, *and* the journal says every
        sent message was processed at least once. The count alone is not enough:
        a killed worker's messages stay hidden for up to a visibility timeout after
        the kill, and a count taken as they turn visible may miss them (see
        ``SQSTarget.remaining``); a standby stopped then would leave them behind.
        """
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while self._remaining() or self.unprocessed():
            if proc.returncode is not None:
                raise AssertionError(
                    f"worker {proc.index} ended ({proc.returncode}) with "
                    f"{self.target.remaining()} message(s) left:\n{proc.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"{self.target.remaining()} message(s) still in the queue, "
                    f"{len(self.unprocessed())} never processed, {DRAIN_TIMEOUT:g}s after "
                    f"the last kill\n{self.describe()}"
                )
            time.sleep(0.1)
        proc.popen.send_signal(signal.SIGTERM)
        try:
            code = proc.popen.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"worker {proc.index} did not stop within {STOP_TIMEOUT:g}s of SIGTERM:\n"
                + proc.log_tail()
            ) from None
        proc.ended_at = time.monotonic()
        assert code == 0, f"worker {proc.index} exited with {code}:\n{proc.log_tail()}"

    def close(self) -> None:
        """End every process still around: unstarted ones get EOF, others SIGKILL."""
        for proc in self.workers:
            if proc.returncode is not None:
                continue
            with contextlib.suppress(OSError):
                if proc.go_at is None and proc.popen.stdin is not None:
                    proc.popen.stdin.close()
                else:
                    proc.popen.kill()
            try:
                proc.popen.wait(10)
            except subprocess.TimeoutExpired:
                proc.popen.kill()
                proc.popen.wait(10)
        for proc in self.workers:
            for stream in (proc.popen.stdin, proc.popen.stdout):
                if stream is not None:
                    with contextlib.suppress(OSError):
                        stream.close()

    def _remaining(self) -> int:
        """``target.remaining()``, noted in ``counts`` whenever it changes."""
        count = self.target.remaining()
        if not self.counts or self.counts[-1][1] != count:
            self.counts.append((round(time.monotonic() - self.started_at, 3), count))
        return count

    def describe(self) -> str:
        lines = [f"workers: {[(p.index, p.kill_point, p.returncode) for p in self.workers]}"]
        lines.append(f"kills: {self.kills}")
        lines.append(f"messages in the queue (seconds since the start, count): {self.counts}")
        lines.append("journal:")
        with contextlib.suppress(OSError):
            lines.append(self.journal.read_text()[-6000:])
        return "\n".join(lines)

    # ------------------------------------------------------------------ checking

    def verify(self) -> Analysis:
        """Check the service's final state and the journal; return the analysis."""
        # (1) every sent message was deleted: nothing visible, in flight or delayed ...
        remaining = self.target.remaining()
        assert remaining == 0, f"{remaining} message(s) left in the queue\n{self.describe()}"
        deleted = self.target.deleted_count()
        if deleted is not None:
            assert deleted == len(self.sent), f"the service deleted {deleted} of {len(self.sent)}"
        # ... and a receive finds nothing once every lease a killed worker held has
        # run out (the graceful last worker released whatever it still held).
        if self.last_kill_at is not None:
            time.sleep(max(0.0, self.last_kill_at + LAPSE_AFTER - time.monotonic()))
        probe = self.target.probe()
        try:
            leftovers = probe.receive(max_messages=10, visibility_timeout=30)
        finally:
            close = getattr(probe, "close", None)  # MNS and Azure: per-thread clients
            if callable(close):
                close()
        assert leftovers == [], f"received {[m.id for m in leftovers]} from a drained queue"

        killed = [p.index for p in self.workers if p.returncode == -signal.SIGKILL]
        analysis = analyse(read_journal(self.journal), self.sent, killed)
        # (2) every message processed at least once, (3) none lost or unknown,
        # (4) duplicates only where a crash (or a journaled lapse) explains them.
        problems = analysis.problems()
        assert not problems, "\n".join(problems) + "\n" + self.describe()
        return analysis

    def figures(self, analysis: Analysis) -> dict[str, Any]:
        exits = [p.index for p in self.workers if p.returncode == 0]
        return {
            "backend": self.target.kind,
            "scenario": self.scenario,
            "messages": len(self.sent),
            "workers_started": sum(1 for p in self.workers if p.go_at is not None),
            "kills": len(self.kills),
            "kill_log": [
                {
                    "worker": k.worker,
                    "how": k.how,
                    "after_go_s": round(k.after_go, 2),
                    "after_receive_s": None
                    if k.after_receive is None
                    else round(k.after_receive, 2),
                    "held": len(analysis.held_at_kill.get(k.worker, [])),
                    "done_not_deleted": len(analysis.orphaned_at_kill.get(k.worker, [])),
                }
                for k in self.kills
            ],
            "graceful_exits": exits,
            # leasekeeper's own view, from the workers that stopped normally
            "survivor_lapses": sum(
                s.get("manager", {}).get("lapses", 0) for s in analysis.exit_stats.values()
            ),
            "survivor_lost": sum(
                s.get("manager", {}).get("lost", 0) for s in analysis.exit_stats.values()
            ),
            "survivor_refused": sum(s.get("refused", 0) for s in analysis.exit_stats.values()),
            "receives": sum(analysis.receives.values()),
            "handler_runs": sum(analysis.starts.values()),
            "dones": sum(len(w) for w in analysis.dones.values()),
            "duplicates": analysis.total_duplicates,
            "unavoidable_duplicates": sum(analysis.unavoidable.values()),
            "lapse_duplicates": sum(analysis.load.values()),
            "unexplained_duplicates": sum(analysis.unexplained.values()),
            "seconds": round(time.monotonic() - self.started_at, 1),
        }

    def record(self, analysis: Analysis) -> dict[str, Any]:
        figures = self.figures(analysis)
        RECORDED.append(figures)
        (self.directory / "figures.json").write_text(json.dumps(figures, indent=2))
        print(json.dumps(figures))
        if figures["lapse_duplicates"]:
            print(
                f"WARNING: {figures['lapse_duplicates']} duplicate(s) from lapses under load "
                "(a lease extended too late and the message was received again)"
            )
        return figures


@contextlib.contextmanager
def crash_run(target: QueueTarget, directory: Path, scenario: str) -> Iterator[CrashRun]:
    run = CrashRun(target, directory, scenario)
    try:
        yield run
    finally:
        run.close()


def targeted(run: CrashRun, kill_point: str) -> Analysis:
    """One worker SIGKILLs itself at ``kill_point``; a fresh one drains the queue."""
    first = run.spawn(kill_point)  # imports while the queue is filled
    standby = run.spawn()  # imports while the first one works
    run.fill()
    run.go(first)
    run.wait_self_kill(first)
    run.go(standby)
    run.drain(standby)
    return run.verify()


def random_kills(
    run: CrashRun,
    seed: str,
    kills: int = 3,
    window: tuple[float, float] = (0.0, 3.3),
) -> Analysis:
    """The test SIGKILLs ``kills`` workers, one after another, each at a random moment
    ``window`` seconds after it first received messages (seeded: the same moments
    every run); a last worker drains the queue.

    Counting from the first receive, not from the start, makes every kill hit a
    worker that holds messages: somewhere between its receive, its registers,
    its extends (from 0.8 s on) and the first handlers' deletes (from 3.0 s on;
    the last handler works 3.7 s, so some messages are always still held).
    """
    rng = random.Random(seed)
    standby = run.spawn()
    run.fill()
    for _ in range(kills):
        current, standby = standby, run.spawn()
        run.go(current)
        received_at = run.wait_for_receive(current)
        time.sleep(max(0.0, received_at + rng.uniform(*window) - time.monotonic()))
        run.sigkill(current)
    run.go(standby)
    run.drain(standby)
    return run.verify()
