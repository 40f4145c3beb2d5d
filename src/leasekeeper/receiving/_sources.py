"""The queues a worker receives from, and which one the next receive goes to.

A worker may read several queues (``Worker([urgent, bulk], handler, weights=[3, 1])``).
Its handlers, manager and renewer are shared; what is each queue's own is here: a
``Source`` (the backend, its name, its weight, its figures) and ``Sources``, which
picks the queue of each receive.

Picking is a smooth weighted round-robin (nginx's): each pick adds every candidate's
weight to its credit, takes the one with the most credit and takes the candidates'
total off it. Over any stretch the picks follow the weights (3:1 gives
``a a b a`` ...), spread out rather than in runs, and no queue with a weight waits
longer than a round - a light queue is never starved.

An empty queue must not hold the others up: a long poll on it would stall receives
from a queue that has messages. So while some other queue may have messages, a
queue is asked with a *short* poll, and a queue that answered empty *rests*: it is
skipped for a while that doubles with each empty answer in a row (50 ms up to
``MAX_REST``) and ends with its first message. Only when every other queue rests is
one asked with a long poll, and never for longer than the next rest lasts, so a
message arriving on a resting queue waits at most about ``MAX_REST``. One queue
alone is asked exactly as before: long polls of ``wait_seconds``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from leasekeeper.backends.contract import Backend
from leasekeeper.backends.forwarding import ForwardingBackend
from leasekeeper.receiving.groups import is_ordered
from leasekeeper.receiving.stats import QueueStats

__all__ = [
    "FIRST_REST",
    "MAX_REST",
    "Source",
    "Sources",
    "queue_name",
    "unwrapped",
]

#: The longest an empty queue of a multi-queue worker is skipped (seconds).
MAX_REST = 1.0
#: How long a queue rests after its first empty answer (it doubles each time).
FIRST_REST = 0.05


def unwrapped(backend: object) -> object:
    """The backend a chain of ``ForwardingBackend`` wrappers ends at."""
    for _ in range(16):
        if not isinstance(backend, ForwardingBackend):
            break
        backend = backend.inner
    return backend


def queue_name(backend: object) -> str | None:
    """The queue's name where the backend knows it (``queue_name``; the last part of
    an SQS ``queue_url``; a MemoryQueue's ``name``), through any wrappers."""
    inner = unwrapped(backend)
    name = getattr(inner, "queue_name", None)
    if isinstance(name, str) and name:
        return name
    url = getattr(inner, "queue_url", None)
    if isinstance(url, str) and url.rstrip("/"):
        return url.rstrip("/").rsplit("/", 1)[-1]
    name = getattr(inner, "name", None)
    if isinstance(name, str) and name:
        return name
    return None


@dataclass
class Source:
    """One queue of a worker: its backend, name, weight and figures, whether it keeps
    message groups in order (``groups.is_ordered``), and where the picker stands
    with it."""

    backend: Backend
    name: str
    weight: int
    stats: QueueStats
    ordered: bool = False
    credit: int = 0  # the smooth round-robin's running credit
    rest_until: float = float("-inf")  # skipped until then: it answered empty
    empty: int = 0  # empty answers in a row


class Sources:
    """The queues of one worker and the choice of the next receive's (see the module
    docstring). Holds no lock: its worker makes one receive at a time."""

    def __init__(self, backends: Sequence[Backend], weights: Sequence[int] | None) -> None:
        if weights is None:
            weights = [1] * len(backends)
        if len(weights) != len(backends):
            raise ValueError(
                f"weights has {len(weights)} entries for {len(backends)} queues: give one a queue"
            )
        for weight in weights:
            if isinstance(weight, bool) or not isinstance(weight, int) or weight < 1:
                raise ValueError(f"weights must be integers >= 1, got {list(weights)!r}")
        names: list[str] = []
        for index, backend in enumerate(backends):
            name = queue_name(backend) or f"queue{index + 1}"
            if name in names:  # two queues of one name (two regions, two accounts)
                name = f"{name}#{index + 1}"
            names.append(name)
        self.all = [
            Source(backend, name, weight, QueueStats(), is_ordered(backend))
            for backend, name, weight in zip(backends, names, weights, strict=True)
        ]
        self._by_backend = {id(source.backend): source for source in self.all}

    @property
    def several(self) -> bool:
        return len(self.all) > 1

    def of(self, backend: object) -> Source | None:
        """The source whose backend ``backend`` is (a message's ``backend``)."""
        source = self._by_backend.get(id(backend))
        return source if source is not None and source.backend is backend else None

    def pick(self, now: float) -> tuple[Source, bool]:
        """The queue the next receive goes to, and whether it may long-poll (no other
        queue is awake to be stalled by it)."""
        if not self.several:
            return self.all[0], True
        awake = [source for source in self.all if source.rest_until <= now]
        # Every queue rests: the one whose rest ends first (credit breaks ties fairly).
        candidates = awake or [min(self.all, key=lambda s: s.rest_until)]
        total = 0
        for source in candidates:
            source.credit += source.weight
            total += source.weight
        chosen = max(candidates, key=lambda s: s.credit)
        chosen.credit -= total
        return chosen, len(awake) <= 1

    def long_poll(self, chosen: Source, now: float, wait_seconds: float) -> float:
        """How long ``chosen`` may be long-polled: ``wait_seconds``, but never past
        the moment another queue's rest ends."""
        wake = min((s.rest_until for s in self.all if s is not chosen), default=float("inf"))
        return max(0.0, min(wait_seconds, MAX_REST, wake - now))

    def answered(self, source: Source, got: int, now: float) -> None:
        """``source`` answered a receive with ``got`` messages."""
        if got or not self.several:
            source.empty = 0
            source.rest_until = float("-inf")
            return
        source.rest_until = now + min(MAX_REST, FIRST_REST * 2.0**source.empty)
        source.empty = min(source.empty + 1, 16)

    def next_receive(self, now: float) -> float:
        """When a receive could next find a queue awake (``now``: one is awake)."""
        return max(now, min(source.rest_until for source in self.all))
