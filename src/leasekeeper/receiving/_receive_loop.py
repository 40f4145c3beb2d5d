"""One receive loop for ``Worker`` and ``AsyncWorker``, written once, run two ways.

The loop decides; its driver waits. ``receive_loop`` and ``shutdown_steps`` are
generators that yield the steps they need done - wait for a change until a moment
of the clock, receive up to N messages, start handlers on what came, flush the
queued deletes, finish - and never block themselves. ``Worker`` performs each step
on its threads (a wait is a wait on its slot condition, with the lock held while the
loop decides, so no wake-up is lost between a decision and its wait);
``AsyncWorker`` awaits each on its event loop. The policy - how many to receive,
gathering a fuller batch, backing off after a failed receive, stopping when idle,
the graceful shutdown - exists in this one place (with ``_intake``'s settings), and
every moment in it is read from the worker's clock: on a
``leasekeeper.testing.ManualClock`` a worker waits until the test advances it.

A change is anything that can let the loop go on: a handler finished, a delete was
answered, stop was asked. Its driver reports changes by waking the waiting step;
the loop re-reads the worker's state (``LoopState``) after every step.

The loop also decides when the worker's listeners (``receiving.listeners``) hear of
its moments - it began, it holds messages after holding none, it holds none again,
the drain began, it ended - and has its driver tell them (``Announce``): once a busy
spell, never once a message, and not at all for a worker without listeners.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from leasekeeper.backends.contract import Message
from leasekeeper.clock import Clock
from leasekeeper.errors import ReceiveError
from leasekeeper.lease import Lease
from leasekeeper.receiving._intake import REACH_WITHIN, Intake

log = logging.getLogger("leasekeeper.worker")


class LoopState(Protocol):
    """What the loop reads of its worker after each step."""

    @property
    def running(self) -> int:
        """Messages in hand: handled now, or waiting for a handler. (A FIFO group's
        messages waiting behind an earlier one count only beyond an allowance:
        ``Intake.ordering``; and not at all once stopping, when none of them starts.)"""
        ...

    @property
    def unsettled(self) -> int:
        """Deletes and releases queued and not answered yet."""
        ...

    @property
    def stopping(self) -> bool: ...

    @property
    def hurry(self) -> bool:
        """A second signal: skip the graceful wait."""
        ...

    def active(self) -> list[Lease]:
        """The leases of the messages in hand."""
        ...


@dataclass(frozen=True)
class Wait:
    """Wait until something changes, or until the clock reads ``until`` (None: no
    limit). ``running_at_most``: the loop waits for room, so the only change it wants
    is a handler finishing that leaves at most that many messages in hand (or stop);
    a driver may leave it asleep through the others. None: any change."""

    until: float | None
    running_at_most: int | None = None
    #: Wait for a FIFO group to be let go - ``intake.ordering.groups.let_go`` above
    #: this - rather than for any change (None: any change, or room).
    let_go_above: int | None = None


@dataclass(frozen=True)
class Receive:
    """One receive call of up to ``count`` messages. The driver sends back the list,
    or throws the exception the call raised into the loop."""

    count: int


@dataclass(frozen=True)
class Start:
    """Lease ``messages`` (all of them, before any handler starts) and hand them to
    handlers."""

    messages: list[Message]


@dataclass(frozen=True)
class Flush:
    """Send the queued deletes and releases; give up at ``deadline``."""

    deadline: float


@dataclass(frozen=True)
class Finish:
    """Close the manager if the worker owns it, else release ``leftovers`` under their
    handlers (``manager.revoke``)."""

    leftovers: Sequence[Lease]


@dataclass(frozen=True)
class GiveBack:
    """A receive that was out when stop was asked brought ``messages``: make them
    visible again at once, unleased and unhandled (``Intake.give_back``)."""

    messages: list[Message]


@dataclass(frozen=True)
class Announce:
    """Tell the worker's listeners ``event`` (``receiving.listeners.EVENTS``), off the
    driver's lock and event loop: a listener may make a short blocking call."""

    event: str


Step = Wait | Receive | Start | Flush | Finish | Announce | GiveBack


def aside(intake: Intake, step: Announce | GiveBack) -> None:
    """Do a step that needs nothing of the worker but its intake: tell the listeners,
    or give messages back. Its driver calls it off its lock and its event loop."""
    if isinstance(step, Announce):
        intake.listeners.announce(step.event)
    else:
        intake.give_back(step.messages)


def receive_loop(
    intake: Intake, state: LoopState, clock: Clock, until_idle: float | None
) -> Generator[Step, Any, ReceiveError | None]:
    """Receive and start handlers until stopped, or idle for ``until_idle`` seconds.
    Returns the ``ReceiveError`` that ended it, if one did: a fatal one, or the last
    failure of a queue that no receive reached - within ``REACH_WITHIN`` seconds of
    the start, or before ``until_idle`` ended the run."""
    listening = bool(intake.listeners)
    if listening:
        yield Announce("started")
    holding = False  # since the listeners heard "busy", and until they hear "idle"
    started = idle_since = clock.now()
    unreached = intake.unreached
    unreached.start(intake.sources.all)
    intake.failures = 0
    while not state.stopping:
        # Room: wait for a free slot, then briefly (gather) for more, so that one
        # receive brings a fuller batch.
        limit = intake.limit()
        while state.running >= limit and not state.stopping:
            yield Wait(None, running_at_most=limit - 1)
            limit = intake.limit()
        gather_until = clock.now() + intake.gather
        while (
            limit - state.running < intake.batch_size
            and state.running
            and not state.stopping
            and clock.now() < gather_until
        ):
            yield Wait(gather_until, running_at_most=max(0, limit - intake.batch_size))
        if state.stopping:
            break
        asked_at = clock.now()
        let_go = intake.ordering.groups.let_go  # FIFO groups let go so far
        try:
            messages = yield Receive(min(intake.batch_size, limit - state.running))
        except Exception as exc:
            # A failing queue is no message either: until_idle ends the run all the
            # same (reachable or not), and a queue never reached ends it in time.
            now = clock.now()
            busy = state.running + state.unsettled
            if busy:
                idle_since = now
            latest = now + 30.0  # the longest pause; then, where sooner, the end
            if not busy and until_idle is not None:
                latest = min(latest, idle_since + until_idle)
            if unreached.asked_not_reached():
                latest = min(latest, started + REACH_WITHIN)
            pause = intake.receive_failed(exc, latest - now)
            if pause is None:  # a fatal ReceiveError: stop, as stop() would
                assert isinstance(exc, ReceiveError)
                return exc
            if not busy and until_idle is not None and now - idle_since >= until_idle:
                break
            never = unreached.after(now - started)
            if never is not None:
                return never
            resume = now + pause
            while clock.now() < resume and not state.stopping:
                yield Wait(resume)
            continue
        if messages and state.stopping:
            # The long poll was out when stop was asked: nothing starts from now on.
            yield GiveBack(messages)
            break
        if messages:
            # Lease the whole batch before the first handler starts: a handler that
            # grabs the GIL at once would otherwise leave the rest of the batch
            # unleased, burning invisibility until LeaseTooShort refused them.
            if listening and not holding:
                holding = True
                yield Announce("busy")  # ECS protection, say: set before a handler starts
            yield Start(messages)
            idle_since = clock.now()
            continue
        now = clock.now()
        if state.running + state.unsettled:
            idle_since = now
        else:
            if holding:  # all settled, and a whole receive brought nothing
                holding = False
                yield Announce("idle")
            if until_idle is not None and now - idle_since >= until_idle:
                break
        # An empty answer that came before its wait was up (a short poll, a driven
        # clock): wait the rest out rather than ask again at once - or, with several
        # queues, until one of them is awake (an empty one rests a while).
        rest = intake.next_receive(asked_at)
        if until_idle is not None and not state.running + state.unsettled:
            rest = min(rest, idle_since + until_idle)
        if intake.held_back:
            # Empty, perhaps only because of the FIFO groups the worker holds itself:
            # ask again once one of them is let go (the service may then hand it out).
            groups = intake.ordering.groups
            while clock.now() < rest and groups.let_go == let_go and not state.stopping:
                yield Wait(rest, let_go_above=let_go)
        elif now < rest:
            yield Wait(rest)
    if state.stopping:
        return None  # stopped (a signal, stop()): whatever was reached or not
    never = unreached.error()
    if never is not None:
        log.error("idle for %gs and a queue was never reached: %s", until_idle, never)
    return never


def stop_notice(signum: int, running: int, shutdown_timeout: float) -> str:
    """What a worker says, at WARNING, at the first SIGINT/SIGTERM: that it stops, how
    many handlers it waits for and for how long at most, and that a second signal
    releases them now (so a user at a terminal knows what the pause is)."""
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    if name == "SIGINT":
        name = "Ctrl-C (SIGINT)"
    if not running:
        return f"{name}: stopping (no handler running)"
    again = "Ctrl-C" if signum == signal.SIGINT else "SIGTERM or Ctrl-C"
    return (
        f"{name}: stopping; waiting up to {shutdown_timeout:g}s for {running} running "
        f"handler(s) to finish (their leases renewed meanwhile); a second {again} "
        "releases their messages now"
    )


def shutdown_steps(intake: Intake, state: LoopState, clock: Clock) -> Generator[Step, Any, None]:
    """Stop gracefully: let running handlers finish while their leases are renewed,
    until the drain's deadline (``drain(deadline)``'s, kept by the intake, else
    ``shutdown_timeout`` from now), send the queued deletes, then release what is
    left so other workers get it at once."""
    timed_out = clock.now() + intake.shutdown_timeout

    def deadline() -> float:
        by = intake.drain.deadline  # read again after each change: it may move earlier
        return timed_out if by is None else by

    listening = bool(intake.listeners)
    if listening:
        yield Announce("draining")
    while state.running and not state.hurry and clock.now() < deadline():
        yield Wait(deadline())
    leftovers = state.active()
    if state.running:
        log.warning(
            "shutdown: %d handler(s) still running; releasing their messages", state.running
        )
    # Deletes out first: a message whose handler succeeded is not released.
    yield Flush(deadline())
    while state.unsettled and clock.now() < deadline():
        yield Wait(deadline())
    yield Finish(leftovers)
    if listening:
        yield Announce("stopped")
