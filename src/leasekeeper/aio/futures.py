"""Awaiting leasekeeper's thread-side results on an event loop, in one direction only.

``manager.complete_soon()``/``release_soon()`` return a ``concurrent.futures.Future``
that the coalescer's thread resolves. ``asyncio.wrap_future`` would make it
awaitable, but it chains cancellation *back*: a task cancelled while it awaits
cancels the concurrent future, and the thread that later resolves it fails on a
cancelled future. ``settled(future)`` copies the outcome to a fresh asyncio future
and nothing back: a waiter that is cancelled leaves the delete (or release) to go
ahead and be counted like any other.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["call_soon_threadsafe", "settled"]


def call_soon_threadsafe(
    loop: asyncio.AbstractEventLoop, callback: Callable[..., object], *args: Any
) -> bool:
    """Run ``callback(*args)`` on ``loop`` soon, from any thread; False when the loop
    is closed (nothing will run it)."""
    try:
        loop.call_soon_threadsafe(callback, *args)
    except RuntimeError:  # "Event loop is closed"
        return False
    return True


def settled(future: concurrent.futures.Future[T]) -> asyncio.Future[T]:
    """An asyncio future, on the running loop, with ``future``'s result or exception."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()

    def copy(done: concurrent.futures.Future[T]) -> None:  # on the loop
        if waiter.done():  # its awaiter was cancelled: nobody wants the answer
            return
        if done.cancelled():
            waiter.cancel()
            return
        error = done.exception()
        if error is None:
            waiter.set_result(done.result())
        else:
            waiter.set_exception(error)

    def resolved(done: concurrent.futures.Future[T]) -> None:  # on the resolving thread
        call_soon_threadsafe(loop, copy, done)

    future.add_done_callback(resolved)
    return waiter
