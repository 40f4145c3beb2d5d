"""What a worker counts: ``worker.stats`` (a ``WorkerStats``), in total and per queue."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["QueueStats", "WorkerStats"]


@dataclass
class QueueStats:
    """A worker's figures: in total (``worker.stats``) and per queue
    (``worker.stats.per_queue[name]``, the same fields without ``per_queue``).
    Every field counts messages since the worker was made, except
    ``groups_waiting``: how many message groups of an ordered (FIFO) queue wait on
    an earlier message of theirs now."""

    received: int = 0
    completed: int = 0
    failed: int = 0  # handler raised: message released
    lost: int = 0  # lease lost while handling: nothing deleted
    refused: int = 0  # received with too little invisibility left to lease
    rolled_over: int = 0  # handed on as a continuation before the service's cap
    dead_lettered: int = 0  # handler raised on the last try: sent to the dead-letter queue
    # An ordered (FIFO) queue's message released unhandled, with an earlier message of
    # its group that failed (or was lost, or rolled over): the group comes back from it.
    held_back: int = 0
    interrupted: int = 0  # handler stopped by SystemExit, Ctrl-C...: released at once, no failure
    # A gauge, not a count: the message groups now waiting on an earlier message of
    # theirs (held, leased and renewed, not handled yet). Never by group id.
    groups_waiting: int = 0


@dataclass
class WorkerStats(QueueStats):
    """``QueueStats`` in total, and ``per_queue``: by queue name, each queue's own."""

    per_queue: dict[str, QueueStats] = field(default_factory=dict)
