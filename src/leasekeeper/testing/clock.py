"""ManualClock: time that moves only when a test says so.

A LeaseManager or MemoryQueue built on a ManualClock never waits in real time.
``advance(seconds)`` steps the clock to every moment something attached to it has
work due (each manager's next due lease), runs that work to completion, and
carries on to the target time. So after ``clock.advance(3600)`` every extension
that was due within that hour has happened, in order, in a few milliseconds.
"""

from __future__ import annotations

import threading

from leasekeeper.clock import Alarm, ClockDriven

_MAX_STEPS_AT_ONE_TIME = 10_000


class ManualClock:
    """A monotonic clock for tests. Thread-safe; ``advance`` runs attached work inline."""

    def __init__(self, start: float = 1000.0, wall_start: float = 1_800_000_000.0) -> None:
        self._now = float(start)
        self._wall_offset = float(wall_start) - float(start)
        # Guards _now and _runners; advance() itself is serialised by _advancing so
        # two threads cannot interleave their steps.
        self._lock = threading.Lock()
        self._advancing = threading.RLock()
        self._runners: list[ClockDriven] = []
        # Notified when a thread starts waiting on this clock (an Alarm is attached).
        self._sleeping = threading.Condition(self._lock)

    def now(self) -> float:
        with self._lock:
            return self._now

    def wall(self) -> float:
        with self._lock:
            return self._now + self._wall_offset

    def wait(self, condition: threading.Condition, timeout: float) -> bool:
        # Manual time does not pass while a thread blocks: waiting is a no-op.
        return False

    def attach(self, runner: ClockDriven) -> None:
        with self._lock:
            self._runners.append(runner)
            if isinstance(runner, Alarm):
                self._sleeping.notify_all()

    def sleepers(self) -> int:
        """How many threads (or event loops) wait on this clock now: a ``Worker``'s
        receive loop waiting for its next moment, say."""
        with self._lock:
            return sum(isinstance(r, Alarm) and not r.rung for r in self._runners)

    def wait_for_sleepers(self, count: int = 1, timeout: float = 30.0) -> bool:
        """Block, in real time, until at least ``count`` threads wait on this clock
        (or ``timeout`` real seconds pass: then False). A test calls it before
        ``advance()`` so that time moves when the worker it drives is waiting, not
        while it is still busy: each step then happens in the same order every run."""
        with self._lock:
            return self._sleeping.wait_for(
                lambda: sum(isinstance(r, Alarm) and not r.rung for r in self._runners) >= count,
                timeout,
            )

    def detach(self, runner: ClockDriven) -> None:
        with self._lock:
            if runner in self._runners:
                self._runners.remove(runner)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds``, running due work at each due moment."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back ({seconds!r})")
        with self._advancing:
            target = self.now() + seconds
            steps_here = 0
            last = None
            while True:
                with self._lock:
                    runners = list(self._runners)
                wakeups = [w for w in (r.next_wakeup() for r in runners) if w is not None]
                step = min(wakeups, default=None)
                if step is None or step > target:
                    break
                with self._lock:
                    self._now = max(self._now, step)
                    now = self._now
                steps_here = steps_here + 1 if now == last else 0
                last = now
                if steps_here > _MAX_STEPS_AT_ONE_TIME:
                    raise RuntimeError(
                        "ManualClock.advance: work keeps coming due at the same moment; "
                        "something reschedules without moving forward"
                    )
                for runner in runners:
                    runner.run_due()
            with self._lock:
                self._now = max(self._now, target)
            for runner in runners:
                runner.run_due()

    def skip(self, seconds: float) -> None:
        """Move time forward by ``seconds`` *without* running what falls due meanwhile:
        the thread is busy (a slow call), and that work runs late, at the next
        ``advance()``. ``FaultyBackend`` uses it for a call's latency."""
        if seconds < 0:
            raise ValueError(f"a monotonic clock cannot go back ({seconds!r})")
        with self._lock:
            self._now += seconds

    def run_due(self) -> None:
        """Run whatever is due now without moving time (e.g. right after register)."""
        self.advance(0.0)

    def __repr__(self) -> str:
        return f"ManualClock(now={self.now():.3f})"
