"""The extend threshold in force, and the timing behind it (rules 2 and 3).

A lease is extended when less than the threshold remains of its invisibility. With
``extend_threshold="auto"`` the threshold follows what is measured: the send lag
(how late an extend left: the scheduler's own lag plus waiting for a dispatch
thread) and the call's latency. Either way, when lag plus latency eat more than
half the threshold, a warning is due (rate-limited by the engine's metrics).
"""

from __future__ import annotations

import logging
import math

from leasekeeper.config import LeaseConfig
from leasekeeper.engine._metrics import SampleRing

log = logging.getLogger("leasekeeper.manager")

#: Extend calls measured before an adaptive threshold moves off the default.
ADAPT_AFTER = 10


class Threshold:
    """One engine's extend threshold and its timing samples."""

    __slots__ = ("_config", "_next_adapt", "extend_latency", "send_lag", "value")

    def __init__(
        self, config: LeaseConfig, *, send_lag: SampleRing, extend_latency: SampleRing
    ) -> None:
        self._config = config
        self.value = config.threshold
        self._next_adapt = -math.inf
        # The engine's metrics' rings, appended to without a lock (see _metrics).
        self.send_lag = send_lag
        self.extend_latency = extend_latency

    def sample(self, send_lag: float, latency: float) -> bool:
        """Record one extend call; True when lag plus latency ate more than half the
        threshold (rule 3: a margin warning may be due)."""
        self.send_lag.append(send_lag)
        self.extend_latency.append(latency)
        return send_lag + latency > self.value / 2

    def adapt(self, now: float) -> None:
        """With ``extend_threshold="auto"``: at most once a second, set the threshold
        to ``timer_interval + 3 x p99(send lag + extend latency)`` within its bounds,
        once ``ADAPT_AFTER`` extend calls have been measured."""
        config = self._config
        if not config.adaptive or now < self._next_adapt:
            return
        self._next_adapt = now + 1.0
        if self.extend_latency.count < ADAPT_AFTER:
            return
        late = self.send_lag.percentile(0.99) + self.extend_latency.percentile(0.99)
        floor, cap = config.threshold_bounds
        threshold = min(cap, max(floor, config.timer_interval + 3.0 * late))
        if abs(threshold - self.value) > 0.05 * self.value:
            log.info("extend_threshold adapted: %.3fs (p99 lateness %.3fs)", threshold, late)
        self.value = threshold
