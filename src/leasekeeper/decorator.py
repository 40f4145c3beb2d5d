"""``@leased``: run a handler under a lease on the message it is given."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from leasekeeper.backends.base import Message

if TYPE_CHECKING:
    from leasekeeper.manager import LeaseManager

P = ParamSpec("P")
R = TypeVar("R")


def _find_message(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Message:
    # The first Message among the arguments, so methods (self, message) work too.
    for value in (*args, *kwargs.values()):
        if isinstance(value, Message):
            return value
    raise TypeError("a @leased handler must be called with a leasekeeper Message argument")


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
    and a lease lost meanwhile raises ``LeaseLost`` (nothing deleted).
    """

    def wrap(handler: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(handler)
        def run(*args: P.args, **kwargs: P.kwargs) -> R:
            message = _find_message(args, kwargs)
            if manager is not None:
                scope = manager.lease(message, release_delay=release_delay)
            else:
                from leasekeeper.defaults import lease

                scope = lease(message, release_delay=release_delay)
            with scope:
                return handler(*args, **kwargs)

        return run

    return wrap(func) if func is not None else wrap
