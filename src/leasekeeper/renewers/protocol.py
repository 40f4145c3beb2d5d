"""Who renews a manager's leases: the ``Renewer`` protocol, and choosing one.

A ``LeaseManager`` is a facade: receiving, scopes, decorators and coalescing are
its own, and everything about keeping leases alive it asks of one ``Renewer``,
chosen once at construction and never asked about again:

- ``renewer="thread"``: ``ThreadRenewer``, a scheduler thread and a dispatch pool
  in this process (``leasekeeper.renewers.thread``);
- ``renewer="process"``: ``ProcessRenewer``, a renewer process of its own that a
  handler holding the GIL cannot stop, and that releases everything at once when
  this process dies (``leasekeeper.renewers.process``);
- ``renewer="auto"``: the process renewer where it can run (a backend that can be
  rebuilt in another process, the system clock, a process that may start one and
  build the backend there: ``auto`` waits until it renews), else the thread
  renewer - with one two-line WARNING, the reason and what is lost, when starting
  the renewer process failed. ``LeaseManager``, ``Worker``, ``AsyncWorker`` and
  ``leasekeeper worker`` choose this by default (a thread-renewer setting -
  ``executor``, ``jitter_seed`` - given to it takes the thread renewer);
- any object implementing ``Renewer``: a test's, or a user's own.

A renewer owns the leases it makes: ``lease.complete()``, ``release()`` and
``forget()`` go to it (``Lease.owner``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.backends.spec import spec_of
from leasekeeper.clock import Clock, SystemClock
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import ConfigError
from leasekeeper.failures import Failures
from leasekeeper.lease import Lease, LeaseOwner, WatchLease
from leasekeeper.observers import Observer
from leasekeeper.reasons import LostReason

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from leasekeeper.engine.stats import Stats

__all__ = ["OnLost", "Renewer", "RenewerChoice", "make_renewer", "unknown_renewer"]

log = logging.getLogger("leasekeeper.renewer")

#: ``on_lost(lease, reason)``: called for every lease that is lost or abandoned.
OnLost = Callable[[Lease, LostReason], object]
RenewerChoice = Literal["thread", "process", "auto"]

#: What a worker loses when it renews in a thread because no renewer process started.
WITHOUT_PROCESS = (
    "renewing in a thread of this process instead: a handler that holds the GIL can "
    "delay renewals until leases lapse, and a killed worker's messages stay hidden until "
    "their visibility timeout (renewer='thread' chooses this without a warning)"
)
# The prefix of a ConfigError from a renewer process that did not start: said once.
_NOT_STARTED = "the renewer process could not start: "


@runtime_checkable
class Renewer(LeaseOwner, Protocol):
    """What a ``LeaseManager`` asks of whoever renews its leases.

    Registering returns the handler's ``Lease``, whose ``owner`` is this renewer:
    everything the lease asks (``LeaseOwner``: ``complete``, ``release``, ``forget``,
    ``fail``, ``abandon``, ``progress``, ``rolled_over``) comes back here, so a
    subclass of a standard renewer that overrides one of them sees every call (its
    batch forms then go one lease at a time, unless it overrides those too). Lost
    and abandoned leases are reported to the callback given to ``bind`` (from a
    leasekeeper thread).
    ``complete_many``/``release_many`` answer per lease: None, or the exception the
    single form would have raised. ``close(release=True)`` releases every active
    lease (watch leases are forgotten) and takes no new ones.
    """

    @property
    def name(self) -> str:
        """What to call it in logs and status lines ("thread", "process", ...)."""
        ...

    @property
    def config(self) -> LeaseConfig: ...

    @property
    def clock(self) -> Clock: ...

    @property
    def closed(self) -> bool: ...

    @property
    def running(self) -> bool:
        """Renewing now (a health check): started, not closed, its machinery alive."""
        ...

    @property
    def pid(self) -> int:
        """The process that renews (0 while a renewer process is being replaced)."""
        ...

    def bind(self, on_lost: OnLost | None, failures: Failures | None = None) -> None:
        """Where to report lost and abandoned leases from now on, and (when given) the
        policy a handler's failure follows (``fail``)."""
        ...

    def start(self) -> None:
        """Start renewing; return once renewals can run (ConfigError when they
        cannot, ManagerClosed once closed)."""
        ...

    def register(self, message: Message) -> Lease: ...

    def watch(self, message: Message) -> WatchLease: ...

    def complete(self, lease: Lease) -> None: ...

    def release(self, lease: Lease, delay: float | None = None) -> None: ...

    def progress(self, lease: Lease) -> None:
        """The handler made progress (``stall_timeout``)."""
        ...

    def rolled_over(self, lease: Lease) -> None:
        """Count a rollover: the continuation was sent and the original deleted."""
        ...

    def revoke(self, lease: Lease, delay: float = 0.0) -> None:
        """Release under the handler's feet (a shutdown): ``lease.lost`` is set."""
        ...

    def forget(self, lease: Lease) -> None: ...

    def fail(self, lease: Lease, error: BaseException | None, delay: float | None = None) -> None:
        """The handler failed: release the message, or dead-letter a poison one."""
        ...

    def abandon(self, lease: Lease, reason: str) -> None:
        """Stop renewing: the handler succeeded but its delete keeps failing."""
        ...

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]: ...

    def release_many(
        self, leases: Sequence[Lease], delay: float | None = None
    ) -> list[BaseException | None]: ...

    def get(self, message: Message) -> Lease | None: ...

    def leases(self) -> list[Lease]: ...

    def count(self) -> int: ...

    def stats(self) -> Stats: ...

    def add_observer(self, observer: Observer) -> None: ...

    def remove_observer(self, observer: Observer) -> None: ...

    def close(self, release: bool = True, timeout: float | None = None) -> None: ...


def make_renewer(
    choice: RenewerChoice | Renewer,
    *,
    backend: Backend | None,
    config: LeaseConfig,
    clock: Clock,
    jitter_seed: int | None = None,
    executor: Executor | None = None,
    queues: Sequence[Backend] = (),
) -> Renewer:
    """The renewer ``choice`` names, built for ``backend`` and ``config`` (and, for a
    renewer process, the other ``queues`` whose messages it must renew too)."""
    others = tuple(queue for queue in queues if queue is not backend)

    def thread() -> Renewer:
        from leasekeeper.renewers.thread import ThreadRenewer

        return ThreadRenewer(config, clock=clock, jitter_seed=jitter_seed, executor=executor)

    if choice == "auto":
        if executor is not None or jitter_seed is not None:
            # Settings only the thread renewer has: asking for them is choosing it.
            log.debug("renewing in a thread: executor or jitter_seed given")
            return thread()
        return _process_or_thread(backend, others, config, clock) or thread()
    if choice == "thread":
        return thread()
    if choice == "process":
        if backend is None:
            raise ConfigError("renewer='process' needs the backend to rebuild there")
        from leasekeeper.renewers.process import ProcessRenewer

        return ProcessRenewer(backend, config, clock=clock, queues=others)
    if isinstance(choice, Renewer):
        return choice
    raise unknown_renewer(choice)


def unknown_renewer(choice: object) -> ConfigError:
    """The error for a ``renewer=`` that names no renewer."""
    return ConfigError(
        "renewer must be 'thread', 'process', 'auto' or a Renewer instance "
        f"(leasekeeper.ThreadRenewer, leasekeeper.ProcessRenewer, or your own), got {choice!r}"
    )


def _process_or_thread(
    backend: Backend | None, others: Sequence[Backend], config: LeaseConfig, clock: Clock
) -> Renewer | None:
    """A renewer process renewing ``backend``'s messages, once it serves; None for
    the thread renewer. A backend that cannot be rebuilt in another process (an
    in-memory queue, a wrapper) or a clock that is not the system's loses nothing
    there: said at debug level. Any other reason the renewer process cannot start
    or build its backend - credentials it could not have, a sandbox, an SDK
    missing - is one WARNING: the reason, once, and what renewing in a thread costs."""
    if backend is None or not isinstance(clock, SystemClock):
        return None
    try:
        for queue in (backend, *others):
            spec_of(queue)
    except Exception as exc:
        log.debug("renewing in a thread: %s", exc)
        return None
    from leasekeeper.renewers.process import ProcessRenewer

    renewer: ProcessRenewer | None = None
    try:
        for queue in (backend, *others):
            problem = getattr(queue, "credentials_problem", lambda: None)()
            if problem:
                raise ConfigError(problem)
        renewer = ProcessRenewer(backend, config, clock=clock, queues=others)
        renewer.start()  # built its backend: what could fail there has failed
        return renewer
    except Exception as exc:
        reason = str(exc) if isinstance(exc, ConfigError) else f"{type(exc).__name__}: {exc}"
        reason = reason.removeprefix(_NOT_STARTED).splitlines()[0] if reason else "no reason given"
        log.warning("%s%s\n%s", _NOT_STARTED, reason, WITHOUT_PROCESS)
    if renewer is not None:
        with contextlib.suppress(Exception):
            renewer.close(release=False, timeout=5.0)
    return None
