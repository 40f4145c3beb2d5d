"""LeaseManager: the facade a worker uses - receive, register, lease, leased, watch,
get, close, stats.

Everything about keeping leases alive it asks of one ``Renewer``
(``leasekeeper.renewers.protocol``), chosen at construction: a ``ThreadRenewer`` (scheduler
thread and dispatch pool here), a ``ProcessRenewer`` (a renewer process of its own),
or any object implementing the protocol. What is the manager's own is what a
handler meets: receiving and registering at once, ``with`` scopes, decorators,
coalescing completes into batch calls, and ``on_lost``.

On a driven clock (``leasekeeper.testing.ManualClock``) the thread renewer has no
scheduler thread: ``clock.advance()`` runs due work inline at each due time, in
order, so tests are deterministic and fast.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.config import LeaseConfig
from leasekeeper.decorator import wrap_in_lease
from leasekeeper.engine import Coalescer, check_backend, register_each
from leasekeeper.engine.stats import Stats
from leasekeeper.errors import ConfigError, LeaseTooShort, ManagerClosed
from leasekeeper.failures import Failures, interrupted, resolve_dead_letter
from leasekeeper.lease import Lease, LeaseScope, OnLost, WatchLease
from leasekeeper.observers import Observer
from leasekeeper.reasons import LostReason
from leasekeeper.renewers.protocol import Renewer, RenewerChoice, make_renewer, unknown_renewer
from leasekeeper.rollover import unwrap

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["LeaseManager", "LeaseScope", "OnLost", "Stats"]

log = logging.getLogger("leasekeeper.manager")

P = ParamSpec("P")
R = TypeVar("R")


class LeaseManager:
    """Keeps registered messages invisible until they are completed or released.

    ``LeaseManager(backend=None, config=None, *, on_lost=None, clock=None,
    renewer="auto", **fields)``: keyword ``fields`` are a shortcut for
    ``config=LeaseConfig(**fields)``. ``backend`` is the queue ``receive()`` reads
    from; a manager renews messages of any backend, and naming one checks the
    config against its limits up front. ``on_lost(lease, reason)`` is called (from a
    leasekeeper thread) for every lease that is lost or abandoned, ``reason`` a
    ``LostReason``.

    ``renewer`` says who renews, once: ``"thread"`` (a scheduler thread here),
    ``"process"`` (a child process of its own - see docs/guide.md, "Choosing a
    renewer": a handler holding the GIL does not stop renewals, and when this process
    dies its leases are released at once; it needs a ``backend`` with ``spec()`` and
    the system clock), ``"auto"`` (the default, as for ``Worker``: the process where
    it can run, else the thread - always for a backend that cannot be rebuilt, a
    ``ManualClock``, an ``executor`` or a ``jitter_seed`` - with a warning when a
    renewer process failed to start), or a ``leasekeeper.Renewer`` you built (then
    give it the config and clock, not the manager).

    ``queues``: the other queues whose messages it renews, beside ``backend`` (a
    multi-queue worker's; only a renewer process needs to be told: it rebuilds every
    one of them).

    ``dead_letter``: where poison messages go - a message received ``max_receives``
    times (a config field; 5 when only ``dead_letter`` is given) whose handler fails
    again is sent there, then deleted (see ``leasekeeper.failures``): a backend, a
    queue URL, or the name of a queue beside ``backend`` (on Azure, ``"poison"`` is
    ``<queue>-poison``, created if missing).

    For tests and simulations: ``jitter_seed`` seeds the jitter of retry delays, so
    a run on a ManualClock replays exactly; ``executor`` (a
    ``concurrent.futures.Executor``) runs the extend calls instead of the thread
    renewer's own pool of ``max_concurrency`` threads.
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
        renewer: RenewerChoice | Renewer = "auto",
        dead_letter: Backend | str | None = None,
        queues: Sequence[Backend] = (),
        **config_fields: Any,
    ) -> None:
        if isinstance(renewer, str):
            self.config = LeaseConfig.from_fields(config, config_fields)
            clock = clock if clock is not None else SYSTEM_CLOCK
        elif isinstance(renewer, Renewer):
            given = [
                name
                for name, value in (
                    ("config", config),
                    ("clock", clock),
                    ("jitter_seed", jitter_seed),
                    ("executor", executor),
                )
                if value is not None
            ] + sorted(config_fields)
            if given:
                raise TypeError(
                    f"give {', '.join(given)} to the renewer, not to a LeaseManager built on one"
                )
            self.config = renewer.config
            clock = renewer.clock
        else:
            raise unknown_renewer(renewer)
        self.backend = backend
        if backend is not None:
            check_backend(backend, self.config)
        #: Every queue whose messages this manager is made to renew, ``backend``
        #: first (a multi-queue worker's; a renewer process rebuilds each).
        self.queues: tuple[Backend, ...] = tuple(
            dict.fromkeys([*([] if backend is None else [backend]), *queues])
        )
        for queue in self.queues[1:]:
            check_backend(queue, self.config)
        self.on_lost = on_lost
        self._renewer = make_renewer(
            renewer,
            backend=backend,
            queues=self.queues,
            config=self.config,
            clock=clock,
            jitter_seed=jitter_seed,
            executor=executor,
        )
        self.clock: Clock = self._renewer.clock
        #: What a handler's failure does: release with a growing delay, or send a
        #: poison message to ``dead_letter`` (``leasekeeper.failures``).
        self.failures = Failures(
            self.config,
            resolve_dead_letter(dead_letter, backend),
            None if jitter_seed is None else random.Random(jitter_seed),
        )
        self._renewer.bind(self._tell_lost, self.failures)
        # register() is the renewer's own, bound here: it is half of the register/
        # complete hot path (see ``make bench``), where a frame more costs ~5 %.
        self.register = self._renewer.register  # type: ignore[method-assign]
        # The completes and releases waiting to share a batch call (made on first use).
        self._coalesced: Coalescer | None = None
        self._coalescer_lock = threading.Lock()  # guards creating _coalesced

    @property
    def renewer(self) -> Renewer:
        """Who renews this manager's leases (``renewer.name``: "thread", "process")."""
        return self._renewer

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LeaseManager:
        """Start renewing; returns self once renewals can run. A renewer process
        builds its backend after the manager is made: this waits for it (ConfigError
        when it cannot). Implicit on the first register, which does not wait; the
        workers and ``receive()`` call it before they receive."""
        self._renewer.start()
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
        return self._renewer.closed

    @property
    def running(self) -> bool:
        """True while renewing: started, not closed, and its scheduler (or renewer
        process) alive - a liveness check for a health endpoint."""
        return self._renewer.running

    @property
    def renewer_pid(self) -> int:
        """The process that renews: this one's pid, or the renewer process's with
        ``renewer="process"`` (0 while it is being replaced)."""
        return self._renewer.pid

    def close(self, release: bool = True, timeout: float | None = None) -> None:
        """Stop renewing. With ``release=True`` (the default) every lease still active
        is released at once so other workers get its message without waiting out
        the timeout, and its handler sees ``lease.lost`` set (watch leases are
        forgotten instead: their owner ends them). With ``release=False`` active
        leases are left as they are, unrenewed: they may still be completed until
        they lapse. ``timeout`` bounds the wait for in-flight backend calls.
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
        self._renewer.close(release, timeout)

    # ------------------------------------------------------------------ registering

    def register(self, message: Message) -> Lease:
        """Start renewing ``message`` and return its lease.

        Raises ``LeaseTooShort`` if it has less than ``minimal_life`` of invisibility
        left and ``ManagerClosed`` after ``close()``. Registering a message that is
        already leased returns the same lease. (Replaced in ``__init__`` by the
        renewer's own ``register``, which does exactly this.)
        """
        return self._renewer.register(message)

    def register_many(self, messages: Sequence[Message]) -> list[Lease | Exception]:
        """``register`` each of ``messages`` (a receive's); returns, for each, its
        lease or the ``LeaseTooShort`` or ``ManagerClosed`` that register raised.
        A process renewer sends them to its renewer process in one write."""
        many = getattr(self._renewer, "register_many", None)
        if many is None:
            return register_each(self.register, messages)
        results: list[Lease | Exception] = many(messages)
        return results

    def watch(self, message: Message) -> WatchLease:
        """Renew ``message`` for an owner that ends it itself (a framework that acks,
        rejects or requeues it): leasekeeper never deletes or releases a watch lease.
        The owner calls ``lease.forget()`` once it has; a lost watch is reported like
        any lease. Raises as ``register`` does."""
        return self._renewer.watch(message)

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
        self.failures.announce(backend)  # once: where failing messages end
        if not (isinstance(wait_seconds, (int, float)) and not isinstance(wait_seconds, bool)):
            raise TypeError(f"wait_seconds must be a number of seconds, got {wait_seconds!r}")
        if not 0 <= wait_seconds < cfg.visibility_timeout - cfg.minimal_life:
            # The deadline counts from just before the receive is sent (rule 1): a
            # message that arrives at the end of a longer wait could not be leased.
            raise ValueError(
                f"wait_seconds ({wait_seconds!r}) must be >= 0 and less than "
                f"visibility_timeout - minimal_life ({cfg.visibility_timeout - cfg.minimal_life:g})"
            )
        self._renewer.start()  # renewals can run before anything is received
        messages = backend.receive(
            max_messages=max_messages,
            wait_seconds=wait_seconds,
            visibility_timeout=cfg.visibility_timeout,
        )
        leases: list[Lease] = []
        for index, message in enumerate(messages):
            try:
                # A continuation's envelope (on_cap="rollover") is not the handler's.
                leases.append(self.register(unwrap(message)))
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

    def _tell_lost(self, lease: Lease, reason: LostReason) -> object:
        # Read at each call, so on_lost can be set after construction.
        callback = self.on_lost
        return None if callback is None else callback(lease, reason)

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
        return self._renewer.complete_many(leases)

    def release_many(
        self, leases: Sequence[Lease], delay: float | None = None
    ) -> list[BaseException | None]:
        """Release several leases in batch calls; per lease what ``release(delay)``
        would do (None, or the exception it would have raised)."""
        return self._renewer.release_many(leases, delay)

    def complete_soon(self, lease: Lease, *, at_once: bool = False) -> Future[None]:
        """Complete ``lease`` in a batch call shared with the completes that arrive
        within ``coalesce_window``; returns at once. The future's result is None,
        or the exception ``lease.complete()`` would have raised. ``at_once``: sent now,
        not at the window's end (a FIFO group's next message waits on the answer).
        See docs/guide.md, "Coalesced completes"."""
        return self._coalescer().complete(lease, at_once=at_once)

    def complete_soon_then(
        self, lease: Lease, then: Callable[[BaseException | None], object], *, at_once: bool = False
    ) -> None:
        """``complete_soon`` for a caller that only needs the answer: ``then(error)`` is
        called with it (None, or what ``lease.complete()`` would have raised) on the
        coalescer's thread, and must not raise or block. No Future is made: what
        ``Worker`` uses for each message."""
        self._coalescer().complete_then(lease, then, at_once=at_once)

    def release_soon(self, lease: Lease, delay: float | None = None) -> Future[None]:
        """``release(delay)`` the way ``complete_soon`` completes."""
        return self._coalescer().release(lease, delay)

    def release_many_soon(
        self, leases: Sequence[Lease], delay: float | None = None
    ) -> list[Future[None]]:
        """``release_many`` the way ``release_soon`` releases: one batch call (per
        ``max_batch``), one ``delay``; a future a lease (a FIFO group's, together)."""
        return self._coalescer().release_all(leases, delay)

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

    def fail(
        self, lease: Lease, error: BaseException | None = None, delay: float | None = None
    ) -> None:
        """``lease``'s handler failed (with ``error``): release its message after
        ``delay`` (default: ``release_delay`` grown per receive, jittered), or, when it
        is a poison message and there is a dead-letter queue, send it there and delete
        it. One WARNING line says which. What ``with held:`` does on an exception."""
        self._renewer.fail(lease, error, delay)

    def fail_soon(
        self, lease: Lease, error: BaseException | None = None, delay: float | None = None
    ) -> Future[None]:
        """``fail`` through the coalescer, as ``release_soon`` releases (what the
        workers use); a poison message is dead-lettered at once, before it returns."""
        failures = self.failures  # (an interrupted handler - Ctrl-C - did not fail)
        poison = not interrupted(error) and failures.dead_letters(lease)
        # The workers swallow the handler's exception: its traceback goes in the line.
        if poison and failures.dead_letter_now(lease, error, traceback=True):
            done: Future[None] = Future()
            done.set_result(None)
            return done
        seconds = 0.0 if interrupted(error) else failures.delay_for(lease, delay)
        future = self.release_soon(lease, seconds)
        failures.warn_released(lease, error, seconds, traceback=True)
        return future

    def revoke(self, lease: Lease, delay: float = 0.0) -> None:
        """Release ``lease`` under its handler's feet (a shutdown): the message goes
        back after ``delay`` and the handler sees ``lease.lost`` set."""
        self._renewer.revoke(lease, delay)

    def get(self, message: Message) -> Lease | None:
        """The active lease on ``message``, if any."""
        return self._renewer.get(message)

    def leases(self) -> list[Lease]:
        """A snapshot list of the active leases."""
        return self._renewer.leases()

    # ------------------------------------------------------------------ observing

    def add_observer(self, observer: Observer) -> None:
        """Tell ``observer`` (a ``leasekeeper.observers.Observer``) what this manager
        does from now on: every backend call, extension, lapse and ended lease."""
        if not isinstance(observer, Observer):
            raise TypeError(f"add_observer() takes an Observer, got {type(observer).__name__}")
        self._renewer.add_observer(observer)

    def remove_observer(self, observer: Observer) -> None:
        """Stop telling ``observer``; removing one not added does nothing."""
        self._renewer.remove_observer(observer)

    def stats(self) -> Stats:
        """A snapshot of the counters, scheduler lag and extend latency."""
        stats = self._renewer.stats()
        return dataclasses.replace(stats, dead_lettered=self.failures.dead_lettered)

    def next_wakeup(self) -> float | None:
        """When the renewer next has work due, on its clock (None: none, or a renewer
        that does not say - a renewer process keeps its own time)."""
        next_wakeup: Callable[[], float | None] | None = getattr(self._renewer, "next_wakeup", None)
        return None if next_wakeup is None else next_wakeup()

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return (
            f"<LeaseManager {state} renewer={self._renewer.name} leases={self._renewer.count()} "
            f"visibility_timeout={self.config.visibility_timeout:g}s>"
        )
