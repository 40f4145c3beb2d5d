"""Thread-per-message heartbeat: the pattern most Python SQS code uses.

Written the way it is pasted into projects (a ``threading.Thread`` subclass with a
stop ``Event``)::

    heartbeat = VisibilityHeartbeat(backend, message.handle, interval=20, timeout=30)
    heartbeat.start()
    try:
        process(message)
    finally:
        heartbeat.stop()          # set the event and join, so no extend follows the delete
        backend.delete([heartbeat.handle])

Every ``interval`` seconds the thread extends its one message with one call.
"""

from __future__ import annotations

import logging
import threading
import time

from leasekeeper.backends.base import Backend, Handle, Message

log = logging.getLogger("benchmarks.heartbeat")


class VisibilityHeartbeat(threading.Thread):
    """Extend one message's visibility every ``interval`` seconds until stopped."""

    def __init__(
        self,
        backend: Backend,
        handle: Handle,
        *,
        interval: float,
        timeout: float,
        lag_samples: list[float] | None = None,
    ) -> None:
        super().__init__(name=f"heartbeat-{handle.message_id}", daemon=True)
        self.backend = backend
        self.handle = handle
        self.interval = interval
        self.timeout = timeout
        self.extensions = 0
        self._halt = threading.Event()
        self._lag_samples = lag_samples  # how late each wake-up was (benchmark only)

    def run(self) -> None:
        while True:
            planned = time.monotonic() + self.interval
            if self._halt.wait(self.interval):
                return
            if self._lag_samples is not None:
                self._lag_samples.append(time.monotonic() - planned)
            try:
                outcome = self.backend.extend([self.handle], self.timeout)[0]
            except Exception:
                log.exception("heartbeat extend failed")
                continue
            if outcome.kind == "ok":
                self.extensions += 1
                if outcome.receipt is not None:
                    self.handle = Handle(self.handle.message_id, outcome.receipt)
            elif outcome.kind in ("lost", "fatal", "capped"):
                log.warning("heartbeat for %s stops: %s", self.handle.message_id, outcome.kind)
                return

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join()


class HeartbeatTracker:
    """Start/stop heartbeats the way a handler does around each message."""

    def __init__(
        self,
        backend: Backend,
        *,
        interval: float,
        timeout: float,
        lag_samples: list[float] | None = None,
    ) -> None:
        self.backend = backend
        self.interval = interval
        self.timeout = timeout
        self.lag_samples = lag_samples
        self.live: set[VisibilityHeartbeat] = set()

    def track(self, message: Message) -> VisibilityHeartbeat:
        heartbeat = VisibilityHeartbeat(
            self.backend,
            message.handle,
            interval=self.interval,
            timeout=self.timeout,
            lag_samples=self.lag_samples,
        )
        heartbeat.start()
        self.live.add(heartbeat)
        return heartbeat

    def untrack(self, heartbeat: VisibilityHeartbeat) -> None:
        heartbeat.stop()
        self.live.discard(heartbeat)
        self.backend.delete([heartbeat.handle])

    def close(self) -> None:
        for heartbeat in list(self.live):
            heartbeat._halt.set()
        for heartbeat in list(self.live):
            heartbeat.join(timeout=5)
        self.live.clear()
