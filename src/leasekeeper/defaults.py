"""Per-process default managers behind the module-level ``lease(msg)`` and ``@leased``.

One LeaseManager per backend, created on first use with the settings given to
``configure()``, closed (releasing what is still leased) at interpreter exit. A
forked child (multiprocessing, Spark's Python workers) starts with none: the
parent's scheduler thread does not exist in the child.

They renew as ``LeaseManager`` does by default (``renewer="auto"``): from a renewer
process wherever one can run, so a script killed by a signal gives its messages
back at once (the renewer process sees it die) and a busy script does not starve
its renewals; in a thread where no other process could renew (``MemoryQueue``, a
``ManualClock``, a wrapped backend, credentials only in code).
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable
from typing import Any, Literal, ParamSpec, TypeVar, overload

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.clock import Clock
from leasekeeper.config import LeaseConfig
from leasekeeper.decorator import wrap_in_lease
from leasekeeper.errors import LeaseError
from leasekeeper.lease import Lease, LeaseScope
from leasekeeper.manager import LeaseManager, OnLost

P = ParamSpec("P")
R = TypeVar("R")

# Guards _managers and _settings.
_defaults_lock = threading.Lock()
_managers: dict[int, LeaseManager] = {}
_settings: dict[str, Any] = {
    "config": LeaseConfig(),
    "on_lost": None,
    "clock": None,
    "renewer": "auto",
}


def configure(
    config: LeaseConfig | None = None,
    *,
    on_lost: OnLost | None = None,
    clock: Clock | None = None,
    renewer: Literal["auto", "process", "thread"] = "auto",
    **config_fields: Any,
) -> LeaseConfig:
    """Set what the default managers of ``receive()``, ``lease(msg)`` and ``@leased``
    use (``renewer``: where they renew, as ``LeaseManager`` takes it; ``"auto"``, the
    default, is a renewer process wherever one can run).

    Call it before the first ``lease()``. Default managers with no active lease are
    closed and recreated with the new settings on next use; if any still holds a
    lease, ``LeaseError`` is raised rather than silently applying new settings to
    some leases and not others.
    """
    new_config = LeaseConfig.from_fields(config, config_fields)
    with _defaults_lock:
        busy = [m for m in _managers.values() if m.leases()]
        if busy:
            raise LeaseError(
                f"configure() called while {len(busy)} default manager(s) hold leases; "
                "call it before the first lease(), or close them with leasekeeper.shutdown()"
            )
        old = list(_managers.values())
        _managers.clear()
        _settings.update(config=new_config, on_lost=on_lost, clock=clock, renewer=renewer)
    for manager in old:
        manager.close()
    return new_config


def default_manager(backend: Backend) -> LeaseManager:
    """The process's default LeaseManager for ``backend`` (created on first use)."""
    with _defaults_lock:
        manager = _managers.get(id(backend))
        if manager is None or manager.closed:
            manager = LeaseManager(
                backend,
                _settings["config"],
                on_lost=_settings["on_lost"],
                clock=_settings["clock"],
                renewer=_settings["renewer"],
            )
            _managers[id(backend)] = manager
        return manager


def receive(queue: Backend, max_messages: int = 1, wait_seconds: float = 0.0) -> list[Lease]:
    """``LeaseManager.receive`` on the default manager for ``queue``: up to
    ``max_messages`` messages, each leased from the instant it arrived.

    ``for held in leasekeeper.receive(queue, max_messages=10): with held: ...``
    """
    return default_manager(queue).receive(max_messages=max_messages, wait_seconds=wait_seconds)


def lease(message: Message, *, release_delay: float | None = None) -> LeaseScope:
    """``with lease(msg):`` on the default manager for the message's backend.

    Success deletes the message; an exception releases it (after ``release_delay``)
    and propagates; a lease lost meanwhile raises ``LeaseLost`` and deletes nothing.
    """
    if not isinstance(message, Message):
        raise TypeError(
            "lease() takes a leasekeeper Message (from backend.receive() or "
            f"backend.adopt(raw)), got {type(message).__module__}.{type(message).__qualname__}"
        )
    return default_manager(message.backend).lease(message, release_delay=release_delay)


@overload
def leased(func: Callable[P, R], /) -> Callable[P, R]: ...


@overload
def leased(
    func: None = None, /, *, manager: LeaseManager | None = None, release_delay: float | None = None
) -> Callable[[Callable[P, R]], Callable[P, R]]: ...


@overload
def leased(
    func: Callable[P, R] | None,
    /,
    *,
    manager: LeaseManager | None = None,
    release_delay: float | None = None,
) -> Any: ...


def leased(
    func: Callable[P, R] | None = None,
    /,
    *,
    manager: LeaseManager | None = None,
    release_delay: float | None = None,
) -> Any:
    """Wrap ``handler(message, ...)`` in a lease on ``message``.

    ``@leased``, ``@leased(manager=m, release_delay=5)`` or ``@manager.leased``:
    a normal return deletes the message, an exception releases it and propagates,
    and a lease lost meanwhile raises ``LeaseLost`` (nothing deleted). Without a
    manager, the per-process default manager of the message's backend is used.
    """

    def scope(message: Message) -> LeaseScope:
        if manager is not None:
            return manager.lease(message, release_delay=release_delay)
        return lease(message, release_delay=release_delay)

    return wrap_in_lease(func, scope)


def shutdown(release: bool = True, timeout: float | None = None) -> None:
    """Close every default manager (at exit this runs by itself)."""
    with _defaults_lock:
        managers = list(_managers.values())
        _managers.clear()
    for manager in managers:
        manager.close(release=release, timeout=timeout)


def _forget_after_fork() -> None:
    # The child has the parent's managers but not their threads, and perhaps a copy
    # of the lock taken by a parent thread mid-update: start afresh.
    global _defaults_lock  # noqa: PLW0603 - replacing a lock a dead thread may hold
    _defaults_lock = threading.Lock()
    _managers.clear()


atexit.register(shutdown)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
