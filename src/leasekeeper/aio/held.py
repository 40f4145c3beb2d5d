"""What an async handler holds: ``AsyncLease``, its ``lost`` signal, ``async with lease(msg)``.

``AsyncLease`` wraps the handler's ``Lease`` for a coroutine: the same read-only
view (``state``, ``extensions``, ``check()``, ...), ``await held.complete()`` and
``await held.release()`` (through the manager's coalescer, so the event loop never
waits on a service call), and ``held.lost``, an ``asyncio.Event``-like signal:
``await held.lost.wait()`` returns once the handler no longer owns the message.

Renewals never run on the loop: they stay on the manager's scheduler thread (or
in its renewer process), so a coroutine that blocks the loop does not stop them.
A lost lease reaches the loop through the manager's ``LostRelay`` (``aio.lost``):
no thread, task or timer per lease.

With ``cancel_on_lost=True`` a lost lease also cancels the task that holds it, and
the scope (or ``AsyncWorker``) turns that cancellation into ``LeaseLost``. It is off
by default: the cancellation lands at whatever ``await`` the handler is at, which
may be between two side effects that belong together (a row written, its
acknowledgement not yet sent). Checking ``held.check()`` before an irreversible
step, or racing work against ``held.lost.wait()``, stops at a point you chose.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
from typing import TYPE_CHECKING

from leasekeeper.aio.futures import call_soon_threadsafe, settled
from leasekeeper.aio.lost import LostRelay, relay_for
from leasekeeper.backends.contract import Message
from leasekeeper.defaults import default_manager
from leasekeeper.errors import BackendError, LeaseLost
from leasekeeper.lease import Lease, LeaseState, settle_rollover
from leasekeeper.manager import LeaseManager
from leasekeeper.rollover import Lineage, Rollover, unwrap

if TYPE_CHECKING:
    from types import TracebackType

__all__ = ["AsyncLease", "AsyncLeaseScope", "LostEvent", "current_lease", "lease"]

log = logging.getLogger("leasekeeper.aio")

_LOST_STATES = (LeaseState.LOST, LeaseState.ABANDONED)

_current: contextvars.ContextVar[AsyncLease | None] = contextvars.ContextVar(
    "leasekeeper_current_lease", default=None
)


def current_lease() -> AsyncLease:
    """The ``AsyncLease`` the running task holds: inside ``async with lease(msg)``, an
    ``@leased`` coroutine or an ``AsyncWorker`` handler. Raises ``LookupError``
    elsewhere."""
    held = _current.get()
    if held is None:
        raise LookupError("this task holds no leasekeeper lease")
    return held


class LostEvent:
    """Set when the handler no longer owns the message: its lease was lost,
    abandoned, or released under it (shutdown). Like ``asyncio.Event``:
    ``is_set()`` and ``await wait()``; it is set by leasekeeper only."""

    __slots__ = ("_held",)

    def __init__(self, held: AsyncLease) -> None:
        self._held = held

    def is_set(self) -> bool:
        return self._held.is_lost

    async def wait(self) -> bool:
        """Return True once set (at once if it is)."""
        if self._held.is_lost:
            return True
        await self._held.lost_signal().wait()
        return True

    def __repr__(self) -> str:
        return f"<LostEvent {'set' if self.is_set() else 'unset'} id={self._held.id!r}>"


class AsyncLease:
    """One message's lease, held by a coroutine (see the module docstring).

    ``lease`` is the underlying ``Lease``; ``manager`` the manager that renews it.
    """

    __slots__ = (
        "_cancelled",
        "_done",
        "_event",
        "_loop",
        "_relay",
        "_task",
        "_token",
        "_watching",
        "lease",
        "manager",
    )

    def __init__(
        self,
        lease: Lease,
        manager: LeaseManager,
        relay: LostRelay,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.lease = lease
        self.manager = manager
        self._relay = relay
        self._loop = loop
        self._event: asyncio.Event | None = None  # made when someone waits for lost
        self._task: asyncio.Task[object] | None = None  # cancelled on a loss, if asked
        self._watching = False
        self._cancelled = False  # a loss cancelled _task
        self._done = False  # the handler is done with it: watch no more
        self._token: contextvars.Token[AsyncLease | None] | None = None

    # ------------------------------------------------------------------ the lease

    @property
    def message(self) -> Message:
        return self.lease.message

    @property
    def id(self) -> str:
        return self.lease.id

    @property
    def state(self) -> LeaseState:
        return self.lease.state

    @property
    def reason(self) -> str | None:
        return self.lease.reason

    @property
    def extensions(self) -> int:
        return self.lease.extensions

    @property
    def is_lost(self) -> bool:
        return self.lease.is_lost

    @property
    def lost(self) -> LostEvent:
        """Set when the handler no longer owns the message: ``await held.lost.wait()``."""
        return LostEvent(self)

    def visible_for(self) -> float:
        return self.lease.visible_for()

    def check(self) -> None:
        """Raise ``LeaseLost`` if the handler no longer owns the message, and
        ``Rollover`` once it is to hand the job on (``rolling`` is set)."""
        self.lease.check()

    # Long jobs (docs/outliving.md): as the lease's own.

    def progress(self) -> None:
        """Say the handler is making progress (``stall_timeout``)."""
        self.lease.progress()

    def checkpoint(self, state: object) -> None:
        """Save ``state`` (JSON) for a rollover to carry on; counts as progress."""
        self.lease.checkpoint(state)

    @property
    def rolling(self) -> threading.Event:
        """Set when the job is to roll over (``on_cap="rollover"``): ``is_set()``."""
        return self.lease.rolling

    @property
    def resumed(self) -> object:
        """The checkpoint this continuation carries; None on an original."""
        return self.lease.resumed

    @property
    def lineage(self) -> Lineage:
        """``(first_id, hop)`` of this message's job."""
        return self.lease.lineage

    async def complete(self) -> None:
        """Delete the message (in a batch call shared with other completes); raises
        what ``Lease.complete()`` would."""
        await settled(self.manager.complete_soon(self.lease))

    async def release(self, delay: float | None = None) -> None:
        """Make the message visible again after ``delay``; raises what
        ``Lease.release()`` would."""
        await settled(self.manager.release_soon(self.lease, delay))

    async def fail(self, error: BaseException | None = None, delay: float | None = None) -> None:
        """The handler failed with ``error``: release the message after ``delay`` (default:
        the delay that grows per receive), or send a poison message to the manager's
        dead-letter queue - ``LeaseManager.fail``, on a thread (the copy is a service
        call) so the loop never waits on it."""
        future = await asyncio.to_thread(self.manager.fail_soon, self.lease, error, delay)
        await settled(future)

    def __repr__(self) -> str:
        return f"<AsyncLease {self.lease!r}>"

    # ------------------------------------------------------------------ a handler's turn

    def begin(self, *, cancel_on_lost: bool = False) -> None:
        """The running task starts handling: this becomes its ``current_lease()``, and
        with ``cancel_on_lost`` a loss cancels the task. Ended by ``end()``."""
        self._token = _current.set(self)
        if cancel_on_lost:
            self._task = asyncio.current_task()
            self._watch()

    def end(self) -> bool:
        """The task is done handling: no more cancelling or watching. True when a
        loss cancelled the task and nobody else did: the ``CancelledError`` it
        raised is this lease's loss, and the task is no longer being cancelled."""
        if self._token is not None:
            _current.reset(self._token)
            self._token = None
        self._done = True
        if self._watching:
            self._watching = False
            self._relay.unwatch(self.lease, self._notify)
        task, self._task = self._task, None
        if not self._cancelled:
            return False
        self._cancelled = False
        uncancel = getattr(task, "uncancel", None)  # Python >= 3.11
        if uncancel is None:
            return True
        return int(uncancel()) == 0

    def lost_signal(self) -> asyncio.Event:
        """The asyncio.Event behind ``lost`` (made, and the lease watched, on first use)."""
        event = self._event
        if event is None:
            event = self._event = asyncio.Event()
            if self.lease.is_lost:
                event.set()
            elif not self._done:
                self._watch()
        return event

    def _watch(self) -> None:
        if not self._watching and not self._done:
            self._watching = True
            self._relay.watch(self.lease, self._notify)

    def _notify(self) -> None:  # on the thread the lease ended on
        call_soon_threadsafe(self._loop, self._ended)

    def _ended(self) -> None:  # on the loop
        lease = self.lease
        self._watching = False  # the relay has dropped the watch
        if not (lease.is_lost or lease.state in _LOST_STATES):
            return  # completed or released by its own handler
        if self._event is not None:
            self._event.set()
        task = self._task
        if task is not None and not self._done and not self._cancelled and not task.done():
            self._cancelled = True
            task.cancel(f"leasekeeper: lease on message {lease.id!r} lost")


class AsyncLeaseScope:
    """``async with lease(msg) as held:``: complete on success, release on error.

    On normal exit the message is deleted (the loop is not blocked: the delete goes
    through the manager's coalescer); if the lease was lost meanwhile, ``LeaseLost``
    is raised instead and nothing is deleted. On an exception - a cancellation
    included - the message is released (after ``release_delay``) and the exception
    propagates. With ``cancel_on_lost``, a loss cancels the body and the scope
    raises ``LeaseLost``.
    """

    __slots__ = ("_cancel_on_lost", "_delay", "_held", "_manager", "_message")

    def __init__(
        self,
        manager: LeaseManager | None,
        message: Message,
        release_delay: float | None,
        cancel_on_lost: bool,
    ) -> None:
        if not isinstance(message, Message):
            raise TypeError(
                "lease() takes a leasekeeper Message (from backend.receive() or "
                f"backend.adopt(raw)), got {type(message).__module__}."
                f"{type(message).__qualname__}"
            )
        self._manager = manager
        self._message = message
        self._delay = release_delay
        self._cancel_on_lost = cancel_on_lost
        self._held: AsyncLease | None = None

    async def __aenter__(self) -> AsyncLease:
        manager = self._manager
        if manager is None:
            manager = default_manager(self._message.backend)
        relay = relay_for(manager)  # before register: the relay hears of every ending
        held = AsyncLease(
            manager.register(unwrap(self._message)), manager, relay, asyncio.get_running_loop()
        )
        held.begin(cancel_on_lost=self._cancel_on_lost)
        self._held = held
        return held

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        held = self._held
        assert held is not None, "AsyncLeaseScope exited without entering"
        lost_cancelled = held.end()
        if lost_cancelled and exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            raise LeaseLost(held.id, held.reason or "lost") from None
        if exc_type is not None and issubclass(exc_type, Rollover):
            # The send and the delete block: off the loop.
            await asyncio.get_running_loop().run_in_executor(None, settle_rollover, held.lease)
            return True  # handed on: the block's job is done
        if exc_type is None:
            try:
                await held.complete()
            except BackendError:
                # The handler succeeded but the delete keeps failing: stop renewing so
                # the message comes back and is done again, rather than hide it for ever.
                held.lease.owner.abandon(held.lease, "delete failed: left to lapse")
                raise
            return False
        if held.is_lost:
            return False  # ended: nothing to release; the handler's exception matters more
        try:
            # Released after the growing delay, or a poison message dead-lettered.
            await held.fail(exc, self._delay)
        except LeaseLost:
            pass  # already reported as lost
        except Exception:
            # The handler's own exception matters more; the lease is left to lapse,
            # so the message still comes back.
            log.exception("release of message %r after a handler error failed", held.id)
        return False


def lease(
    message: Message,
    *,
    manager: LeaseManager | None = None,
    release_delay: float | None = None,
    cancel_on_lost: bool = False,
) -> AsyncLeaseScope:
    """``async with lease(msg) as held:`` - on ``manager``, or the per-process default
    manager of the message's backend (``leasekeeper.configure``). See
    ``AsyncLeaseScope``."""
    return AsyncLeaseScope(manager, message, release_delay, cancel_on_lost)
