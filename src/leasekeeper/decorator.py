"""Wrap a handler so it runs under a lease on the message it is given.

``wrap_in_lease`` is the one place the ``@leased`` forms are built: the manager's
``@manager.leased`` and the module-level ``@leased`` (``leasekeeper.defaults``)
each pass it the scope to open around a call. It imports neither, so there is no
import cycle between the manager and the per-process defaults.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, ParamSpec, TypeVar

from leasekeeper.backends.contract import Message

P = ParamSpec("P")
R = TypeVar("R")

ScopeFactory = Callable[[Message], AbstractContextManager[Any]]

#: Set on every ``@leased`` wrapper (the sync and the ``leasekeeper.aio`` one): the
#: handler it wraps. A worker that leases each message itself runs that handler, so a
#: decorated handler given to it is not wrapped twice (which deletes each message
#: twice: the second delete finds the receipt gone and counts the message lost).
LEASED_HANDLER = "__leasekeeper_handler__"


def mark_leased(wrapper: Callable[..., Any], handler: Callable[..., Any]) -> None:
    """Say that ``wrapper`` is ``handler`` under ``@leased`` (see ``LEASED_HANDLER``)."""
    setattr(wrapper, LEASED_HANDLER, handler)


def undecorated(handler: Callable[..., Any]) -> Callable[..., Any] | None:
    """The handler inside a ``@leased`` wrapper, or None if ``handler`` is not one."""
    inner = getattr(handler, LEASED_HANDLER, None)
    return inner if callable(inner) else None


def find_message(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Message:
    """The first Message among the arguments, so methods (self, message) work too."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, Message):
            return value
    raise TypeError("a @leased handler must be called with a leasekeeper Message argument")


def wrap_in_lease(func: Callable[P, R] | None, scope: ScopeFactory) -> Any:
    """``func`` wrapped to run inside ``scope(message)``; without ``func``, a decorator.

    A normal return deletes the message, an exception releases it and propagates,
    and a lease lost meanwhile raises ``LeaseLost`` (nothing deleted).
    """

    def wrap(handler: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(handler)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            with scope(find_message(args, kwargs)):
                return handler(*args, **kwargs)

        mark_leased(run, handler)
        return run

    return wrap(func) if func is not None else wrap
