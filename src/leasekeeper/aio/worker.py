"""AsyncWorker: ``Worker`` for ``async def`` handlers, on an event loop.

What runs where:

- **The event loop** runs the receive loop and one task per running handler,
  nothing else. It never waits on a service call.
- **One thread** (``leasekeeper-aio``) makes the receive calls, one at a time (a
  long poll would block the loop), and at shutdown the manager's blocking calls.
- **The manager's threads** renew the leases (its scheduler, or its renewer
  process with ``renewer="process"``), so a handler that blocks the loop - a
  ``time.sleep``, a CPU-bound step - does not stop renewals; and delete or release
  the messages of finished handlers through its coalescer, in shared batch calls.
  A handler's slot is free as soon as its delete is queued; the worker counts the
  message when the delete is answered (``call_soon_threadsafe`` back to the loop).
- **Lost leases** reach the loop through the manager's ``LostRelay``:
  ``current_lease().lost`` in a handler, and with ``cancel_on_lost=True`` the
  cancellation of the handler's task.

The receive policy is ``Worker``'s (``leasekeeper.receiving._intake``): as many messages as
free handler slots, a prefetched batch more while handlers are quick, a brief
gather before a receive, and the same treatment of failed receives.

Shutdown (``stop()``, SIGTERM/SIGINT while ``run()`` runs on the main thread's
loop, or a fatal ``ReceiveError``): stop receiving, let running handlers finish
while their leases are renewed, for up to ``shutdown_timeout``, send the queued
deletes, then release what is left and cancel the handlers that still run (their
messages are back on the queue: their work is moot, as when ``asyncio.run``
cancels what is left). A second signal skips the wait. ``drain(deadline)`` starts
the same shutdown with a deadline of its own (an interruption notice's).

``scale_in_protection=`` and ``interruption_notice=`` are ``Worker``'s: listeners
(``worker.listeners``) told the receive loop's moments from the worker's one thread,
never on the event loop.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Generator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from typing import Any, Literal, cast

from leasekeeper.aio.futures import call_soon_threadsafe
from leasekeeper.aio.held import AsyncLease
from leasekeeper.aio.lost import LostRelay, relay_for
from leasekeeper.backends.contract import Backend, Message
from leasekeeper.clock import Alarm, Clock, DrivenClock
from leasekeeper.config import LeaseConfig
from leasekeeper.current import handling
from leasekeeper.errors import ManagerClosed, ReceiveError
from leasekeeper.lease import Lease
from leasekeeper.manager import LeaseManager
from leasekeeper.receiving import (
    Announce,
    DeadLetter,
    Finish,
    Flush,
    GiveBack,
    Intake,
    Receive,
    Start,
    Step,
    Wait,
    aside,
    receive_loop,
    shutdown_steps,
)
from leasekeeper.receiving.draining import Draining
from leasekeeper.receiving.stats import WorkerStats
from leasekeeper.rollover import Rollover
from leasekeeper.worker import AroundHandler, follow_fleet

__all__ = ["AsyncHandler", "AsyncWorker"]

log = logging.getLogger("leasekeeper.worker")

AsyncHandler = Callable[[Message], Awaitable[object]]

#: Seconds the handlers cancelled at shutdown get to unwind before run() returns.
CANCEL_GRACE = 1.0


class AsyncWorker(Draining):
    """Receive from a backend, ``await handler(message)`` under a lease, repeat.

    ``AsyncWorker(manager_or_backend, handler, *, concurrency=16, batch_size=10,
    wait_seconds=1.0, shutdown_timeout=30.0, config=None, renewer=None,
    prefetch=None, gather=0.05, cancel_on_lost=False, **config_fields)``: the
    arguments of ``Worker``, with ``concurrency`` the number of handler coroutines
    at once. ``cancel_on_lost``: cancel a handler whose lease is lost (off by
    default: see ``leasekeeper.aio.held``). ``await worker.run()``. ``clock``: as
    ``Worker``'s; several queues (a list, ``weights=``): as ``Worker``'s.
    """

    def __init__(
        self,
        manager_or_backend: LeaseManager | Backend | Sequence[Backend],
        handler: AsyncHandler,
        *,
        concurrency: int = 16,
        batch_size: int = 10,
        wait_seconds: float = 1.0,
        shutdown_timeout: float = 30.0,
        config: LeaseConfig | None = None,
        renewer: Literal["thread", "process", "auto"] | None = None,
        prefetch: int | None = None,
        gather: float = 0.05,
        cancel_on_lost: bool = False,
        clock: Clock | None = None,
        dead_letter: DeadLetter | Sequence[DeadLetter] = None,
        weights: Sequence[int] | None = None,
        **config_fields: Any,
    ) -> None:
        if (inspect.isfunction(handler) or inspect.ismethod(handler)) and not (
            inspect.iscoroutinefunction(handler)
        ):
            raise TypeError(
                f"AsyncWorker runs async def handlers; {handler!r} is a plain function "
                "(run it on a leasekeeper.Worker)"
            )
        self.intake = Intake(
            "AsyncWorker",
            manager_or_backend,
            handler,
            concurrency=concurrency,
            batch_size=batch_size,
            wait_seconds=wait_seconds,
            shutdown_timeout=shutdown_timeout,
            config=config,
            renewer=renewer,
            prefetch=prefetch,
            gather=gather,
            clock=clock,
            dead_letter=dead_letter,
            weights=weights,
            config_fields=config_fields,
        )
        self.manager: LeaseManager = self.intake.manager
        self.clock: Clock = self.manager.clock
        self.backend: Backend = self.intake.backend
        #: The queues it receives from (one, or a multi-queue worker's, in order).
        self.backends: list[Backend] = self.intake.backends
        self.handler = cast("AsyncHandler", self.intake.handler)
        self.concurrency = self.intake.concurrency
        self.cancel_on_lost = bool(cancel_on_lost)
        self.stats: WorkerStats = self.intake.stats
        #: The fatal ReceiveError that stopped the worker, if one did.
        self.error: ReceiveError | None = None
        # All below is touched on the loop only (stop() hands over to it).
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._hurry = False  # second signal: skip the graceful wait
        self._changed: asyncio.Event | None = None  # a slot freed, a delete answered, stop
        self._running = 0  # handler tasks (a FIFO group's waiting messages: intake.ordering)
        self._unsettled = 0  # deletes/releases queued and not yet answered
        self._active: set[Lease] = set()  # leases of the running handlers
        self._tasks: set[asyncio.Task[None]] = set()
        self._relay: LostRelay | None = None
        #: As ``Worker.around_handler``: a (synchronous) context manager entered around
        #: each ``await handler(message)``, in its task. It must not raise.
        self.around_handler: AroundHandler | None = None
        follow_fleet(self)  # scale_in_protection=, interruption_notice= (docs/scaling.md)

    # ------------------------------------------------------------------ control

    def stop(self) -> None:
        """Ask the worker to stop (from any thread): ``run()`` then stops receiving,
        lets running handlers finish and returns."""
        loop = self._loop
        if loop is None:
            self._stopping = True  # not running (yet): run() returns at once
            return
        call_soon_threadsafe(loop, self._request_stop)

    _stop_soon = stop  # drain(): the thread-safe stop

    def _request_stop(self) -> None:
        self._stopping = True
        self._wake()

    def _on_signal(self, signum: int) -> None:
        second = self._second_signal(self._stopping)
        self._hurry = self._hurry or second
        self._stopping = True  # before it is said: a signal landing meanwhile is a second
        self._say_signal(signum, second, self._running)
        self._request_stop()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()

    async def _next_change(self, until: float | None = None) -> None:
        """Wait until something changes (a slot frees, a delete is answered, stop),
        or the clock reads ``until``."""
        changed = self._changed
        loop = self._loop
        assert changed is not None and loop is not None
        changed.clear()
        clock = self.clock
        timer: asyncio.TimerHandle | None = None
        alarm: Alarm | None = None
        if until is not None:
            if isinstance(clock, DrivenClock):
                # Driven time moves when the test says: an alarm rings the loop then.
                alarm = Alarm(until, lambda: call_soon_threadsafe(loop, changed.set))
                clock.attach(alarm)
                if clock.now() >= until:
                    changed.set()
            else:
                timer = loop.call_later(max(0.0, until - clock.now()), changed.set)
        try:
            await changed.wait()
        finally:
            if timer is not None:
                timer.cancel()
            if alarm is not None and isinstance(clock, DrivenClock):
                clock.detach(alarm)

    # ------------------------------------------------------------------ running

    async def run(self, until_idle: float | None = None) -> WorkerStats:
        """Receive and handle until stopped (or, with ``until_idle``, until nothing
        was received and nothing ran for that many seconds). Returns the stats.

        Raises the fatal ``ReceiveError`` that stopped it, after the same graceful
        shutdown as ``stop()`` (also kept in ``self.error``).
        """
        if self._loop is not None:
            raise RuntimeError("AsyncWorker.run() is running already")
        # Nothing is received before its renewals can run (a renewer process builds
        # its backend after the manager was made): waited for off the event loop.
        await asyncio.to_thread(self.manager.start)
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._changed = asyncio.Event()
        self.error = None
        self.intake.ordering.start(
            nullcontext(), lambda: self._stopping, self._resume, self._wake, self._answered_off_loop
        )
        # Before the first register: the relay must hear of every lease's end.
        self._relay = relay_for(self.manager)
        executor = ThreadPoolExecutor(1, thread_name_prefix="leasekeeper-aio")
        for queue in self.backends:  # once: where failing messages end
            self.manager.failures.announce(queue)
        previous = self._catch_signals(loop)
        try:
            self.error = await self._drive(
                receive_loop(self.intake, self, self.clock, until_idle), executor
            )
        except asyncio.CancelledError:
            self._stopping = self._hurry = True  # run() itself cancelled: stop now
            raise
        finally:
            try:
                await self._drive(shutdown_steps(self.intake, self, self.clock), executor)
                await self._cancel_leftovers()
            finally:
                for sig, handler in previous.items():
                    loop.remove_signal_handler(sig)
                    if handler is not None:
                        signal.signal(sig, handler)
                executor.shutdown(wait=False)
                self._loop = None
        if self.error is not None:
            raise self.error
        return self.stats

    # What the loop reads (``_receive_loop.LoopState``), on the event loop.
    @property
    def running(self) -> int:
        # As Worker's: a FIFO group's waiting messages count beyond their allowance.
        if self._stopping:
            return self._running
        return self._running + self.intake.ordering.excess()

    @property
    def unsettled(self) -> int:
        return self._unsettled + self.intake.ordering.releasing

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def hurry(self) -> bool:
        return self._hurry

    def active(self) -> list[Lease]:
        return [*self._active, *self.intake.ordering.waiting()]

    async def _drive(self, steps: Generator[Step, Any, Any], executor: ThreadPoolExecutor) -> Any:
        """Run one of the loop's generators: waits on the event loop, service calls on
        the worker's one thread (a long poll must not block the loop)."""
        loop = asyncio.get_running_loop()
        answer: Any = None
        failure: Exception | None = None
        while True:
            try:
                step = steps.throw(failure) if failure is not None else steps.send(answer)
            except StopIteration as done:
                return done.value
            answer = failure = None
            try:
                if isinstance(step, Wait):
                    await self._next_change(step.until)
                elif isinstance(step, Receive):
                    answer = await loop.run_in_executor(executor, self.intake.receive, step.count)
                elif isinstance(step, Start):
                    leased, refused = self.intake.register_all(step.messages)
                    self.intake.received(step.messages, refused)
                    # On a FIFO queue, a message whose group has one started waits.
                    for message, lease in self.intake.ordering.admit(leased):
                        self._start(message, lease)
                elif isinstance(step, Flush):
                    left = max(0.0, step.deadline - self.clock.now())
                    await loop.run_in_executor(executor, self.manager.flush, left)
                elif isinstance(step, (Announce, GiveBack)):  # may block: off the loop
                    await loop.run_in_executor(executor, aside, self.intake, step)
                else:
                    assert isinstance(step, Finish)
                    await self._finish(step, executor)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failure = exc

    async def _finish(self, step: Finish, executor: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        if self.intake.owns_manager:
            await loop.run_in_executor(executor, functools.partial(self.manager.close, True))
        elif step.leftovers:
            await loop.run_in_executor(executor, self._revoke, list(step.leftovers))

    async def _cancel_leftovers(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()  # their messages were released: their work is moot
        if tasks:
            # Cancellation unwinds at the next await: give them a moment to, so the
            # stats are final when run() returns (a handler may refuse to stop).
            await asyncio.wait(tasks, timeout=CANCEL_GRACE)

    def _catch_signals(self, loop: asyncio.AbstractEventLoop) -> dict[signal.Signals, Any]:
        """SIGTERM/SIGINT stop the worker (on the main thread's loop, where asyncio can
        catch signals); returns the handlers they replace."""
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return previous
        for sig in (signal.SIGTERM, signal.SIGINT):
            before = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._on_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):  # not on this loop
                continue
            previous[sig] = before
        return previous

    def _start(self, message: Message, lease: Lease) -> None:
        assert self._loop is not None
        self._running += 1
        self._active.add(lease)
        task = self._loop.create_task(self._handle(message, lease))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _handle(self, message: Message, lease: Lease) -> None:
        outcome, future, took = "lost", None, None
        try:
            if lease.is_lost:  # lost (or released at close) before it started
                self.intake.ordering.hold_back(lease)  # a FIFO group goes back with it
                return
            assert self._relay is not None and self._loop is not None
            held = AsyncLease(lease, self.manager, self._relay, self._loop)
            held.begin(cancel_on_lost=self.cancel_on_lost)
            started = self.clock.now()
            around = self.around_handler
            try:
                with handling(lease), around(message) if around is not None else nullcontext():
                    await self.handler(message)
            except Rollover:
                held.end()
                # Two blocking calls (the send, the delete): off the loop.
                loop = asyncio.get_running_loop()
                outcome = await loop.run_in_executor(None, self.intake.roll_over, lease)
                self.intake.ordering.hold_back(lease)
            except asyncio.CancelledError:
                if not held.end():
                    raise  # not a loss: shutdown cancelled it (its message was released)
                log.warning("lease on message %r lost while it was handled: cancelled", lease.id)
                self.intake.ordering.hold_back(lease)
                return
            except Exception as exc:
                held.end()
                outcome, future = await self._fail(lease, exc)
            except BaseException as exc:  # KeyboardInterrupt, SystemExit: no failure
                held.end()
                outcome, future = self.intake.release_interrupted(lease, exc)  # at once
                raise  # it stops the loop, as it would have
            else:
                held.end()
                if lease.is_lost:
                    log.warning("lease on message %r lost while it was handled", message.id)
                    self.intake.ordering.hold_back(lease)
                else:
                    outcome = "completed"
                    future = self._queue_end(lease, release=False)
            took = self.clock.now() - started
            if outcome == "dead_lettered":
                self.intake.ordering.went_well(lease)  # out of its group's way, as redrive
        finally:
            self._finished(lease, outcome, future, took)

    async def _fail(self, lease: Lease, error: BaseException) -> tuple[str, Future[None] | None]:
        """The handler raised ``error``: send a poison message to the dead-letter queue,
        or release the message - on a FIFO queue with the later messages of its group
        the worker holds, in the same call. One WARNING (with the traceback), from the
        failure policy; off the loop: the dead-letter copy is a service call, and so is
        the first failure's look at the queue's redrive policy."""
        if await asyncio.to_thread(self.intake.dead_lettered, lease, error):
            return "dead_lettered", None
        rest = self.intake.ordering.take_rest(lease)
        futures = await asyncio.to_thread(self.intake.release_failed, lease, error, rest)
        return "failed", futures[0] if futures else None

    def _answered_off_loop(self) -> None:
        loop = self._loop  # a FIFO group's held-back message's release was answered
        if loop is not None:
            call_soon_threadsafe(loop, self._wake)

    def _resume(self, job: tuple[Message, Lease]) -> None:
        self._start(*job)  # a FIFO group's next message (``Ordering``)

    def _queue_end(self, lease: Lease, *, release: bool) -> Future[None] | None:
        try:
            if release:
                return self.manager.release_soon(lease)
            # A FIFO group's next message waits on this answer: no gathering.
            at_once = self.intake.ordering.key(lease.message) is not None
            return self.manager.complete_soon(lease, at_once=at_once)
        except ManagerClosed:
            return None  # closed in a hurry: close() released it

    def _finished(
        self, lease: Lease, outcome: str, future: Future[None] | None, took: float | None
    ) -> None:
        """The handler is done: free its slot now; count it when its delete (or
        release) is answered."""
        self._running -= 1
        self._active.discard(lease)
        if took is not None:
            self.intake.took(took)
        if future is None:
            self.intake.count(outcome, lease)
        else:
            self._unsettled += 1
            assert self._loop is not None
            future.add_done_callback(functools.partial(self._answered, self._loop, lease, outcome))
        self._wake()

    def _answered(
        self, loop: asyncio.AbstractEventLoop, lease: Lease, outcome: str, future: Future[None]
    ) -> None:
        """A queued delete or release was answered (on the coalescer's thread)."""
        if not call_soon_threadsafe(loop, self._settled, lease, outcome, future):
            # The loop is closed (run() gave up waiting for this answer): count it here.
            self.intake.count(self.intake.settle(lease, outcome, future.exception()), lease)

    def _settled(self, lease: Lease, outcome: str, future: Future[None]) -> None:
        counted = self.intake.settle(lease, outcome, future.exception())
        self.intake.count(counted, lease)
        self._unsettled -= 1
        self._wake()
        if outcome == "completed":  # a delete: on a FIFO queue its group goes on, or back
            self.intake.ordering.deleted(lease, counted == "completed")

    def _revoke(self, leases: list[Lease]) -> None:
        for lease in leases:
            # Not the handler's own release: its lease.lost is set so it stops.
            try:
                self.manager.revoke(lease)
            except Exception as exc:
                log.warning("shutdown: release of message %r failed: %s", lease.id, exc)
