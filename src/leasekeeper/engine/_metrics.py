"""What a lease manager counts and measures, and the warnings it rate-limits.

``Metrics`` holds the counters, the timing samples and the two warnings an
overloaded manager could otherwise repeat thousands of times a minute (lapses,
and a margin eaten by lag and latency). ``Stats`` is the frozen snapshot that
``LeaseManager.stats()`` returns.

The counters are plain ints. Every increment happens while the renewal engine
holds its registry lock (the engine says so where it counts), so they need no
lock of their own and ``snapshot`` reads them under that same lock. Timing samples
go to ``SampleRing``s without a lock: a race can at worst overwrite one sample,
which percentiles shrug off.
"""

from __future__ import annotations

import logging
import math
from array import array
from collections.abc import Iterable, Sequence

from leasekeeper.engine.stats import Stats

log = logging.getLogger("leasekeeper.manager")

SAMPLES = 2048  # lag / latency samples kept for percentiles
WARN_EVERY = 60.0  # seconds between repeated warnings of one kind
LAPSE_LINES = 10  # lapse warnings logged one by one per WARN_EVERY window


class SampleRing:
    """The last ``size`` timing samples, in storage allocated once.

    A ``deque(maxlen=...)`` of floats grows (one float object per sample) until it
    is full, which over a long run looks exactly like a leak; this ring holds raw
    doubles in a preallocated array, so the footprint is the same in the first
    minute and the hundredth.
    """

    __slots__ = ("_count", "_data", "_next")

    def __init__(self, size: int = SAMPLES) -> None:
        self._data = array("d", bytes(8 * size))
        self._next = 0
        self._count = 0

    def append(self, value: float) -> None:
        i = self._next
        self._data[i] = value
        self._next = (i + 1) % len(self._data)
        if self._count < len(self._data):
            self._count += 1

    def snapshot(self) -> list[float]:
        return self._data[: self._count].tolist()

    @property
    def count(self) -> int:
        """Samples held (up to the ring's size)."""
        return self._count

    def percentile(self, q: float) -> float:
        return percentile(self.snapshot(), q)


def percentile(samples: Iterable[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of ``samples``; 0.0 for none."""
    ordered = sorted(samples)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


class Metrics:
    """Counters and timing samples of one renewal engine (see the module docstring)."""

    __slots__ = (
        "_lapse_lines",
        "_lapse_window",
        "_lapses_unlogged",
        "_last_margin_warning",
        "abandoned",
        "callback_errors",
        "capped",
        "completed",
        "extend_calls",
        "extend_errors",
        "extend_latency",
        "extended",
        "forgotten",
        "lapses",
        "lost",
        "lost_reasons",
        "margin_warnings",
        "registered",
        "released",
        "retries",
        "rolled_over",
        "scheduler_errors",
        "scheduler_lag",
        "send_lag",
    )

    def __init__(self) -> None:
        self.registered = self.extended = self.extend_calls = self.extend_errors = 0
        self.retries = self.lost = self.completed = self.released = 0
        self.abandoned = self.capped = self.lapses = self.forgotten = self.rolled_over = 0
        self.lost_reasons: dict[str, int] = {}
        self.callback_errors = self.scheduler_errors = self.margin_warnings = 0
        self.scheduler_lag = SampleRing()
        self.send_lag = SampleRing()
        self.extend_latency = SampleRing()
        self._last_margin_warning = -math.inf
        # Lapse warnings: a few lines per window, then one line saying how many more.
        self._lapse_window = -math.inf
        self._lapse_lines = 0
        self._lapses_unlogged = 0

    def snapshot(self, in_flight: int, threshold: float = 0.0) -> Stats:
        """A Stats of the counters now (call it under the engine's registry lock)."""
        lag = self.scheduler_lag.snapshot()
        send = self.send_lag.snapshot()
        latency = self.extend_latency.snapshot()
        return Stats(
            in_flight=in_flight,
            registered=self.registered,
            extended=self.extended,
            extend_calls=self.extend_calls,
            extend_errors=self.extend_errors,
            retries=self.retries,
            lost=self.lost,
            completed=self.completed,
            released=self.released,
            abandoned=self.abandoned,
            capped=self.capped,
            lapses=self.lapses,
            callback_errors=self.callback_errors,
            scheduler_errors=self.scheduler_errors,
            margin_warnings=self.margin_warnings,
            scheduler_lag_p50=percentile(lag, 0.50),
            scheduler_lag_p99=percentile(lag, 0.99),
            send_lag_p50=percentile(send, 0.50),
            send_lag_p99=percentile(send, 0.99),
            extend_latency_p50=percentile(latency, 0.50),
            extend_latency_p99=percentile(latency, 0.99),
            extend_threshold=threshold,
            forgotten=self.forgotten,
            rolled_over=self.rolled_over,
            lost_reasons=dict(self.lost_reasons),
        )

    # ------------------------------------------------------------------ rate-limited warnings

    def count_lapses(self, ids: Sequence[str], now: float) -> tuple[list[str], int]:
        """Count lapses of the leases on ``ids`` (under the registry lock).

        Returns the ids to log one by one and how many earlier lapses went
        unlogged in the window that just closed: an overloaded manager can lapse
        thousands of leases a minute, and a log line each would bury everything else.
        """
        self.lapses += len(ids)
        suppressed = 0
        if now - self._lapse_window >= WARN_EVERY:
            suppressed, self._lapses_unlogged = self._lapses_unlogged, 0
            self._lapse_window, self._lapse_lines = now, 0
        shown = list(ids[: max(0, LAPSE_LINES - self._lapse_lines)])
        self._lapse_lines += len(shown)
        self._lapses_unlogged += len(ids) - len(shown)
        return shown, suppressed

    def margin_warning_due(self, now: float) -> bool:
        """Count a thin margin (under the registry lock); True when a line is due."""
        self.margin_warnings += 1
        if now - self._last_margin_warning < WARN_EVERY:
            return False
        self._last_margin_warning = now
        return True


def log_lapses(shown: Sequence[tuple[str, float]], suppressed: int) -> None:
    """Log what ``Metrics.count_lapses`` let through: (message id, seconds late)."""
    if suppressed:
        log.warning("%d more lapse(s) in the previous minute (not logged one by one)", suppressed)
    for message_id, late in shown:
        log.warning(
            "lapse: the invisibility of message %r ran out %.3fs before an extend was sent; "
            "another consumer may have received it (scheduler lag, slow calls, or a "
            "thread holding the GIL)",
            message_id,
            late,
        )
