"""Worker: a receive loop, a handler thread pool and leases, with graceful shutdown.

Every message is leased at receipt, the whole received batch before the first
handler starts. The worker receives as many messages as it has free handler
threads - and, while its handlers are quick (``prefetch``), up to one batch more,
which wait for a thread leased and renewed like the rest: a message held back
locally must not burn its invisibility, but a few milliseconds' wait costs
nothing, and one receive call of ten costs a tenth of ten calls of one. Before a
receive it waits briefly (``gather``) for more handlers to finish, for the same
reason. A handler's message is deleted (or released) through the manager's
coalescer (``complete_soon_then``): its thread is free as soon as the delete is
queued, and deletes that arrive together share one batch call.

On a FIFO queue (``backend.fifo``) a message whose group has one started waits,
leased, behind it; the next starts once its predecessor's delete is answered, and
one that does not end well sends the rest of its group back with it
(``leasekeeper.receiving._ordering``; docs/guide.md, "Ordered (FIFO) queues").

Shutdown (``stop()``, or SIGTERM/SIGINT while ``run()`` is in the main thread):
stop receiving, let running handlers finish while their leases are still renewed,
for up to ``shutdown_timeout`` seconds, then release whatever is left so other
workers get it at once. A second signal skips the wait. ``drain(deadline)`` starts
the same shutdown with a deadline of its own (an interruption notice's).

In an elastic fleet (``leasekeeper.fleet``): ``scale_in_protection=True`` protects
the ECS task while the worker holds messages, ``interruption_notice="aws"`` (or
"azure", "alibaba") drains it when the machine is about to be taken back; both are
listeners (``worker.listeners``), which hear the receive loop's few moments.

A receive that fails with a retryable ``ReceiveError`` (or any other exception,
e.g. from a custom backend) is tried again after a jittered, growing pause. A
*fatal* ``ReceiveError`` (the queue was deleted, the credentials were refused)
stops the worker the same graceful way: ``run()`` raises it once running
handlers are done, and a worker started with ``start()`` logs it and keeps it
in ``worker.error``.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import signal
import threading
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from types import FrameType
from typing import Any, Literal

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.clock import Clock, wait_until
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

log = logging.getLogger("leasekeeper.worker")

Handler = Callable[[Message], object]
AroundHandler = Callable[[Message], AbstractContextManager[object]]

_NO_SCOPE = contextlib.nullcontext()

__all__ = ["Handler", "Worker", "WorkerStats"]


class Worker(Draining):
    """Receive from a backend, run ``handler(message)`` under a lease, repeat.

    ``Worker(manager_or_backend, handler, *, concurrency=4, batch_size=10,
    wait_seconds=1.0, shutdown_timeout=30.0, config=None, renewer=None,
    prefetch=None, gather=0.05, **config_fields)``. Given a backend, the worker
    makes (and closes) its own LeaseManager from ``config``/``config_fields`` and
    ``renewer`` ("auto", the default: "process" where a renewer process can run,
    else "thread"; or either by name - see docs/guide.md); given a
    manager, it uses that manager's backend and leaves the manager open.

    ``prefetch``: how many messages beyond its ``concurrency`` it may hold, leased,
    waiting for a thread - None (auto): a batch while handlers take under a
    hundredth of the visibility timeout, else none. ``gather``: how long it may
    wait for more handlers to finish before a receive, so that one receive brings
    a fuller batch.

    Several queues: ``Worker([urgent, bulk], handler, weights=[3, 1], ...)`` - one
    pool of handler threads, one manager and renewer; each receive goes to one queue,
    in proportion to the weights (an empty queue is short-polled and rests, so it
    never holds the others up: ``leasekeeper.receiving._sources``); ``max_receives`` and
    ``dead_letter`` may be lists in the queues' order; ``worker.stats.per_queue[name]``
    has each queue's figures beside the totals. See docs/queues.md.

    ``worker.around_handler``, when set, wraps each ``handler(message)`` call
    (``leasekeeper.otel.instrument(worker)`` sets it to a tracing span).

    ``dead_letter`` (with the config field ``max_receives``): where poison messages
    go (see ``LeaseManager``). A failed message is released with a delay that grows
    per receive; each failure is one WARNING line.

    ``clock``: the time the worker (and the manager it makes) reads; on a
    ``leasekeeper.testing.ManualClock`` its waits last until the test advances the
    clock. A worker built on a manager uses the manager's clock.
    """

    def __init__(
        self,
        manager_or_backend: LeaseManager | Backend | Sequence[Backend],
        handler: Handler,
        *,
        concurrency: int = 4,
        batch_size: int = 10,
        wait_seconds: float = 1.0,
        shutdown_timeout: float = 30.0,
        config: LeaseConfig | None = None,
        renewer: Literal["thread", "process", "auto"] | None = None,
        prefetch: int | None = None,
        gather: float = 0.05,
        clock: Clock | None = None,
        dead_letter: DeadLetter | Sequence[DeadLetter] = None,
        weights: Sequence[int] | None = None,
        **config_fields: Any,
    ) -> None:
        self.intake = Intake(
            "Worker",
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
        self.handler = self.intake.handler
        self.concurrency = self.intake.concurrency
        self.batch_size = self.intake.batch_size
        self.wait_seconds = self.intake.wait_seconds
        self.shutdown_timeout = self.intake.shutdown_timeout
        self.prefetch = prefetch
        self.gather = self.intake.gather
        self.stats: WorkerStats = self.intake.stats
        # Guards _running, _unsettled, _active, _waiting, stats and the stop flags; the
        # receive loop waits on it for a free handler slot.
        self._slots = threading.Condition()
        self._running = 0  # messages handled now or waiting for a thread (not behind a group)
        self._unsettled = 0  # deletes/releases queued and not yet answered
        self._active: set[Lease] = set()  # leases of the messages in hand
        # The Wait the receive loop is in, if any: nobody notifies a loop that is not
        # waiting, or that a change cannot let go on.
        self._waiting: Wait | None = None
        self._stop = threading.Event()
        self._hurry = threading.Event()  # second signal: skip the graceful wait
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        # The handler threads (no more than ``concurrency``, started as messages come,
        # kept until run() ends) take (message, lease) from _jobs.
        self._jobs = _HandOut()
        self._handlers: list[threading.Thread] = []
        #: The fatal ReceiveError that stopped the worker, if one did.
        self.error: ReceiveError | None = None
        #: When set, ``around_handler(message)`` returns a context manager entered around
        #: ``handler(message)`` on its thread, before the delete or release is queued (it
        #: sees the exception: ``leasekeeper.otel``'s span). It must not raise.
        self.around_handler: AroundHandler | None = None
        follow_fleet(self)  # scale_in_protection=, interruption_notice= (docs/scaling.md)

    # ------------------------------------------------------------------ control

    def start(self) -> Worker:
        """Run in a background thread; ``stop()`` ends it."""
        if self._thread is not None:
            raise RuntimeError("worker already started")
        self._thread = threading.Thread(
            target=self._run_started, name="leasekeeper-worker", daemon=True
        )
        self._thread.start()
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Ask the worker to stop and wait (up to ``timeout``) until it has."""
        self._request_stop()
        if self._thread is not None:
            self._thread.join(timeout)
        else:
            self._done.wait(timeout)

    def _request_stop(self) -> None:
        self._stop.set()
        with self._slots:
            self._slots.notify_all()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._second_signal(self._stop.is_set()):
            self._hurry.set()
        self._request_stop()  # before it is said: a signal landing meanwhile is a second
        self._say_signal(signum, self._hurry.is_set(), self._running)

    # ------------------------------------------------------------------ running

    def _run_started(self) -> None:
        # A fatal ReceiveError is logged by the receive loop and kept in self.error.
        with contextlib.suppress(ReceiveError):
            self.run()

    def run(self, until_idle: float | None = None) -> WorkerStats:
        """Receive and handle until stopped (or, with ``until_idle``, until nothing
        was received and nothing ran for that many seconds). Returns the stats.

        Raises the fatal ``ReceiveError`` that stopped it, after the same graceful
        shutdown as ``stop()`` (also kept in ``self.error``).
        """
        self.error = None
        # Each run its own hand-off, threads and groups: the last run's ended with it.
        self._jobs = _HandOut()
        self._handlers = []
        self.intake.ordering.start(
            self._slots, self._stop.is_set, self._resume_locked, self._wake_locked, self._answered
        )
        previous: dict[signal.Signals, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        for backend in self.backends:  # once: where failing messages end
            self.manager.failures.announce(backend)
        try:
            # Nothing is received before its renewals can run (a renewer process
            # builds its backend after the manager was made).
            self.manager.start()
            self.error = self._drive(receive_loop(self.intake, self, self.clock, until_idle))
        finally:
            self._drive(shutdown_steps(self.intake, self, self.clock))
            self._end_handler_threads()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._done.set()
        if self.error is not None:
            raise self.error
        return self.stats

    # What the loop reads (``_receive_loop.LoopState``), under the slot lock.
    @property
    def running(self) -> int:
        # A FIFO group's waiting messages count beyond an allowance; stopping, none starts.
        if self._stop.is_set():
            return self._running
        return self._running + self.intake.ordering.excess()

    @property
    def unsettled(self) -> int:
        return self._unsettled + self.intake.ordering.releasing

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def hurry(self) -> bool:
        return self._hurry.is_set()

    def active(self) -> list[Lease]:
        return [*self._active, *self.intake.ordering.waiting()]

    def _drive(self, steps: Generator[Step, Any, Any]) -> Any:
        """Run one of the loop's generators: decide and wait under the slot lock (so
        no wake-up is lost between a decision and its wait), call out without it."""
        answer: Any = None
        failure: Exception | None = None
        with self._slots:
            while True:
                try:
                    step = steps.throw(failure) if failure is not None else steps.send(answer)
                except StopIteration as done:
                    return done.value
                answer = failure = None
                if isinstance(step, Wait):
                    self._waiting = step
                    try:
                        wait_until(self.clock, self._slots, step.until)
                    finally:
                        self._waiting = None
                    continue
                self._slots.release()
                try:
                    answer = self._perform(step)
                except Exception as exc:
                    failure = exc
                finally:
                    self._slots.acquire()

    def _perform(self, step: Step) -> Any:
        if isinstance(step, Receive):
            return self.intake.receive(step.count)
        if isinstance(step, Start):
            self._start_all(step.messages)
            return None
        if isinstance(step, Flush):
            self.manager.flush(max(0.0, step.deadline - self.clock.now()))
            return None
        if isinstance(step, (Announce, GiveBack)):
            return aside(self.intake, step)
        assert isinstance(step, Finish)
        if self.intake.owns_manager:
            self.manager.close(release=True)
        else:
            for lease in step.leftovers:
                # Not the handler's own release: its lease.lost is set so it stops.
                self.manager.revoke(lease)
        return None

    def _start_all(self, messages: list[Message]) -> None:
        """Register ``messages`` (at receipt, not when a thread frees up) and hand
        them to the handler threads - on a FIFO queue, those whose group has none
        started; the others wait their turn."""
        leased, refused = self.intake.register_all(messages)
        with self._slots:
            self.intake.received(messages, refused)
            ready = self.intake.ordering.admit(leased)
            self._running += len(ready)
            self._active.update(lease for _, lease in ready)
            threads = self._more_threads_locked()
        for thread in threads:
            thread.start()
        self._jobs.put_all(ready)

    def _more_threads_locked(self) -> list[threading.Thread]:
        """The handler threads to start: one a message in hand, up to ``concurrency``."""
        wanted = min(self.concurrency, self._running) - len(self._handlers)
        threads = [
            threading.Thread(
                target=self._serve,
                name=f"leasekeeper-handler_{len(self._handlers) + n}",
                daemon=True,
            )
            for n in range(wanted)
        ]
        self._handlers.extend(threads)
        return threads

    def _serve(self) -> None:
        """A handler thread: handle the messages handed out, one at a time, until
        run() ends."""
        take = self._jobs.take
        while (job := take()) is not None:
            try:
                self._handle(*job)
            except BaseException:  # not the handler's (that is a failure): a bug
                log.exception("handling message %r failed", job[0].id)

    def _end_handler_threads(self) -> None:
        """run() is over: what still waits for a thread was released at close, so
        drop it; end the threads once they are done."""
        self._jobs.close()
        self._handlers = []

    def _handle(self, message: Message, lease: Lease) -> None:
        ordering = self.intake.ordering
        if lease.is_lost:  # lost (or released at close) while it waited for a thread
            self._finished(lease, "lost", False, None)
            ordering.hold_back(lease)  # on a FIFO queue its group goes back with it
            return
        started = self.clock.now()
        future = None
        around = self.around_handler
        try:
            with handling(lease), around(message) if around is not None else _NO_SCOPE:
                self.handler(message)
        except Rollover:
            outcome = self.intake.roll_over(lease)
            ordering.hold_back(lease)
        except BaseException as exc:
            # The failure policy's WARNING, or an interruption's release at once.
            outcome, future = self.intake.fail(lease, exc)
        else:
            if not lease.is_lost:
                # Its slot freed first, then the delete queued: its answer (_settled)
                # always comes after the count of it as unsettled.
                self._finished(lease, "completed", True, self.clock.now() - started)
                self._queue_delete(lease)
                return
            outcome = "lost"
            log.warning("lease on message %r lost while it was handled", message.id)
            ordering.hold_back(lease)
        self._finished(lease, outcome, future is not None, self.clock.now() - started)
        if future is not None:
            future.add_done_callback(functools.partial(self._release_answered, lease, outcome))
        if outcome == "dead_lettered":
            ordering.went_well(lease)  # out of its group's way, as SQS's redrive does

    def _queue_delete(self, lease: Lease) -> None:
        """Hand ``lease``'s delete to the manager's coalescer; ``_settled`` hears the
        answer."""
        try:
            at_once = self.intake.ordering.key(lease.message) is not None  # a group waits
            self.manager.complete_soon_then(
                lease, functools.partial(self._settled, lease), at_once=at_once
            )
        except ManagerClosed:
            self._settled(lease, None)  # closed in a hurry: close() released it

    def _finished(self, lease: Lease, outcome: str, queued: bool, took: float | None) -> None:
        """The handler is done: free its slot now; count it now, or, when its delete
        (or release) is ``queued``, once that is answered (``_settled``)."""
        with self._slots:
            self._running -= 1
            self._active.discard(lease)
            if took is not None:
                self.intake.took(took)
            if queued:
                self._unsettled += 1
            else:
                self.intake.count(outcome, lease)
            self._wake_locked(True)

    def _wake_locked(self, any_change: bool = False) -> None:
        """Wake the receive loop if it waits for what just happened: a FIFO group let
        go, room (at most ``running_at_most`` in hand), or, ``any_change``, any change."""
        waiting = self._waiting
        if waiting is None:
            return
        if waiting.let_go_above is not None:  # for a FIFO group let go, nothing else
            if self.intake.ordering.groups.let_go > waiting.let_go_above:
                self._slots.notify_all()
        elif waiting.running_at_most is None:
            if any_change:
                self._slots.notify_all()
        elif self.running <= waiting.running_at_most:
            self._slots.notify_all()

    def _release_answered(self, lease: Lease, outcome: str, future: Future[None]) -> None:
        """A failed (or interrupted) message's queued release (``Intake.fail``) was answered."""
        self._settled(lease, future.exception(), outcome)

    def _answered(self) -> None:
        with self._slots:  # a FIFO group's held-back message's release was answered
            self._wake_locked(True)

    def _resume_locked(self, job: tuple[Message, Lease]) -> None:
        """A FIFO group's next message starts (``Ordering``; slot lock held)."""
        self._running += 1
        self._active.add(job[1])
        for thread in self._more_threads_locked():
            thread.start()  # it waits for the hand-out's lock, never for the slot lock
        self._jobs.put_all([job])

    def _settled(
        self, lease: Lease, error: BaseException | None, outcome: str = "completed"
    ) -> None:
        """A queued delete (or release) of ``lease`` was answered with ``error``."""
        counted = self.intake.settle(lease, outcome, error)
        with self._slots:
            self._unsettled -= 1
            self.intake.count(counted, lease)
            self._wake_locked(True)
        if outcome == "completed":  # a delete: on a FIFO queue its group goes on, or back
            self.intake.ordering.deleted(lease, counted == "completed")


def follow_fleet(worker: Worker | Any) -> None:
    """Make a worker's fleet options (``scale_in_protection=``,
    ``interruption_notice=``, kept by its intake) its listeners; none given, nothing
    is imported (``leasekeeper.fleet.options``)."""
    options = worker.intake.fleet_options
    if options:
        from leasekeeper.fleet.options import attach

        attach(
            worker,
            protection=options.get("scale_in_protection", False),
            notice=options.get("interruption_notice"),
        )


class _HandOut:
    """The messages a Worker holds that wait for a handler thread, and its idle threads.

    A received batch wakes one idle thread, and a thread that takes a message wakes
    the next - one wake-up on its way at a time. Quick handlers so drain a batch on
    the threads already awake (a thread is not woken for a message that a busy one
    takes a moment later), while slow ones still run ``concurrency`` at once: the
    wake-ups follow each other until every thread is busy or nothing is left.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._jobs: deque[tuple[Message, Lease]] = deque()
        self._idle = 0  # threads waiting for a message
        self._waking = False  # one of them was woken and has not taken one yet
        self._closed = False

    def put_all(self, jobs: Sequence[tuple[Message, Lease]]) -> None:
        with self._lock:
            self._jobs.extend(jobs)
            self._wake_locked()

    def take(self) -> tuple[Message, Lease] | None:
        """The next message and its lease, once there is one; None: the worker ended."""
        with self._lock:
            while not self._jobs:
                if self._closed:
                    return None
                self._idle += 1
                try:
                    self._ready.wait()
                finally:
                    self._idle -= 1
                self._waking = False
            job = self._jobs.popleft()
            self._wake_locked()
            return job

    def close(self) -> None:
        """Drop what waits (released at the manager's close) and end the threads."""
        with self._lock:
            self._jobs.clear()
            self._closed = True
            self._ready.notify_all()

    def _wake_locked(self) -> None:
        if self._jobs and self._idle and not self._waking:
            self._waking = True
            self._ready.notify()
