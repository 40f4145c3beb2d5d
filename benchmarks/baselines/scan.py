"""Scan-every-tick: the seed sample's design (Aliyun MNS best-practice manager).

A timer fires every ``timer_interval`` and checks *every* registered message;
each one with less than ``threshold`` of invisibility left gets one
ChangeVisibility call, run in parallel on a thread pool of ``max_concurrency``.
``register`` checks the new message at once, ``delete`` removes it from the list
and deletes it. The timer fires at a fixed rate whether or not the previous
tick's calls have finished (as a ``System.Threading.Timer`` does); a message whose
extend is still in flight is skipped, so it is never extended twice at once.

On a driven clock (``ManualClock``) the manager attaches to the clock like a
LeaseManager does and runs each tick, and its calls, inline.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from leasekeeper.backends.base import Backend, Handle, Message
from leasekeeper.clock import SYSTEM_CLOCK, Clock, DrivenClock

log = logging.getLogger("benchmarks.scan")


class _Entry:
    __slots__ = ("busy", "handle", "visible_until")

    def __init__(self, handle: Handle, visible_until: float) -> None:
        self.handle = handle
        self.visible_until = visible_until
        self.busy = False


class ScanManager:
    """Keep registered messages invisible by scanning them all every tick."""

    def __init__(
        self,
        backend: Backend,
        *,
        visibility_timeout: float,
        timer_interval: float,
        threshold: float,
        max_concurrency: int = 16,
        clock: Clock | None = None,
        executor: Any = None,
    ) -> None:
        self.backend = backend
        self.visibility_timeout = visibility_timeout
        self.timer_interval = timer_interval
        self.threshold = threshold
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._driven = isinstance(self.clock, DrivenClock)
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._closed = threading.Event()
        self._next_tick = self.clock.now() + timer_interval
        self.tick_lag: list[float] = []  # how late each tick fired (benchmark only)
        self.extend_calls = 0
        # A simulation's executor stands in for the pool (benchmarks.simpool).
        self._pool: Any = executor
        self._timer: threading.Thread | None = None
        if self._driven:
            self.clock.attach(self)  # type: ignore[attr-defined]
        else:
            self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="scan-extend")
            self._timer = threading.Thread(target=self._run, name="scan-timer", daemon=True)
            self._timer.start()

    # ------------------------------------------------------------------ handler side

    def register(self, message: Message) -> _Entry:
        entry = _Entry(message.handle, message.visible_until)
        with self._lock:
            self._entries[message.id] = entry
            due = entry.visible_until - self.clock.now() < self.threshold
            if due:
                entry.busy = True
        if due:  # "on registration the manager checks at once whether it is needed"
            self._submit(entry)
        return entry

    def delete(self, message_id: str) -> None:
        with self._lock:
            entry = self._entries.pop(message_id)
        self.backend.delete([entry.handle])

    def close(self) -> None:
        self._closed.set()
        if self._timer is not None:
            self._timer.join(timeout=5)
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        if self._driven:
            self.clock.detach(self)  # type: ignore[attr-defined]

    def __len__(self) -> int:
        return len(self._entries)

    # ------------------------------------------------------------------ the timer

    def _run(self) -> None:
        while not self._closed.is_set():
            wait = self._next_tick - self.clock.now()
            if wait > 0 and self._closed.wait(wait):
                return
            self._tick()

    def _tick(self) -> None:
        now = self.clock.now()
        self.tick_lag.append(now - self._next_tick)
        self._next_tick += self.timer_interval
        if self._next_tick <= now:  # fell a whole tick behind: fire again from now
            self._next_tick = now + self.timer_interval
        due: list[_Entry] = []
        with self._lock:
            for entry in self._entries.values():
                if not entry.busy and entry.visible_until - now < self.threshold:
                    entry.busy = True
                    due.append(entry)
        for entry in due:
            self._submit(entry)

    def _submit(self, entry: _Entry) -> None:
        if self._pool is None:
            self._extend(entry)
            return
        try:
            self._pool.submit(self._extend, entry)
        except RuntimeError:  # pool shut down: closing
            entry.busy = False

    def _extend(self, entry: _Entry) -> None:
        sent = self.clock.now()
        try:
            outcome = self.backend.extend([entry.handle], self.visibility_timeout)[0]
        except Exception:
            log.exception("extend failed")
            entry.busy = False
            return
        self.extend_calls += 1
        if outcome.kind == "ok":
            entry.visible_until = sent + self.visibility_timeout
            if outcome.receipt is not None:
                entry.handle = Handle(entry.handle.message_id, outcome.receipt)
        entry.busy = False

    # ------------------------------------------------------------------ driven clock

    def next_wakeup(self) -> float | None:
        return None if self._closed.is_set() else self._next_tick

    def run_due(self) -> None:
        if not self._closed.is_set() and self.clock.now() >= self._next_tick:
            self._tick()
