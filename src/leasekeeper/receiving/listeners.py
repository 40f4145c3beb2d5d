"""What a worker tells the parts that follow its life: ``WorkerListener``.

A worker's receive loop announces five moments to the listeners in
``worker.listeners``: it began receiving, it went from holding no message to
holding some (before their handlers start), it holds none again, its graceful
shutdown began, and it ended. ECS scale-in protection, the Kubernetes probes and
the interruption-notice watch (``leasekeeper.fleet``) are listeners; so can a class
of your own be. The moments are few - one pair per busy spell, not one per message -
and are told by the loop's driver off its locks (``Worker``: the receive loop's
thread; ``AsyncWorker``: its one thread, never the event loop), so a listener may
make a short blocking call. A listener that raises is logged, never fatal: the
worker goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

__all__ = ["EVENTS", "Listeners", "WorkerListener"]

log = logging.getLogger("leasekeeper.worker")

#: The moments a worker announces, in the order they come.
EVENTS = ("started", "busy", "idle", "draining", "stopped")


class WorkerListener:
    """Hears a worker's moments; override what you need (each does nothing here).

    - ``started()``: ``run()`` is about to receive.
    - ``busy()``: the worker holds messages after holding none; their handlers start
      when this returns (so it may wait briefly: ECS protection is set here).
    - ``idle()``: every message it held is handled and settled, and nothing new came
      in a whole receive.
    - ``draining()``: the graceful shutdown began (a signal, ``stop()``, ``drain()``,
      an interruption notice, ``until_idle``): nothing more is received.
    - ``stopped()``: ``run()`` is over: handlers finished or their messages released,
      the deletes sent. Told even when ``run()`` failed before ``started()``.
    """

    def started(self) -> None:
        """``run()`` is about to receive."""

    def busy(self) -> None:
        """The worker holds messages after holding none (their handlers wait for this)."""

    def idle(self) -> None:
        """The worker holds nothing again."""

    def draining(self) -> None:
        """The graceful shutdown began: nothing more is received."""

    def stopped(self) -> None:
        """``run()`` is over."""


class Listeners:
    """A worker's listeners: ``add(listener)``, ``remove(listener)``; the loop's driver
    calls ``announce(event)`` for each moment (see the module docstring)."""

    def __init__(self) -> None:
        self._listeners: tuple[WorkerListener, ...] = ()

    def add(self, listener: WorkerListener) -> None:
        """Tell ``listener`` from the next moment on (add before ``run()``)."""
        if not isinstance(listener, WorkerListener):
            raise TypeError(f"add() takes a WorkerListener, got {type(listener).__name__}")
        self._listeners = (*self._listeners, listener)

    def remove(self, listener: WorkerListener) -> None:
        """Stop telling ``listener``; removing one not added does nothing."""
        self._listeners = tuple(each for each in self._listeners if each is not listener)

    def __bool__(self) -> bool:
        return bool(self._listeners)

    def __iter__(self) -> Iterator[WorkerListener]:
        return iter(self._listeners)

    def __len__(self) -> int:
        return len(self._listeners)

    def announce(self, event: str) -> None:
        """Tell every listener ``event`` (one of ``EVENTS``), in the order they were
        added; one that raises is logged and the others are told all the same."""
        for listener in self._listeners:
            try:
                getattr(listener, event)()
            except Exception:
                log.exception("worker listener %r failed on %r", listener, event)
