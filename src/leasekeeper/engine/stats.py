"""``Stats``: the snapshot of a manager's counters that ``LeaseManager.stats()``
returns (the engine's ``Metrics`` keeps the counters themselves).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Stats:
    """A snapshot of a manager's counters. Times are seconds."""

    in_flight: int
    registered: int
    extended: int  # leases successfully extended (one per lease per extension)
    extend_calls: int  # backend extend calls (a batch is one call)
    extend_errors: int  # entries that came back retry/fatal, or calls that raised
    retries: int
    lost: int
    completed: int
    released: int
    abandoned: int
    capped: int  # abandoned because the service's total-visibility cap was reached
    lapses: int  # deadlines that passed before a successful extend was sent
    callback_errors: int
    scheduler_errors: int
    margin_warnings: int  # times lag + call latency ate into the extend threshold
    scheduler_lag_p50: float  # how late the scheduler woke for the earliest due lease
    scheduler_lag_p99: float
    send_lag_p50: float  # due -> extend sent: wake lag plus waiting for a dispatch thread
    send_lag_p99: float
    extend_latency_p50: float
    extend_latency_p99: float
    extend_threshold: float = 0.0  # the threshold in force (adapted with "auto")
    forgotten: int = 0  # watch leases whose owner took the message back (lease.forget())
    rolled_over: int = 0  # jobs handed on to a continuation before the service's cap
    #: Lost and abandoned leases by ``LostReason`` value ("lapsed", "rejected", ...).
    lost_reasons: dict[str, int] = field(default_factory=dict)
    #: Poison messages sent to the dead-letter queue (and deleted from theirs).
    dead_lettered: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __getitem__(self, name: str) -> Any:
        """``stats["dead_lettered"]``: a field by name, as ``as_dict()`` has it."""
        if name not in self.__dataclass_fields__:
            raise KeyError(name)
        return getattr(self, name)
