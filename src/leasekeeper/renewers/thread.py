"""``ThreadRenewer``: leases renewed in this process (``renewer="thread"``).

One scheduler thread and a bounded pool of dispatch threads (``_dispatch``), however
many leases: the renewal engine (``_engine``) with its extend pipeline
(``_extend``), the handler's operations (``_handler_ops``, ``_batch_ops``) and the
one ``Calls`` through which all of them reach the backends. This module only wires
them together behind the ``Renewer`` protocol (``leasekeeper.renewers.protocol``).

On a driven clock (``leasekeeper.testing.ManualClock``) there is no scheduler
thread: ``clock.advance()`` runs due work inline at each due time, in order.
"""

from __future__ import annotations

import os
import random
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, cast

from leasekeeper.backends.contract import Message
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.config import LeaseConfig
from leasekeeper.engine import (
    BatchOps,
    Calls,
    HandlerOps,
    RenewalEngine,
    ended_lease,
    not_a_message,
    one_by_one,
    overrides,
    singles,
)
from leasekeeper.engine.stats import Stats
from leasekeeper.failures import Failures
from leasekeeper.lease import Lease, OnLost, WatchLease
from leasekeeper.observers import Observer
from leasekeeper.reasons import LostReason
from leasekeeper.record import LeaseRecord

__all__ = ["ThreadRenewer"]


class ThreadRenewer:
    """Renews leases from a scheduler thread in this process.

    ``ThreadRenewer(config=None, *, clock=None, jitter_seed=None, executor=None,
    **config_fields)``. For tests and simulations: ``jitter_seed`` seeds the jitter
    of retry delays, so a run on a ManualClock replays exactly; ``executor`` (a
    ``concurrent.futures.Executor``) runs the extend calls instead of a pool of
    ``max_concurrency`` threads of its own.
    """

    name = "thread"

    def __init__(
        self,
        config: LeaseConfig | None = None,
        *,
        clock: Clock | None = None,
        jitter_seed: int | None = None,
        executor: Executor | None = None,
        **config_fields: Any,
    ) -> None:
        self._config = LeaseConfig.from_fields(config, config_fields)
        self._clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._on_lost: OnLost | None = None
        self._calls = Calls(on_error=self._count_callback_error)
        self._engine = RenewalEngine(
            self._config,
            self._clock,
            self._calls,
            on_lost=self._tell_lost,
            rng=None if jitter_seed is None else random.Random(jitter_seed),
            executor=executor,
        )
        self._ops = HandlerOps(
            self._engine,
            self._engine.gate,
            self._calls,
            config=self._config,
            clock=self._clock,
            rng=self._engine.rng,
            lock=self._engine.lock,
        )
        self._batch = BatchOps(
            self._ops, self._engine, self._calls, self._engine.records, self._engine.run_all
        )
        # Build the leases on register - Lease(owner, message, registered_at) - through
        # Lease.maker, which skips type.__call__'s dispatch to __init__ (hot path).
        # Their owner is this renewer: lease.complete() comes here, and so reaches a
        # subclass's own complete().
        self._new_lease = Lease.maker(self)
        self._new_watch = WatchLease.maker(self)
        self._register = self._engine.register
        if not overrides(self, ThreadRenewer, "complete"):
            # Half of the register/complete hot path: lease.complete() calls the
            # handler operations' complete directly, a frame less (~5 %).
            self.complete = self._ops.complete  # type: ignore[method-assign, assignment]
        # A subclass's own complete/release sees every lease of the batch forms.
        self._completes_one_by_one, self._releases_one_by_one = singles(self, ThreadRenewer)

    # ------------------------------------------------------------------ what it is

    @property
    def config(self) -> LeaseConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def closed(self) -> bool:
        return self._engine.closed

    @property
    def running(self) -> bool:
        return self._engine.running

    @property
    def pid(self) -> int:
        return os.getpid()

    def bind(self, on_lost: OnLost | None, failures: Failures | None = None) -> None:
        self._on_lost = on_lost
        if failures is not None:
            self._ops.failures = failures

    def _tell_lost(self, record: LeaseRecord, reason: LostReason) -> object:
        # Read at each call, so on_lost can be bound after construction. Every record
        # this engine ends is a Lease (made by _new_lease or _new_watch).
        callback = self._on_lost
        if callback is None or not isinstance(record, Lease):
            return None
        return callback(record, reason)

    def _count_callback_error(self) -> None:
        self._engine.count_callback_error()

    # ------------------------------------------------------------------ leases

    def start(self) -> None:
        self._engine.start()

    def register(self, message: Message) -> Lease:
        # Half of the register/complete hot path (the manager calls it directly).
        if not isinstance(message, Message):
            raise not_a_message(message)
        if message.ended_lease is not None and not self._engine.closed:
            ended = ended_lease(message, self)
            if ended is not None:
                return ended  # type: ignore[return-value]  # its lease: the same, not a second
        # Every record made here is a Lease (no typing.cast: it is a function call).
        return self._register(message, self._new_lease)  # type: ignore[return-value]

    def watch(self, message: Message) -> WatchLease:
        if not isinstance(message, Message):
            raise not_a_message(message)
        return cast("WatchLease", self._register(message, self._new_watch))

    def complete(self, lease: Lease) -> None:
        self._ops.complete(lease)

    def release(self, lease: Lease, delay: float | None = None) -> None:
        self._ops.release(lease, delay)

    def revoke(self, lease: Lease, delay: float = 0.0) -> None:
        self._ops.release(lease, delay, stop_handler=True)

    def forget(self, lease: Lease) -> None:
        self._ops.forget(lease)

    def fail(self, lease: Lease, error: BaseException | None, delay: float | None = None) -> None:
        self._ops.fail(lease, error, delay)

    def abandon(self, lease: Lease, reason: str) -> None:
        self._ops.abandon(lease, reason)

    def progress(self, lease: Lease) -> None:
        self._ops.progress(lease)

    def rolled_over(self, lease: Lease) -> None:
        self._ops.rolled_over(lease)

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        if self._completes_one_by_one:
            return one_by_one(self.complete, leases)
        return self._batch.complete_many(leases)

    def release_many(
        self, leases: Sequence[Lease], delay: float | None = None
    ) -> list[BaseException | None]:
        if self._releases_one_by_one:
            return one_by_one(lambda lease: self.release(lease, delay), leases)
        return self._batch.release_many(leases, delay)

    # ------------------------------------------------------------------ held leases
    # For an owner that leases many short jobs in bulk (the renewer process): a lease
    # held back from the schedule until its first renewal nears costs, when its job
    # ends before then, one share of a batch delete - no registration, no schedule.

    def hold(self, message: Message, late: bool = False) -> tuple[Lease, float] | None:
        """A lease on ``message``, made now and counted registered but not scheduled,
        and the clock time by which ``adopt`` must schedule it (a tick before its
        first renewal could fall due); None when it cannot wait (then ``register``
        it). Until then the owner keeps it: ``complete_held`` ends it, ``adopt``
        hands it over (before any other operation on it, or on another lease of its
        message). ``late``: held even when that time has passed (its owner must
        first learn something before it adopts it)."""
        if not isinstance(message, Message):
            raise not_a_message(message)
        return self._engine.hold(message, self._new_lease, late)  # type: ignore[return-value]

    def adopt(self, lease: Lease) -> None:
        """Schedule a lease from ``hold``: renewed from now on, as if registered when
        it was made. Raises ``ManagerClosed`` once closed."""
        self._engine.adopt(lease)

    def take_over(
        self,
        message: Message,
        *,
        registered_at: float,
        extensions: int = 0,
        progressed_at: float | None = None,
        watch: bool = False,
    ) -> Lease:
        """A lease another renewer held until it died (a renewer process replaced),
        renewed from now on as it was there: ``message`` carries its newest receipt
        and its deadline (``visible_until``); ``registered_at`` counts for
        ``max_lease_duration`` and stalls, as ``extensions`` and the handler's latest
        progress do. Not counted registered again. Raises ``ManagerClosed`` once
        closed."""
        if not isinstance(message, Message):
            raise not_a_message(message)
        lease = (self._new_watch if watch else self._new_lease)(message, registered_at)
        lease.extensions = extensions
        if progressed_at is not None:
            lease.progressed_at = progressed_at
        self._engine.adopt(lease)
        return lease

    def complete_held(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        """``complete_many`` of leases from ``hold`` that were never adopted."""
        if self._completes_one_by_one:  # a subclass's own complete sees each one
            for lease in leases:
                self._engine.adopt(lease)
            return self.complete_many(leases)
        return self._batch.complete_held(leases)

    def get(self, message: Message) -> Lease | None:
        return cast("Lease | None", self._engine.get(message))

    def leases(self) -> list[Lease]:
        return cast("list[Lease]", self._engine.records())

    def count(self) -> int:
        return self._engine.count()

    def stats(self) -> Stats:
        return self._engine.stats()

    def add_observer(self, observer: Observer) -> None:
        self._engine.add_observer(observer)

    def remove_observer(self, observer: Observer) -> None:
        self._engine.remove_observer(observer)

    def close(self, release: bool = True, timeout: float | None = None) -> None:
        deadline = None if timeout is None else self._clock.now() + timeout
        if not self._engine.stop(deadline):
            return
        if release:
            self._batch.release_all(deadline)
        self._engine.shutdown(deadline)

    # Driven-clock protocol (leasekeeper.clock.ClockDriven), for tests that step it.
    def next_wakeup(self) -> float | None:
        return self._engine.next_wakeup()

    def run_due(self) -> None:
        self._engine.run_due()

    def __repr__(self) -> str:
        engine = self._engine
        state = "closed" if engine.closed else ("running" if engine.started else "idle")
        return f"<ThreadRenewer {state} leases={engine.count()}>"
