"""``ForwardingBackend``: the base of wrappers (fault injection, latency, spies):
every call goes to the inner backend, and the messages it returns name the
wrapper as their backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from leasekeeper.backends.contract import (
    Backend,
    BackendSpec,
    Counter,
    Handle,
    Message,
    Operation,
    Outcome,
    QueueCounts,
)
from leasekeeper.clock import Clock
from leasekeeper.errors import ConfigError

# ---------------------------------------------------------------------- wrappers
# The optional constants a wrapper copies from the backend it wraps.
_COPIED = (
    "max_receive",
    "max_wait_seconds",
    "max_lease_age",
    "carries_attributes",
    "clock",
    "fifo",
)


class ForwardingBackend:
    """A backend that forwards every call to the backend it wraps: the base of
    wrappers that add faults, latency, counting or journaling around another.

    The contract, for people writing one:

    - ``ForwardingBackend(inner)``: ``self.inner`` is the wrapped backend. Its
      ``max_batch``, ``max_visibility`` and ``rotates_receipts``, and
      ``max_receive``, ``max_wait_seconds``, ``max_lease_age``,
      ``carries_attributes``, ``clock`` and ``fifo`` when it has them, are copied at
      construction (they are constants of a backend); ``send`` (with any options it
      takes: a FIFO queue's ``group_id``) and ``queue_counts`` are forwarded.
    - Every message ``receive`` and ``adopt`` hand out passes through
      ``wrap(message)``, which re-points it at the wrapper (``message.backend =
      self``: the inner backend just made that message and nobody else holds it)
      so the manager sends its extends, deletes and releases through the wrapper.
      Override ``wrap`` to look at each message (call ``super().wrap``).
    - ``extend``, ``delete`` and ``release`` call the inner backend's directly, one
      method call each. Override the ones you need and call ``super()`` (or
      ``forward``) to reach the inner backend; each must answer one ``Outcome``
      per handle, in order. ``forward(operation, handles, arg)`` is the same
      three calls by name, for a wrapper that treats them alike.
    - Errors pass through untouched: a failed receive still raises the inner
      backend's ``ReceiveError``.
    """

    max_batch: int
    max_visibility: float
    rotates_receipts: bool
    # Set only when the inner backend has them (read with getattr by Worker and spark,
    # and the clock by wrappers of wrappers).
    max_receive: int
    max_wait_seconds: float
    max_lease_age: float
    carries_attributes: bool
    clock: Clock
    fifo: bool

    def __init__(self, inner: Backend) -> None:
        if not isinstance(inner, Backend):
            raise TypeError(
                f"{type(self).__name__} wraps a leasekeeper backend, got {type(inner).__name__}"
            )
        self.inner = inner
        self.max_batch = inner.max_batch
        self.max_visibility = inner.max_visibility
        self.rotates_receipts = inner.rotates_receipts
        for name in _COPIED:
            if hasattr(inner, name):
                setattr(self, name, getattr(inner, name))

    def wrap(self, message: Message) -> Message:
        """Re-point ``message`` (just made by the inner backend) at this wrapper."""
        message.backend = self
        return message

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        wrap = self.wrap
        return [
            wrap(message)
            for message in self.inner.receive(max_messages, wait_seconds, visibility_timeout)
        ]

    def adopt(self, raw: Any, visibility_timeout: float | None = None) -> Message:
        return self.wrap(self.inner.adopt(raw, visibility_timeout))

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        return self.inner.extend(handles, timeout)

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        return self.inner.delete(handles)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        return self.inner.release(handles, delay)

    def send(
        self,
        body: str | bytes,
        attributes: Mapping[str, str] | None = None,
        *,
        delay: float = 0.0,
        **options: Any,
    ) -> str:
        """The inner backend's ``send`` (AttributeError where it has none), with the
        options it takes (``group_id=`` on a FIFO queue)."""
        send: Any = self.inner.send  # type: ignore[attr-defined]
        return str(send(body, attributes, delay=delay, **options))

    def queue_counts(self) -> QueueCounts:
        """The inner backend's ``queue_counts`` (AttributeError where it has none)."""
        counter: Counter = self.inner  # type: ignore[assignment]
        return counter.queue_counts()

    def forward(self, operation: Operation, handles: Sequence[Handle], arg: float) -> list[Outcome]:
        """The inner backend's ``operation``; ``arg`` is the extend's timeout or the
        release's delay (ignored for a delete)."""
        if operation == "extend":
            return self.inner.extend(handles, arg)
        if operation == "release":
            return self.inner.release(handles, arg)
        if operation == "delete":
            return self.inner.delete(handles)
        raise ValueError(f"unknown operation {operation!r}")

    def spec(self) -> BackendSpec:
        """A wrapper's faults, latency or counting live in this process: it cannot be
        rebuilt in another one. Override to return the inner backend's spec when
        renewing without the wrapper is what you want."""
        raise ConfigError(
            f"{type(self).__name__} wraps {self.inner!r} in this process and cannot be "
            "rebuilt in another one (renewer='process' needs a backend with spec())"
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.inner!r})"
