"""LatencyBackend: MemoryQueue behind a fixed per-call latency, as a real service would be.

Every extend/delete/release costs ``latency`` seconds. On the real clock the
calling thread sleeps that long before the queue applies the call (the request
is applied when its response leaves the service - the late, conservative end).
On a driven clock (``ManualClock``) nothing sleeps: the wrapper *accounts* for
the latency - the call counts as applied at ``now + latency`` - and the time a
call waits for a free connection is modelled by ``benchmarks.simpool.SimPool``,
which runs the design's dispatch jobs at the moment a worker would be free.

``track_deadlines=True`` makes the wrapper the referee for lapses, independent of
what the design under test believes: it records the service-side deadline of
every message it handed out (received + visibility, then apply time + timeout of
each extend) and counts a *visible lapse* whenever an extend is applied after
that deadline - the message was visible, and receivable by another consumer, in
between. ``finish()`` counts the messages whose deadline passed with no extend.

``receive`` and ``adopt`` are forwarded without latency: they are the worker's
own calls, not part of the renewal being measured. It is a ``ForwardingBackend``:
with no latency and no deadline tracking, an extend, delete or release costs one
method call more than the MemoryQueue's own (the register+complete benchmark
times exactly that path).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from leasekeeper.backends.base import ForwardingBackend, Handle, Message, Outcome
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.clock import DrivenClock

# on_extend(send_time, handles, timeout): called as an extend call is sent.
ExtendHook = Callable[[float, Sequence[Handle], float], None]


class LatencyBackend(ForwardingBackend):
    """A leasekeeper Backend forwarding to ``inner`` with ``latency`` seconds per call."""

    inner: MemoryQueue

    def __init__(
        self,
        inner: MemoryQueue,
        latency: float = 0.0,
        *,
        track_deadlines: bool = False,
    ) -> None:
        super().__init__(inner)
        self.latency = float(latency)
        self.clock = inner.clock
        self.simulated = isinstance(inner.clock, DrivenClock)
        self.track_deadlines = track_deadlines
        self.on_extend: ExtendHook | None = None
        self._lock = threading.Lock()
        self.deadlines: dict[str, float] = {}
        self.visible_lapses = 0
        self.lapsed_ids: set[str] = set()
        self.extend_calls = 0
        self.extend_entries = 0

    def __repr__(self) -> str:
        mode = "simulated" if self.simulated else "real"
        return f"LatencyBackend({self.inner!r}, latency={self.latency:g}s, {mode})"

    # ------------------------------------------------------------------ plumbing

    def _pay(self) -> float:
        """Spend (or account for) one call's latency; return when it is applied."""
        if self.simulated:
            return self.clock.now() + self.latency
        if self.latency > 0:
            time.sleep(self.latency)
        return self.clock.now()

    # ------------------------------------------------------------------ Backend API

    def wrap(self, message: Message) -> Message:
        if self.track_deadlines:
            with self._lock:
                self.deadlines[message.id] = message.visible_until
        return super().wrap(message)

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        hook = self.on_extend
        if hook is not None:
            hook(self.clock.now(), handles, timeout)
        applied = self._pay()
        outcomes = self.inner.extend(handles, timeout)
        with self._lock:
            self.extend_calls += 1
            self.extend_entries += len(handles)
            if self.track_deadlines:
                deadlines = self.deadlines
                for handle, outcome in zip(handles, outcomes, strict=True):
                    if outcome.kind != "ok":
                        continue
                    mid = handle.message_id
                    before = deadlines.get(mid)
                    if before is not None and applied > before:
                        self.visible_lapses += 1
                        self.lapsed_ids.add(mid)
                    deadlines[mid] = applied + timeout
        return outcomes

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        # With no latency and no tracking: the inner call and nothing else (the
        # register+complete benchmark times this path).
        if self.latency:
            self._pay()
        outcomes = self.inner.delete(handles)
        if self.track_deadlines:
            self._forget(handles)
        return outcomes

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        if self.latency:
            self._pay()
        outcomes = self.inner.release(handles, delay)
        if self.track_deadlines:
            self._forget(handles)
        return outcomes

    def _forget(self, handles: Sequence[Handle]) -> None:
        if self.track_deadlines:
            with self._lock:
                for handle in handles:
                    self.deadlines.pop(handle.message_id, None)

    # ------------------------------------------------------------------ refereeing

    def finish(self, now: float | None = None) -> int:
        """Count held messages whose deadline passed with no extend; return all lapses."""
        at = self.clock.now() if now is None else now
        with self._lock:
            for mid, deadline in self.deadlines.items():
                if deadline < at and mid not in self.lapsed_ids:
                    self.visible_lapses += 1
                    self.lapsed_ids.add(mid)
            return self.visible_lapses


def memory_backend(
    latency: float = 0.0,
    *,
    max_batch: int = 10,
    visibility: float = 30.0,
    clock: Any = None,
    track_deadlines: bool = False,
) -> LatencyBackend:
    """A MemoryQueue (SQS-like ``max_batch=10`` or MNS/Azure-like 1) behind a latency."""
    inner = MemoryQueue(
        visibility,
        clock=clock,
        max_batch=max_batch,
        name=f"memory-b{max_batch}",
    )
    return LatencyBackend(inner, latency, track_deadlines=track_deadlines)
