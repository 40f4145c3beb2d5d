"""``@leased`` for ``async def`` handlers: the coroutine runs under ``async with lease(msg)``."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar, cast, overload

from leasekeeper.aio.held import lease
from leasekeeper.decorator import find_message, mark_leased
from leasekeeper.manager import LeaseManager

__all__ = ["leased"]

P = ParamSpec("P")
R = TypeVar("R")

AsyncHandler = Callable[P, Coroutine[Any, Any, R]]


@overload
def leased(func: AsyncHandler[P, R], /) -> AsyncHandler[P, R]: ...


@overload
def leased(
    func: None = None,
    /,
    *,
    manager: LeaseManager | None = None,
    release_delay: float | None = None,
    cancel_on_lost: bool = False,
) -> Callable[[AsyncHandler[P, R]], AsyncHandler[P, R]]: ...


def leased(
    func: AsyncHandler[P, R] | None = None,
    /,
    *,
    manager: LeaseManager | None = None,
    release_delay: float | None = None,
    cancel_on_lost: bool = False,
) -> Any:
    """Wrap ``async def handler(message, ...)`` in a lease on ``message``.

    ``@leased``, or ``@leased(manager=m, release_delay=5, cancel_on_lost=True)``: a
    normal return deletes the message, an exception releases it and propagates, and
    a lease lost meanwhile raises ``LeaseLost`` (nothing deleted). Without a
    manager, the per-process default manager of the message's backend is used.
    Inside, ``leasekeeper.aio.current_lease()`` is the handler's ``AsyncLease``.
    """

    def wrap(handler: AsyncHandler[P, R]) -> AsyncHandler[P, R]:
        if not inspect.iscoroutinefunction(handler):
            raise TypeError(
                f"leasekeeper.aio.leased wraps an async def handler; {handler!r} is not "
                "one (use leasekeeper.leased for a plain function)"
            )

        @functools.wraps(handler)
        async def run(*args: P.args, **kwargs: P.kwargs) -> R:
            scope = lease(
                find_message(args, kwargs),
                manager=manager,
                release_delay=release_delay,
                cancel_on_lost=cancel_on_lost,
            )
            async with scope:
                return await handler(*args, **kwargs)
            return cast(R, None)  # it raised Rollover: the job was handed on

        mark_leased(run, handler)
        return run

    return wrap(func) if func is not None else wrap
