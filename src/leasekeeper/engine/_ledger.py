"""``Ledger``: what the renewal engine offers the collaborators that act on leases.

The extender (``_extend``), the handler's operations (``_handler_ops``) and their
batch forms (``_batch_ops``) each end leases, reschedule them and count what they
did, and nothing more of the engine: they get a ``Ledger`` (the engine implements
it), the ``Calls`` they make and the ``OpGate`` of rule 4 - never the engine's lock,
schedule or dispatcher. Every method takes the engine's registry lock itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from leasekeeper.engine._schedule import Lane
from leasekeeper.reasons import Ending
from leasekeeper.record import LeaseRecord, LeaseState

#: The counters a collaborator bumps (fields of ``_metrics.Metrics``).
Counter = Literal[
    "extended", "extend_calls", "extend_errors", "retries", "scheduler_errors", "rolled_over"
]


class Ledger(Protocol):
    @property
    def threshold(self) -> float:
        """The extend threshold in force (adapted with ``extend_threshold="auto"``)."""
        ...

    def end(
        self, record: LeaseRecord, state: LeaseState, ending: Ending, *, stop_handler: bool = False
    ) -> None:
        """End an active lease (once): unschedule it, count it, and queue the handler's
        signal and ``on_lost`` for ``drain``. ``stop_handler``: signal a released one."""
        ...

    def end_completed(self, record: LeaseRecord) -> None:
        """``end(record, COMPLETED, ...)`` and give the lease back (``OpGate.give``)
        under the same lock: the hot path's one call for both."""
        ...

    def adopt(self, record: LeaseRecord) -> None:
        """Schedule a lease its owner held back until now (``RenewalEngine.adopt``)."""
        ...

    def end_held(self, records: Sequence[LeaseRecord]) -> None:
        """End held leases never scheduled, their messages deleted in time:
        completed, counted, told to observers."""
        ...

    def reschedule(self, record: LeaseRecord, due: float | None = None) -> None:
        """Schedule an active lease again (at its natural due time by default)."""
        ...

    def watch_deadlines(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        """Watch the deadlines of ``records`` while their extend call is out."""
        ...

    def bump(self, counter: Counter, n: int = 1) -> None:
        """Add ``n`` to one of the engine's counters."""
        ...

    def count_lapses(self, records: Sequence[LeaseRecord], now: float) -> None:
        """Count (and log, rate-limited) leases whose deadline passed unextended."""
        ...

    def timed(self, send_lag: float, latency: float) -> bool:
        """Record one extend call's send lag and latency; True when the margin
        warning (rule 3) is due now."""
        ...

    def adapt_threshold(self, now: float) -> None: ...

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` on the dispatch pool (inline where there is none)."""
        ...

    def drain(self) -> None:
        """Tell handlers and ``on_lost`` of the leases that ended, outside every lock."""
        ...
