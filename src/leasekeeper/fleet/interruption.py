"""Drain before the machine is taken back: ``InterruptionWatch``.

``Worker(..., interruption_notice="aws")`` (or ``"azure"``, ``"alibaba"``, or a
``NoticeSource`` of your own; ``leasekeeper worker --interruption-notice aws``)
adds an ``InterruptionWatch`` to the worker's listeners. While the worker runs, one
thread of its own (``leasekeeper-interruption``) asks the machine's metadata
service every ``every`` seconds (2: AWS advises at least every 5; a notice may
come only seconds ahead, and asking is a local call) whether the machine is about
to go (``fleet.notices``). On a notice it starts the same graceful drain as SIGTERM
- ``worker.drain(deadline)`` - with the notice's time, less ``margin`` seconds, as
the deadline: nothing more is received from that moment, running handlers go on,
and what has not finished by the deadline is released (so another worker gets it
before this machine is gone); the deletes owed are sent, and ``run()`` returns (the
command exits 0). Once drained, a source that waits to be told (Azure's Scheduled
Events) is acknowledged.

The notice's time is the machine's (epoch seconds); the deadline is on the
worker's clock: ``clock.now() + (notice.at - clock.wall()) - margin``. A metadata
service that cannot be asked costs one WARNING (and a line when it answers again);
the worker goes on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from leasekeeper.clock import SYSTEM_CLOCK, Clock, wait_until
from leasekeeper.fleet.notices import Notice, NoticeError, NoticeSource
from leasekeeper.receiving.listeners import WorkerListener

__all__ = ["InterruptionWatch"]

log = logging.getLogger("leasekeeper.fleet")


class InterruptionWatch(WorkerListener):
    """Polls ``source`` while the worker runs and drains it on a notice (see the module
    docstring). ``drain(deadline)``: the worker's ``drain``; ``clock``: its clock. A
    worker given ``interruption_notice=`` makes one and binds both."""

    def __init__(
        self,
        source: NoticeSource,
        drain: Callable[[float], None] | None = None,
        *,
        every: float = 2.0,
        margin: float = 10.0,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(source, NoticeSource):
            raise TypeError(
                f"InterruptionWatch takes a NoticeSource (poll, acknowledge), got "
                f"{type(source).__name__}"
            )
        if not every > 0:
            raise ValueError(f"every must be > 0 seconds, got {every!r}")
        if not margin >= 0:
            raise ValueError(f"margin must be >= 0 seconds, got {margin!r}")
        self.source = source
        self.drain = drain
        self.every = float(every)
        self.margin = float(margin)
        self.clock: Clock = SYSTEM_CLOCK if clock is None else clock
        #: The notice that drained the worker, once one did.
        self.notice: Notice | None = None
        #: Polls made, and polls that failed.
        self.polls = self.failures = 0
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._failing = False

    def bind(self, drain: Callable[[float], None], clock: Clock) -> InterruptionWatch:
        """Drain with ``drain`` (a worker's), reading ``clock`` (the worker's)."""
        self.drain, self.clock = drain, clock
        return self

    # ------------------------------------------------------------------ the worker's moments

    def started(self) -> None:
        with self._cond:
            if self._thread is not None or self.notice is not None:
                return
            self._closing = False
            self._thread = threading.Thread(
                target=self._run, name="leasekeeper-interruption", daemon=True
            )
            self._thread.start()

    def stopped(self) -> None:
        """Stop polling; once drained by a notice, acknowledge it."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            notice = self.notice
        if notice is None:
            return
        try:
            self.source.acknowledge(notice)
        except NoticeError as exc:
            log.warning("interruption notice: could not acknowledge it: %s", exc)
        else:
            if notice.event_id is not None:
                log.info("interruption notice: acknowledged (%s): the machine may go", notice.what)

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        clock, cond = self.clock, self._cond
        with cond:
            while not self._closing:
                cond.release()
                try:
                    notice = self._poll()
                finally:
                    cond.acquire()
                if notice is not None and not self._closing:
                    self.notice = notice
                    cond.release()
                    try:
                        self._drain(notice)
                    finally:
                        cond.acquire()
                    break
                due = clock.now() + self.every
                while not self._closing and clock.now() < due:  # (a driven clock rings early)
                    wait_until(clock, cond, due)
            self._thread = None

    def _poll(self) -> Notice | None:
        self.polls += 1
        try:
            notice = self.source.poll()
        except Exception as exc:  # a NoticeError, or a source of one's own that raised
            self.failures += 1
            if not self._failing:
                self._failing = True
                log.warning(
                    "interruption notices (%s): cannot ask the metadata service: %s; the "
                    "worker goes on and asks again every %gs",
                    self.source.name,
                    exc,
                    self.every,
                )
            return None
        if self._failing:
            self._failing = False
            log.info(
                "interruption notices (%s): the metadata service answers again", self.source.name
            )
        return notice

    def _drain(self, notice: Notice) -> None:
        clock = self.clock
        left = notice.at - clock.wall()
        deadline = clock.now() + left - self.margin
        when = time.strftime("%H:%M:%SZ", time.gmtime(notice.at))
        log.warning(
            "interruption notice: %s (%s, in %.0fs): draining - nothing more is received; "
            "what has not finished %gs before then is released",
            notice.what,
            when,
            left,
            self.margin,
        )
        if self.drain is None:
            log.error("interruption notice: no worker to drain (InterruptionWatch never bound)")
            return
        self.drain(deadline)

    def __repr__(self) -> str:
        return f"<InterruptionWatch {self.source!r} every={self.every:g}s margin={self.margin:g}s>"
