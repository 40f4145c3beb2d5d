"""LeaseManager: the facade a worker uses - register, lease, leased, get, close, stats.

Behind it (see docs/design.md, "Module map"):

- ``_schedule``: which leases exist and when each is due (pure data);
- ``_engine``: the renewal engine - extend pipeline, outcomes, retry policy;
- ``_dispatch``: the scheduler thread and the dispatch pool that run it;
- ``_handler_ops``: complete, release and close()'s release of everything;
- ``_metrics``: counters, timing samples, rate-limited warnings.

On a driven clock (``leasekeeper.testing.ManualClock``) there is no scheduler
thread: ``clock.advance()`` runs due work inline at each due time, in order, so
tests are deterministic and fast.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any, Literal, ParamSpec, TypeVar, cast

from leasekeeper._batch_ops import BatchOps
from leasekeeper._coalesce import Coalescer
from leasekeeper._engine import RenewalEngine, check_backend
from leasekeeper._handler_ops import HandlerOps
from leasekeeper._metrics import Stats
from leasekeeper._process import ProcessRenewer
from leasekeeper._record import LeaseRecord
from leasekeeper.backends.base import Backend, Message
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.config import LeaseConfig
from leasekeeper.decorator import wrap_in_lease
from leasekeeper.errors import ConfigError, LeaseTooShort, ManagerClosed
from leasekeeper.lease import Lease, LeaseScope, WatchLease
from leasekeeper.observers import Observer

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["LeaseManager", "LeaseScope", "OnLost", "Stats"]

log = logging.getLogger("leasekeeper.manager")

P = ParamSpec("P")
R = TypeVar("R")

OnLost = Callable[[Lease, str], object]


class LeaseManager:
    """Keeps registered messages invisible until they are completed or released.

    ``LeaseManager(backend=None, config=None, *, on_lost=None, clock=None, **fields)``:
    keyword ``fields`` are a shortcut for ``config=LeaseConfig(**fields)``.
    ``backend`` is optional: a manager renews messages of any backend; naming one
    checks the config against its limits up front. ``on_lost(lease, reason)`` is
    called (from a leasekeeper thread) for every lease that is lost or abandoned.

    ``renewer="process"`` renews in a child process of its own (see
    docs/guide.md, "Choosing a renewer"): a handler holding the GIL does not stop
    renewals, and when this process dies its leases are released at once. It needs
    a ``backend`` with ``spec()`` (SQS, MNS, Azure) and the system clock.

    For tests and simulations: ``jitter_seed`` seeds the jitter of retry delays, so
    a run on a ManualClock replays exactly; ``executor`` (a
    ``concurrent.futures.Executor``) runs the extend calls instead of the manager's
    own pool of ``max_concurrency`` threads.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        config: LeaseConfig | None = None,
        *,
        on_lost: OnLost | None = None,
        clock: Clock | None = None,
        jitter_seed: int | None = None,
        executor: Executor | None = None,
        renewer: Literal["thread", "process"] = "thread",
        **config_fields: Any,
    ) -> None:
        self.config = LeaseConfig.from_fields(config, config_fields)
        self.backend = backend
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self.on_lost = on_lost
        self._engine = RenewalEngine(
            self.config,
            self.clock,
            on_lost=self._tell_lost,
            rng=None if jitter_seed is None else random.Random(jitter_seed),
            executor=executor,
        )
        self._ops = HandlerOps(self._engine)
        self._batch = BatchOps(self._ops)
        # Builds the lease on register: Lease(owner, message, registered_at), through
        # Lease.maker, which skips type.__call__'s dispatch to __init__ (hot path).
        self._new_lease = Lease.maker(self._ops)
        self._new_watch = WatchLease.maker(self._ops)
        if backend is not None:
            check_backend(backend, self.config)
        # The completes and releases waiting to share a batch call (made on first use).
        self._coalesced: Coalescer | None = None
        self._coalescer_lock = threading.Lock()  # guards creating _coalesced
        if renewer not in ("thread", "process"):
            raise ConfigError(f"renewer must be 'thread' or 'process', got {renewer!r}")
        self.renewer = renewer
        # The out-of-process renewer, when there is one: then every lease operation
        # goes there, and the thread-mode engine above stays idle.
        self._remote: ProcessRenewer | None = None
        self._owner: object = self._ops  # what a lease of this manager has as its owner
        if renewer == "process":
            if backend is None:
                raise ConfigError("renewer='process' needs the backend to rebuild there")
            self._remote = ProcessRenewer(backend, self.config, self.clock, on_lost=self._tell_lost)
            self._owner = self._remote

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LeaseManager:
        """Start the scheduler. Implicit on the first register; returns self."""
        if self._remote is None:
            self._engine.start()
        elif self._remote.closed:
            raise ManagerClosed("this LeaseManager is closed")
        return self

    def __enter__(self) -> LeaseManager:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._engine.closed if self._remote is None else self._remote.closed

    @property
    def running(self) -> bool:
        """True while renewing: started, not closed, and its scheduler thread alive
        (a liveness check for a health endpoint)."""
        if self._remote is not None:
            return self._remote.running
        return self._engine.dispatcher.running

    @property
    def renewer_pid(self) -> int:
        """The process that renews: this one's pid, or the renewer process's with
        ``renewer="process"`` (0 while it is being replaced)."""
        if self._remote is None:
            return os.getpid()
        return self._remote.pid

    def close(self, release: bool = True, timeout: float | None = None) -> None:
        """Stop renewing. With ``release=True`` (the default) every lease still active
        is released at once so other workers get its message without waiting out
        the timeout, and its handler sees ``lease.lost`` set. With ``release=False``
        active leases are left as they are, unrenewed: they may still be completed
        until they lapse. ``timeout`` bounds the wait for in-flight backend calls.
        Closing twice does nothing.
        """
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not (timeout >= 0 and math.isfinite(timeout))
        ):
            # Checked before anything changes: a half-closed manager releases nothing.
            raise ValueError(f"close() timeout must be None or seconds >= 0, got {timeout!r}")
        if self._coalesced is not None:
            # Deletes first: a message whose handler succeeded is not released.
            self._coalesced.close(timeout)
        if self._remote is not None:
            self._remote.close(release, timeout)
            return
        deadline = None if timeout is None else self.clock.now() + timeout
        dispatcher = self._engine.dispatcher
        if not dispatcher.stop(deadline):
            return
        if release:
            self._batch.release_all(deadline)
        dispatcher.shutdown(deadline)

    # ------------------------------------------------------------------ registering

    def register(self, message: Message) -> Lease:
        """Start renewing ``message`` and return its lease.

        Raises ``LeaseTooShort`` if it has less than ``minimal_life`` of invisibility
        left and ``ManagerClosed`` after ``close()``. Registering a message that is
        already leased returns the same lease.
        """
        if not isinstance(message, Message):  # inline: the register hot path
            self._check_message(message)
        ended_ref = message.ended_lease
        if ended_ref is not None and not self.closed:
            ended = ended_ref()
            if isinstance(ended, Lease) and ended.owner is self._owner:
                return ended  # its lease ended: the same lease, not a second one
        if self._remote is not None:
            return self._remote.register(message)
        # Every record this manager's engine makes is a Lease (no typing.cast here: it
        # is a function call, and this is the register/complete hot path).
        return self._engine.register(message, self._new_lease)  # type: ignore[return-value]

    def watch(self, message: Message) -> WatchLease:
        """Renew ``message`` for an owner that ends it itself (a framework that acks,
        rejects or requeues it): leasekeeper never deletes or releases a watch lease.
        The owner calls ``lease.forget()`` once it has; a lost watch is reported like
        any lease. Raises as ``register`` does."""
        self._check_message(message)
        if self._remote is not None:
            return self._remote.register(message, watch=True)  # type: ignore[return-value]
        return self._engine.register(message, self._new_watch)  # type: ignore[return-value]

    def receive(self, max_messages: int = 1, wait_seconds: float = 0.0) -> list[Lease]:
        """Receive up to ``max_messages`` messages from the manager's backend (waiting
        up to ``wait_seconds`` for the first) and return them leased: each is renewed
        from the instant it arrived, so a message waiting its turn in the list never
        burns its invisibility. Use each as ``with held:`` (complete on success,
        release on an exception).

        A message that arrives with less than ``minimal_life`` of its invisibility
        left (a long poll that outlasted it) is not leased: it is left to reappear,
        with a warning.
        """
        backend = self.backend
        if backend is None:
            raise ConfigError(
                "receive() needs a backend: LeaseManager(queue, ...) receives from `queue`"
            )
        if self.closed:
            raise ManagerClosed("this LeaseManager is closed; it receives nothing")
        cfg = self.config
        if not (isinstance(wait_seconds, (int, float)) and not isinstance(wait_seconds, bool)):
            raise TypeError(f"wait_seconds must be a number of seconds, got {wait_seconds!r}")
        if not 0 <= wait_seconds < cfg.visibility_timeout - cfg.minimal_life:
            # The deadline counts from just before the receive is sent (rule 1): a
            # message that arrives at the end of a longer wait could not be leased.
            raise ValueError(
                f"wait_seconds ({wait_seconds!r}) must be >= 0 and less than "
                f"visibility_timeout - minimal_life ({cfg.visibility_timeout - cfg.minimal_life:g})"
            )
        messages = backend.receive(
            max_messages=max_messages,
            wait_seconds=wait_seconds,
            visibility_timeout=cfg.visibility_timeout,
        )
        leases: list[Lease] = []
        for index, message in enumerate(messages):
            try:
                leases.append(self.register(message))
            except LeaseTooShort as exc:
                log.warning("%s; leaving it to reappear", exc)
            except ManagerClosed:
                # Closed under us: hand back what was not leased, so nobody waits a
                # whole timeout for it.
                rest = [m.handle for m in messages[index:]]
                with contextlib.suppress(Exception):
                    backend.release(rest, 0.0)
                raise
        return leases

    def _tell_lost(self, record: LeaseRecord, reason: str) -> object:
        # Read at each call, so on_lost can be set after construction. The engine
        # ends LeaseRecords; every record this manager registers is a Lease.
        callback = self.on_lost
        if callback is None or not isinstance(record, Lease):
            return None
        return callback(record, reason)

    @staticmethod
    def _check_message(message: object) -> None:
        if not isinstance(message, Message):
            raise TypeError(
                "register() takes a leasekeeper Message (from backend.receive() or "
                f"backend.adopt(raw)), got {type(message).__module__}."
                f"{type(message).__qualname__}"
            )

    def lease(self, message: Message, *, release_delay: float | None = None) -> LeaseScope:
        """``with manager.lease(msg) as lease:`` - see ``LeaseScope``."""
        return LeaseScope(self.register, message, release_delay)

    def leased(
        self, func: Callable[P, R] | None = None, *, release_delay: float | None = None
    ) -> Any:
        """Decorator: ``@manager.leased`` or ``@manager.leased(release_delay=5)``."""

        def scope(message: Message) -> LeaseScope:
            return self.lease(message, release_delay=release_delay)

        return wrap_in_lease(func, scope)

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        """Complete several leases in batch calls (one per ``max_batch`` leases of a
        backend). For each lease, in order: None when its message was deleted (or
        it was completed already), else the exception ``lease.complete()`` would
        have raised (``LeaseLost``, ``BackendError``, ...). One entry that fails
        fails only its lease."""
        if self._remote is not None:
            return self._remote.complete_many(leases)
        return self._batch.complete_many(leases)

    def release_many(
        self, leases: Sequence[Lease], delay: float | None = None
    ) -> list[BaseException | None]:
        """Release several leases in batch calls; per lease what ``release(delay)``
        would do (None, or the exception it would have raised)."""
        if self._remote is not None:
            return self._remote.release_many(leases, delay)
        return self._batch.release_many(leases, delay)

    def complete_soon(self, lease: Lease) -> Future[None]:
        """Complete ``lease`` in a batch call shared with the completes that arrive
        within ``coalesce_window``; returns at once. The future's result is None,
        or the exception ``lease.complete()`` would have raised. See
        docs/guide.md, "Coalesced completes"."""
        return self._coalescer().complete(lease)

    def release_soon(self, lease: Lease, delay: float | None = None) -> Future[None]:
        """``release(delay)`` the way ``complete_soon`` completes."""
        return self._coalescer().release(lease, delay)

    def flush(self, timeout: float | None = None) -> None:
        """Send the completes and releases waiting to be coalesced, and wait for
        their answers (``close()`` does this before it releases anything)."""
        if self._coalesced is not None:
            self._coalesced.flush(timeout)

    def _coalescer(self) -> Coalescer:
        coalesced = self._coalesced
        if coalesced is None:
            with self._coalescer_lock:
                if self._coalesced is None:
                    self._coalesced = Coalescer(
                        self.complete_many, self.release_many, self.config.coalesce_window
                    )
                coalesced = self._coalesced
        return coalesced

    def revoke(self, lease: Lease, delay: float = 0.0) -> None:
        """Release ``lease`` under its handler's feet (a shutdown): the message goes
        back after ``delay`` and the handler sees ``lease.lost`` set."""
        if self._remote is not None:
            self._remote.revoke(lease, delay)
            return
        self._ops.release(lease, delay, stop_handler=True)

    def get(self, message: Message) -> Lease | None:
        """The active lease on ``message``, if any."""
        if self._remote is not None:
            return self._remote.get(message)
        return cast("Lease | None", self._engine.get(message))

    def leases(self) -> list[Lease]:
        """A snapshot list of the active leases."""
        if self._remote is not None:
            return self._remote.leases()
        return cast("list[Lease]", self._engine.records())

    # ------------------------------------------------------------------ observing

    def add_observer(self, observer: Observer) -> None:
        """Tell ``observer`` (a ``leasekeeper.observers.Observer``) what this manager
        does from now on: every backend call, extension, lapse and ended lease."""
        if not isinstance(observer, Observer):
            raise TypeError(f"add_observer() takes an Observer, got {type(observer).__name__}")
        if self._remote is not None:
            self._remote.add_observer(observer)
            return
        self._engine.add_observer(observer)

    def remove_observer(self, observer: Observer) -> None:
        """Stop telling ``observer``; removing one not added does nothing."""
        if self._remote is not None:
            self._remote.remove_observer(observer)
            return
        self._engine.remove_observer(observer)

    def stats(self) -> Stats:
        """A snapshot of the counters, scheduler lag and extend latency."""
        if self._remote is not None:
            return self._remote.stats()
        return self._engine.stats()

    # Driven-clock protocol (leasekeeper.clock.ClockDriven), for tests that step it.
    def next_wakeup(self) -> float | None:
        return self._engine.dispatcher.next_wakeup()

    def run_due(self) -> None:
        self._engine.dispatcher.run_due()

    def __repr__(self) -> str:
        vis = self.config.visibility_timeout
        if self._remote is not None:
            state = "closed" if self._remote.closed else "running"
            leases = self._remote.count()
            return (
                f"<LeaseManager {state} renewer=process leases={leases} "
                f"visibility_timeout={vis:g}s>"
            )
        engine = self._engine
        state = "closed" if engine.closed else ("running" if engine.started else "idle")
        return f"<LeaseManager {state} leases={engine.count()} visibility_timeout={vis:g}s>"
