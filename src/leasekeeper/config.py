"""LeaseConfig: the timing parameters of a LeaseManager, validated once at construction.

The names follow Aliyun's MNS best-practice sample, which leasekeeper grew from:
QueueMessageVisibilityTimeout -> ``visibility_timeout``, TimerInterval ->
``timer_interval``, MessageMinimalLife -> ``minimal_life``, MessageTimeout ->
``max_lease_duration``, VisibilityTimeoutExtensionThreshold -> ``extend_threshold``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Literal

from leasekeeper.errors import ConfigError

_SECONDS_FIELDS = ("visibility_timeout", "timer_interval", "minimal_life")
#: What ``on_cap`` takes: stop renewing at the service's cap, or roll over before it.
ON_CAP_CHOICES = ("abandon", "rollover")


def _seconds(name: str, value: Any, *, allow_zero: bool = False) -> float:
    """Coerce a duration to float, or raise ConfigError that says what was wrong."""
    # bool is an int subclass; True seconds is always a mistake.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(
            f"{name} must be a number of seconds, got {value!r} ({type(value).__name__})"
        )
    try:
        seconds = float(value)
    except OverflowError:  # an int beyond float range: 10**400
        raise ConfigError(f"{name} must be a finite number of seconds, got {value!r}") from None
    if math.isnan(seconds) or math.isinf(seconds):
        raise ConfigError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(f"{name} must be {bound} seconds, got {value!r}")
    return seconds


@dataclass(frozen=True)
class LeaseConfig:
    """How long leases last and when they are renewed. All durations are seconds.

    visibility_timeout
        What each extend sets the message's invisibility to. Short means fast
        failover when a worker dies; it must exceed ``timer_interval + minimal_life``.
    timer_interval
        The longest the scheduler sleeps. It wakes earlier whenever a lease is due;
        this is a safety net, not a polling period.
    extend_threshold
        A lease is extended when less than this remains of its invisibility.
        ``None`` derives ``max(timer_interval + minimal_life, visibility_timeout / 3)``.
        A number must lie strictly between ``timer_interval`` and
        ``visibility_timeout``. ``"auto"`` adapts it to what the manager measures:
        ``timer_interval + 3 x p99(send lag + extend latency)``, at least
        ``timer_interval + minimal_life`` (the sample's rule) and at most
        ``0.8 x visibility_timeout``; it starts at the derived default until 10
        extend calls have been measured, and is recomputed at most once a second. A
        slow or throttled service gets earlier renewals; a fast one fewer calls.
    minimal_life
        The least invisibility a message may have left when registered.
    max_lease_duration
        Stop renewing a lease this long after it was registered (a stuck
        handler) and let the message reappear. ``None``: no limit.
    release_delay
        How long a message stays invisible after its handler failed, the first time
        (jittered by +-20 %, so messages that failed together do not come back together).
        On a FIFO queue the failed message's whole group waits it: nothing more of
        the group is handed out until it is visible again.
    release_backoff
        Factor applied to ``release_delay`` per earlier receive of the message
        (``release_delay * release_backoff ** (receive_count - 1)``), so a message
        that keeps failing waits longer each time: by default 1 s, 2 s, 4 s ... 1.0
        keeps the delay fixed.
    release_delay_max
        The longest a failed message is held back, however often it failed.
    max_receives
        A message received this many times whose handler fails again is a poison
        message: with a ``dead_letter`` queue (``LeaseManager``, the workers), it is
        copied there and deleted; without one it is left to the service (SQS's
        redrive policy, where the queue has one). None: no limit (the default; 5 when
        a ``dead_letter`` is given).
    max_concurrency
        Backend calls in flight at once from the scheduler's dispatch pool.
    coalesce_window
        How long a complete or release handed to ``complete_soon``/``release_soon``
        (what ``Worker`` uses) may wait for others to share its batch call. At
        most this much latency is added to a delete, and none when nobody else is
        expected within it. 0 sends each at once.
    stall_timeout
        Stop renewing a lease whose handler has shown no progress
        (``lease.progress()`` or ``lease.checkpoint(state)``) for this long, and
        report it lost (``stalled``): a hung handler lets its message go, which
        returns within one ``visibility_timeout``. ``None`` (the default): never.
        A handler that does not call ``progress()`` at least this often is let go
        too; see docs/outliving.md.
    on_cap
        What a lease does near the service's own cap on a message's invisibility
        (``backend.max_lease_age``: SQS 12 hours). ``"abandon"`` (the default):
        stop renewing at the cap and report it ``capped``. ``"rollover"``: set
        ``lease.rolling`` well before the cap, so the handler can raise
        ``leasekeeper.Rollover``: the message is sent again as a continuation
        carrying its last ``lease.checkpoint(state)``, and the original deleted.
    """

    visibility_timeout: float = 30.0
    timer_interval: float = 1.0
    extend_threshold: float | Literal["auto"] | None = None
    minimal_life: float = 2.0
    max_lease_duration: float | None = None
    release_delay: float = 1.0
    release_backoff: float = 2.0
    max_concurrency: int = 16
    coalesce_window: float = 0.02
    release_delay_max: float = 300.0
    max_receives: int | None = None
    stall_timeout: float | None = None
    on_cap: Literal["abandon", "rollover"] = "abandon"

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # frozen: normalise ints to floats once, here
        for name in _SECONDS_FIELDS:
            set_(self, name, _seconds(name, getattr(self, name)))
        set_(self, "release_delay", _seconds("release_delay", self.release_delay, allow_zero=True))
        set_(
            self,
            "coalesce_window",
            _seconds("coalesce_window", self.coalesce_window, allow_zero=True),
        )
        if self.max_lease_duration is not None:
            set_(
                self,
                "max_lease_duration",
                _seconds("max_lease_duration", self.max_lease_duration),
            )
        if self.stall_timeout is not None:
            set_(self, "stall_timeout", _seconds("stall_timeout", self.stall_timeout))
        if self.on_cap not in ON_CAP_CHOICES:
            raise ConfigError(
                f"on_cap must be one of {', '.join(map(repr, ON_CAP_CHOICES))}, got {self.on_cap!r}"
            )
        backoff = self.release_backoff
        try:
            valid = (
                not isinstance(backoff, bool)
                and isinstance(backoff, (int, float))
                and math.isfinite(backoff)
                and backoff >= 1.0
            )
        except OverflowError:  # an int beyond float range
            valid = False
        if not valid:
            raise ConfigError(f"release_backoff must be a finite number >= 1.0, got {backoff!r}")
        set_(self, "release_backoff", float(backoff))
        conc = self.max_concurrency
        if isinstance(conc, bool) or not isinstance(conc, int) or conc < 1:
            raise ConfigError(f"max_concurrency must be an integer >= 1, got {conc!r}")
        set_(
            self,
            "release_delay_max",
            _seconds("release_delay_max", self.release_delay_max, allow_zero=True),
        )
        if self.release_delay > self.release_delay_max:
            raise ConfigError(
                f"release_delay ({self.release_delay:g}) must not exceed release_delay_max "
                f"({self.release_delay_max:g})"
            )
        receives = self.max_receives
        if receives is not None and (
            isinstance(receives, bool) or not isinstance(receives, int) or receives < 1
        ):
            raise ConfigError(f"max_receives must be None or an integer >= 1, got {receives!r}")

        vis, tick, life = self.visibility_timeout, self.timer_interval, self.minimal_life
        if vis <= tick + life:
            # The sample's rule: a message registered with minimal_life left must
            # be extended before it runs out, and the scheduler may be a whole
            # timer_interval late.
            raise ConfigError(
                f"visibility_timeout ({vis:g}) must exceed timer_interval ({tick:g}) "
                f"+ minimal_life ({life:g})"
            )
        if self.extend_threshold is not None and self.extend_threshold != "auto":
            threshold = _seconds("extend_threshold", self.extend_threshold)
            if threshold <= tick:
                raise ConfigError(
                    f"extend_threshold ({threshold:g}) must exceed timer_interval ({tick:g}): "
                    "the scheduler may wake a whole interval late and still has to extend"
                )
            if threshold >= vis:
                raise ConfigError(
                    f"extend_threshold ({threshold:g}) must be less than visibility_timeout "
                    f"({vis:g}): otherwise every lease is due again as soon as it is extended"
                )
            set_(self, "extend_threshold", threshold)

    @property
    def threshold(self) -> float:
        """The extend threshold to start with: the configured one or the derived
        default (with ``"auto"``, the default until measurements take over)."""
        if isinstance(self.extend_threshold, float):
            return self.extend_threshold
        return max(self.timer_interval + self.minimal_life, self.visibility_timeout / 3.0)

    @property
    def adaptive(self) -> bool:
        """Does the threshold adapt to measurements (``extend_threshold="auto"``)?"""
        return self.extend_threshold == "auto"

    @property
    def threshold_bounds(self) -> tuple[float, float]:
        """What an adaptive threshold stays within: the sample's rule, and a cap that
        leaves a fifth of the timeout between renewals."""
        return self.timer_interval + self.minimal_life, 0.8 * self.visibility_timeout

    def check_backend(self, backend: object, max_visibility: float) -> None:
        """Raise ConfigError when this config asks more than ``backend`` can give."""
        if self.visibility_timeout > max_visibility:
            raise ConfigError(
                f"visibility_timeout ({self.visibility_timeout:g}) exceeds the backend's "
                f"max_visibility ({max_visibility:g}) for {backend!r}"
            )

    def failed_delay(self, receive_count: int, jitter: float = 1.0) -> float:
        """How long a message whose handler failed on its ``receive_count``-th receive
        stays invisible: ``release_delay`` grown by ``release_backoff`` per earlier
        receive, times ``jitter`` (0.8 to 1.2, drawn by the caller), at most
        ``release_delay_max``."""
        try:
            base = self.release_delay * self.release_backoff ** (max(1, receive_count) - 1)
        except OverflowError:  # a poison message received a thousand times
            base = math.inf
        return min(self.release_delay_max, base * jitter)

    def replace(self, **changes: Any) -> LeaseConfig:
        """A copy with some fields changed (validated like a new config)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_fields(cls, config: LeaseConfig | None, fields: dict[str, Any]) -> LeaseConfig:
        """Build the config from ``config=`` and/or keyword fields, rejecting unknown names."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(fields) - known)
        if unknown:
            raise ConfigError(
                f"unknown LeaseConfig field(s): {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        if config is None:
            return cls(**fields)
        if not isinstance(config, LeaseConfig):
            raise ConfigError(f"config must be a LeaseConfig, got {type(config).__name__}")
        return config.replace(**fields) if fields else config
