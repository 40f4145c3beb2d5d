"""``StatsBook``: a process renewer's figures, summed over the renewer processes it ran.

A renewer process counts what it renews; when it dies its figures would die with
it, so the worker's side keeps what the dead ones had counted and adds the
current one's latest, and what only the worker sees (rollovers, its callbacks that
raised).
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

from leasekeeper.engine.stats import Stats
from leasekeeper.reasons import LostReason


class StatsBook:
    """A process renewer's figures: what renewers that died had counted, the latest
    figures of the current one, and the rollovers counted here (they happen in the
    worker, which sends the continuation)."""

    def __init__(self) -> None:
        self.base = _zero_stats()  # what renewers that died had counted
        self.last = _zero_stats()  # the latest figures of the current one
        self.rolled_over = 0
        self.completed = 0  # deleted by the worker itself (``renewers._own``)
        self.callback_errors = 0  # on_lost and observers that raised here
        self._lock = threading.Lock()  # guards callback_errors

    def count_callback_error(self) -> None:
        with self._lock:
            self.callback_errors += 1

    def renewer_died(self, lost: int) -> None:
        """The current renewer died; ``lost`` of its leases count as lost (those whose
        deadline passed before another took them over, or all when none could)."""
        base = _sum_stats(self.base, self.last)
        self.last = _zero_stats()
        died = dict(base.lost_reasons)
        if lost:
            died[LostReason.RENEWER_DIED.value] = died.get(LostReason.RENEWER_DIED.value, 0) + lost
        self.base = dataclasses.replace(base, lost=base.lost + lost, lost_reasons=died)

    def total(self, payload: object, *, in_flight: int) -> Stats:
        """The figures, with ``payload`` (a ``Stats``) as the current renewer's newest."""
        if isinstance(payload, Stats):
            self.last = payload
        total = _sum_stats(self.base, self.last)
        return dataclasses.replace(
            total,
            in_flight=in_flight,
            rolled_over=total.rolled_over + self.rolled_over,
            completed=total.completed + self.completed,
            callback_errors=total.callback_errors + self.callback_errors,
        )


def _zero_stats() -> Stats:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Stats):
        values[f.name] = {} if f.name == "lost_reasons" else 0 if f.type in ("int", int) else 0.0
    return Stats(**values)


def _sum_stats(a: Stats, b: Stats) -> Stats:
    """Counters add up; percentiles are the newer renewer's."""
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Stats):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, dict):
            fields[f.name] = {k: x.get(k, 0) + y.get(k, 0) for k in {*x, *y}}
        else:
            fields[f.name] = x + y if isinstance(x, int) else y
    return Stats(**fields)
