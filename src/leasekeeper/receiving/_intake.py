"""Intake: what a worker's receive loop decides, whichever loop runs it.

``Worker`` (threads) and ``leasekeeper.aio.AsyncWorker`` (an event loop) wait,
receive and hand out messages differently, but decide the same things the same
way, here: their settings and manager, how many messages they may hold (their
handlers, plus a prefetched batch while handlers are quick), the receive call,
what a failed receive means (retry after a jittered, growing pause, or stop),
leasing a received batch, which held messages of an ordered (FIFO) queue start
now and which wait behind their group (``Intake.ordering``: ``_ordering``), and how
a queued delete or release that was answered counts. An ``Intake`` holds no lock and
starts nothing: its worker serialises the calls that change it.
"""

from __future__ import annotations

import inspect
import logging
import random
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, Literal

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.clock import Clock
from leasekeeper.config import LeaseConfig
from leasekeeper.decorator import undecorated
from leasekeeper.errors import LeaseLost, LeaseTooShort, ManagerClosed, ReceiveError
from leasekeeper.failures import interrupted, resolve_dead_letter, say_interrupted
from leasekeeper.lease import Lease, settle_rollover
from leasekeeper.manager import LeaseManager
from leasekeeper.receiving._drain import DrainDeadline, fleet_options
from leasekeeper.receiving._ordering import Ordering
from leasekeeper.receiving._sources import MAX_REST, Source, Sources
from leasekeeper.receiving.listeners import Listeners
from leasekeeper.receiving.stats import QueueStats, WorkerStats
from leasekeeper.rollover import unwrap

log = logging.getLogger("leasekeeper.worker")

#: How long a run gives a queue that has not answered yet (seconds): a queue no
#: receive of a run has reached within this stops the run, with the last error -
#: at start, an unreachable endpoint is most likely a mistake (a typo, a stand-in not
#: started), not an outage to wait out (docs/guide.md, "When a service cannot be
#: reached"). Once a queue has answered, its failures are retried for ever.
REACH_WITHIN = 20.0

#: Who renews for a worker that makes its own manager, unless told: see
#: docs/performance.md, measure 8, and docs/guide.md, "Choosing a renewer".
DEFAULT_RENEWER: Literal["thread", "process", "auto"] = "auto"


__all__ = [
    "DEFAULT_RENEWER",
    "REACH_WITHIN",
    "Intake",
    "QueueStats",
    "WorkerStats",
    "backoff",
    "handler_signature_problem",
]

#: What a worker takes as its queues: a manager, a backend, or a list of backends.
Queues = LeaseManager | Backend | Sequence[Backend]
#: A dead-letter queue: a backend, a URL or a name beside the queue; per queue, a list.
DeadLetter = Backend | str | None


class Intake:
    """A worker's settings, manager and receive policy (see the module docstring).

    ``kind`` names the worker in error messages ("Worker", "AsyncWorker").
    ``manager_or_backend`` may be a list of backends: a multi-queue worker
    (``leasekeeper.receiving._sources``), with ``weights`` and, per queue, ``dead_letter`` and the
    config field ``max_receives`` (a list in the queues' order, or one for all).
    """

    def __init__(
        self,
        kind: str,
        manager_or_backend: Queues,
        handler: Callable[..., object],
        *,
        concurrency: int,
        batch_size: int,
        wait_seconds: float,
        shutdown_timeout: float,
        config: LeaseConfig | None,
        renewer: Literal["thread", "process", "auto"] | None,
        prefetch: int | None,
        gather: float,
        config_fields: dict[str, Any],
        clock: Clock | None = None,
        dead_letter: DeadLetter | Sequence[DeadLetter] = None,
        weights: Sequence[int] | None = None,
    ) -> None:
        #: ``scale_in_protection=``/``interruption_notice=``, taken from the keyword
        #: arguments before the rest make a LeaseConfig (``receiving._drain``).
        self.fleet_options = fleet_options(config_fields)
        if not callable(handler):
            raise TypeError(f"handler must be callable, got {type(handler).__name__}")

        inner = undecorated(handler)
        if inner is not None:
            # The worker leases every message itself: the @leased wrapper would delete
            # each message a second time (and count it lost when that delete fails).
            log.info(
                "%s: %s is @leased; running the function it wraps under the worker's "
                "own lease (each message deleted once)",
                kind,
                getattr(handler, "__qualname__", repr(handler)),
            )
            handler = inner
        check_handler_signature(kind, handler)
        #: The handler the worker calls (a ``@leased`` wrapper's undecorated function).
        self.handler = handler
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ValueError(f"concurrency must be an integer >= 1, got {concurrency!r}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if not wait_seconds >= 0:
            raise ValueError(f"wait_seconds must be >= 0, got {wait_seconds!r}")
        if prefetch is not None and (
            isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0
        ):
            raise ValueError(f"prefetch must be None (auto) or an integer >= 0, got {prefetch!r}")
        if not 0 <= gather <= 1:
            raise ValueError(f"gather must be between 0 and 1 second, got {gather!r}")
        self.manager, self.backend, self.owns_manager, backends = _queues_and_manager(
            kind,
            manager_or_backend,
            config=config,
            renewer=renewer,
            clock=clock,
            dead_letter=dead_letter,
            weights=weights,
            config_fields=config_fields,
        )
        #: The queues it receives from, and which one the next receive goes to.
        self.sources = Sources(backends or [self.backend], weights)
        self.concurrency = concurrency
        # Within what one receive call of each service may ask for.
        for queue in backends or [self.backend]:
            batch_size = min(batch_size, getattr(queue, "max_receive", batch_size))
            wait_seconds = min(
                float(wait_seconds), getattr(queue, "max_wait_seconds", float(wait_seconds))
            )
        self.batch_size = batch_size
        self.wait_seconds = float(wait_seconds)
        self.shutdown_timeout = float(shutdown_timeout)
        self.prefetch = prefetch
        self.gather = float(gather)
        self.stats = WorkerStats(per_queue={s.name: s.stats for s in self.sources.all})
        #: Its ordered (FIFO) queues' message groups: one message of a group at a time.
        self.ordering = Ordering(
            self.sources, self.stats, self.manager, concurrency * batch_size, self.count
        )
        # The one queue of a single-queue worker (its messages' counts need no lookup).
        self._only: Source | None = None if self.sources.several else self.sources.all[0]
        # Handler durations, smoothed: are handlers quick enough to prefetch for?
        self.duration: float | None = None
        self.failures = 0  # receive failures in a row
        #: Which of this run's queues no receive has reached yet (``Unreached``).
        self.unreached = Unreached()
        #: The last receive went without a long poll: groups of its FIFO queue are held.
        self.held_back = False
        #: Who hears the loop's moments (``receiving.listeners``): the worker's listeners.
        self.listeners = Listeners()
        #: ``drain(deadline)``'s deadline (``receiving._drain``).
        self.drain = DrainDeadline()

    # ------------------------------------------------------------------ how many

    def limit(self) -> int:
        """Messages the worker may hold: its handlers, plus a batch while handlers
        are quick - a hundredth of the visibility timeout - so that a prefetched
        message waits for a handler far less than its lease lasts."""
        if self.prefetch is not None:
            return self.concurrency + self.prefetch
        quick = self.duration is not None and (
            self.duration < self.manager.config.visibility_timeout / 100
        )
        return self.concurrency + (self.batch_size if quick else 0)

    def took(self, seconds: float) -> None:
        """A handler ran for ``seconds``."""
        last = self.duration
        self.duration = seconds if last is None else 0.8 * last + 0.2 * seconds

    # ------------------------------------------------------------------ receiving

    @property
    def backends(self) -> list[Backend]:
        """The queues it receives from, in the order given."""
        return [source.backend for source in self.sources.all]

    def receive(self, free: int) -> list[Message]:
        """One receive call of up to ``free`` messages (blocks for its long poll), from
        the queue whose turn it is (``Sources.pick``)."""
        sources = self.sources
        clock = self.manager.clock
        now = clock.now()
        source, may_wait = sources.pick(now)
        self.unreached.asked = source
        wait = self.wait_seconds
        if sources.several:
            wait = sources.long_poll(source, now, wait) if may_wait else 0.0
        # Holding groups of a FIFO queue, a long poll would not see them let go (SQS
        # hands out no more of a group in flight): ask without one, and, answered
        # empty, again as soon as one is let go (``held_back``).
        self.held_back = self.ordering.holds(source)
        if self.held_back:
            wait = 0.0
        try:
            messages = source.backend.receive(
                max_messages=min(self.batch_size, free),
                wait_seconds=wait,
                visibility_timeout=self.manager.config.visibility_timeout,
            )
        except Exception:
            sources.answered(source, 0, clock.now())  # a failing queue rests too
            raise
        sources.answered(source, len(messages), clock.now())
        self.unreached.answered(source)
        self.failures = 0
        for message in messages:
            unwrap(message)  # a continuation's envelope is not the handler's to see
        return messages

    def next_receive(self, asked_at: float) -> float:
        """After an empty answer to the receive sent at ``asked_at``: when to ask
        again. One queue: once its wait is up (a short poll, a driven clock: the rest
        of it). Several: as soon as one of them is awake. A FIFO queue asked without
        a long poll because groups of it are held (``held_back``): at most a
        ``MAX_REST`` later - or as soon as a group is let go (the loop waits for that)."""
        if self.sources.several:
            return self.sources.next_receive(self.manager.clock.now())
        if self.held_back:
            return asked_at + min(self.wait_seconds, MAX_REST)
        return asked_at + self.wait_seconds

    def source_of(self, lease: Lease) -> Source | None:
        """The queue ``lease``'s message came from."""
        return self.sources.of(lease.message.backend)

    def received(self, messages: Sequence[Message], refused: Sequence[Message]) -> None:
        """Count ``messages`` received, ``refused`` of them not leased, in total and
        per queue."""
        self.stats.received += len(messages)
        self.stats.refused += len(refused)
        only = self._only
        if only is not None:
            backend = only.backend
            only.stats.received += sum(message.backend is backend for message in messages)
            only.stats.refused += sum(message.backend is backend for message in refused)
            return
        for message in messages:
            source = self.sources.of(message.backend)
            if source is not None:
                source.stats.received += 1
        for message in refused:
            source = self.sources.of(message.backend)
            if source is not None:
                source.stats.refused += 1

    def receive_failed(self, exc: Exception, at_most: float = 30.0) -> float | None:
        """The pause before trying again after ``exc`` (``at_most`` seconds), or None:
        stop (a fatal ``ReceiveError``: the queue was deleted, the credentials were
        refused)."""
        self.unreached.failed(exc)
        if isinstance(exc, ReceiveError):
            if not exc.retryable:
                # Retrying cannot help: stop, letting running handlers finish, and say why.
                log.error("receive from %r failed for good, stopping: %s", self.backend, exc)
                return None
            self.failures += 1
            pause = min(backoff(self.failures), max(0.0, at_most))
            if pause > 0:
                log.warning("%s; retrying in %.1fs", exc, pause)
            else:  # the run ends now (until_idle, or a queue never reached)
                log.warning("%s", exc)
            return pause
        # Not a ReceiveError: a custom backend's own failure, or a bug. It may be
        # transient, so keep trying, and say what it was. Its text is not logged at
        # WARNING: leasekeeper cannot know what it quotes (the backends that ship
        # with it raise only ReceiveError for failures).
        self.failures += 1
        pause = min(backoff(self.failures), max(0.0, at_most))
        log.warning(
            "receive raised %s, not a leasekeeper ReceiveError; retrying in %.1fs",
            type(exc).__name__,
            pause,
        )
        if self.failures == 1:
            log.debug("the receive failure", exc_info=exc)
        return pause

    def register_all(
        self, messages: list[Message]
    ) -> tuple[list[tuple[Message, Lease]], list[Message]]:
        """Lease ``messages`` (at receipt, not when a handler frees up); returns the
        leased ones and the refused ones (too little invisibility left)."""
        leased: list[tuple[Message, Lease]] = []
        refused: list[Message] = []
        # All at once: a process renewer gets them in one write, not one a message.
        for message, lease in zip(messages, self.manager.register_many(messages), strict=True):
            if isinstance(lease, LeaseTooShort):
                log.warning("%s; leaving it to reappear", lease)
                refused.append(message)
            elif isinstance(lease, ManagerClosed):
                break
            elif isinstance(lease, Lease):
                leased.append((message, lease))
        return leased, refused

    def give_back(self, messages: Sequence[Message]) -> None:
        """Make ``messages`` visible again at once, unleased: a receive brought them
        after stop was asked (they were never handed to a handler, nor counted)."""
        by_queue: dict[int, tuple[Backend, list[Message]]] = {}
        for message in messages:
            by_queue.setdefault(id(message.backend), (message.backend, []))[1].append(message)
        for backend, group in by_queue.values():
            size = max(1, int(getattr(backend, "max_batch", 10)))
            for start in range(0, len(group), size):
                chunk = group[start : start + size]
                try:
                    backend.release([message.handle for message in chunk], 0.0)
                except Exception as exc:  # they come back when their invisibility ends
                    log.warning("could not give back %d message(s): %s", len(chunk), exc)
        log.info(
            "%d message(s) came in as the worker stopped: given back, not handled", len(messages)
        )

    # ------------------------------------------------------------------ settling

    def settle(self, lease: Lease, outcome: str, error: BaseException | None) -> str:
        """What a finished message counts as, once its queued delete (``outcome``
        "completed") or release was answered with ``error`` (None: done)."""
        if outcome == "completed" and error is not None:
            if isinstance(error, LeaseLost):
                log.warning("%s", error)
                return "lost"
            # The handler succeeded but the delete kept failing: stop renewing, so
            # the message comes back and is done again, not hidden for ever.
            log.error("delete of message %r failed (%s); left to lapse", lease.id, error)
            lease.owner.abandon(lease, "delete failed: left to lapse")
            return "failed"
        if error is not None and not isinstance(error, LeaseLost):
            log.warning("release of message %r failed: %s", lease.id, error)
        return outcome

    def roll_over(self, lease: Lease) -> str:
        """The handler raised ``Rollover``: send the continuation, delete the original
        (blocking: run it off an event loop). Returns what the message counts as."""
        try:
            settle_rollover(lease)
        except LeaseLost as exc:
            log.warning("not rolled over: %s", exc)
            return "lost"
        except Exception:
            return "failed"  # settle_rollover said what failed
        return "rolled_over"

    def fail(self, lease: Lease, error: BaseException) -> tuple[str, Future[None] | None]:
        """The handler raised ``error``: send a poison message to the dead-letter queue,
        or release the message - on a FIFO queue with the later messages of its group
        the worker holds, in the same call (blocking: ``AsyncWorker`` takes the same
        steps with its blocking ones off its loop). Returns what it counts as, and the
        release to wait for. A handler ``interrupted`` (``SystemExit``, a
        ``KeyboardInterrupt``) did not fail: ``release_interrupted``."""
        if interrupted(error):
            return self.release_interrupted(lease, error)
        if self.dead_lettered(lease, error):
            return "dead_lettered", None
        futures = self.release_failed(lease, error, self.ordering.take_rest(lease))
        return "failed", futures[0] if futures else None

    def dead_lettered(self, lease: Lease, error: BaseException) -> bool:
        """The handler raised ``error`` on a poison message, and there is a dead-letter
        queue: send it there, then delete it (blocking: run it off an event loop).
        False when it is no poison message, or the send failed: release it
        (``release_failed``). The workers' half of ``LeaseManager.fail_soon``."""
        failures = self.manager.failures
        # The workers swallow the handler's exception: its traceback goes in the line.
        return failures.dead_letters(lease) and failures.dead_letter_now(
            lease, error, traceback=True
        )

    def release_failed(
        self, lease: Lease, error: BaseException, rest: Sequence[Lease] = ()
    ) -> list[Future[None]] | None:
        """The handler raised ``error``: release the message after the failure policy's
        delay - with ``rest``, the later messages of its group the worker held, in the
        same call - through the coalescer. One future a lease, in order; None when the
        manager was closed in a hurry (its close released them). The other half of
        ``LeaseManager.fail_soon``."""
        failures = self.manager.failures
        seconds = failures.delay_for(lease, None)
        futures = self.ordering.release_together(lease, rest, seconds, failed=True)
        if futures is not None:
            failures.warn_released(lease, error, seconds, traceback=True)
        return futures

    def release_interrupted(
        self, lease: Lease, error: BaseException
    ) -> tuple[str, Future[None] | None]:
        """The handler was interrupted (``failures.interrupted``): its message goes back
        at once - on a FIFO queue with the later messages of its group the worker
        holds - never to the dead-letter queue, and counts ``interrupted``, not as a
        failure. Queued on the coalescer: nothing here waits (an event loop may call
        it); the release to wait for is returned, as ``fail`` returns a failure's (an
        idle worker is one whose releases were answered)."""
        rest = self.ordering.take_rest(lease)
        futures = self.ordering.release_together(lease, rest, 0.0, failed=True)
        if futures is not None:
            say_interrupted(lease, error)
        return "interrupted", futures[0] if futures else None

    def count(self, outcome: str, lease: Lease | None = None) -> None:
        """Count a finished message (``lease``'s), in total and for its queue."""
        field = outcome if outcome in _OUTCOMES else "failed"
        stats = self.stats
        setattr(stats, field, getattr(stats, field) + 1)
        if lease is None:
            return
        only = self._only
        if only is not None:  # one queue: no lookup, just the identity check
            source = only if lease.message.backend is only.backend else None
        else:
            source = self.sources.of(lease.message.backend)
        if source is not None:
            setattr(source.stats, field, getattr(source.stats, field) + 1)


def _queues_and_manager(
    kind: str,
    manager_or_backend: Queues,
    *,
    config: LeaseConfig | None,
    renewer: Literal["thread", "process", "auto"] | None,
    clock: Clock | None,
    dead_letter: DeadLetter | Sequence[DeadLetter],
    weights: Sequence[int] | None,
    config_fields: dict[str, Any],
) -> tuple[LeaseManager, Backend, bool, list[Backend] | None]:
    """A worker's manager, its (first) queue, whether the worker made the manager (and
    so closes it), and its queues when it was given a list."""
    backends: list[Backend] | None = None
    if isinstance(manager_or_backend, Sequence) and not isinstance(manager_or_backend, str):
        backends = list(manager_or_backend)
        if not backends:
            raise ValueError(f"{kind} needs at least one queue, got an empty list")
        for queue in backends:
            if not isinstance(queue, Backend):
                raise TypeError(
                    f"{kind} takes a list of leasekeeper backends, got a "
                    f"{type(queue).__qualname__} in it"
                )
        if len({id(queue) for queue in backends}) != len(backends):
            raise ValueError(f"{kind} got the same queue twice")
    elif weights is not None:
        raise TypeError(f"weights are for a {kind} of several queues (a list of backends)")
    if backends is not None:
        manager = _multi_queue_manager(
            backends,
            config=config,
            renewer=renewer,
            clock=clock,
            dead_letter=dead_letter,
            config_fields=config_fields,
        )
        return manager, backends[0], True, backends
    if isinstance(manager_or_backend, LeaseManager):
        if (
            config is not None
            or config_fields
            or renewer is not None
            or clock is not None
            or dead_letter is not None
        ):
            raise TypeError(
                f"pass config, renewer, clock and dead_letter to the LeaseManager, not "
                f"to a {kind} built on one"
            )
        if manager_or_backend.backend is None:
            raise ValueError("the LeaseManager has no backend to receive from")
        return manager_or_backend, manager_or_backend.backend, False, None
    if isinstance(manager_or_backend, Backend):
        if not (dead_letter is None or isinstance(dead_letter, (str, Backend))):
            raise TypeError(f"one queue takes one dead_letter, got {dead_letter!r}")
        manager = LeaseManager(
            manager_or_backend,
            config,
            renewer=renewer or DEFAULT_RENEWER,
            clock=clock,
            dead_letter=dead_letter,
            **config_fields,
        )
        return manager, manager_or_backend, True, None
    raise TypeError(
        f"{kind} needs a LeaseManager or a leasekeeper backend, got "
        f"{type(manager_or_backend).__qualname__}"
    )


class Unreached:
    """Which of a run's queues no receive has reached yet, and the last failure of
    each: what stops a run that cannot reach its queue (docs/guide.md, "When a
    service cannot be reached")."""

    def __init__(self) -> None:
        self._errors: dict[int, Exception | None] = {}
        #: The queue of the receive last sent.
        self.asked: Source | None = None

    def start(self, sources: Sequence[Source]) -> None:
        """A run begins: none of ``sources`` has been reached in it yet."""
        self._errors = {id(source): None for source in sources}
        self.asked = None

    def answered(self, source: Source) -> None:
        self._errors.pop(id(source), None)

    def failed(self, exc: Exception) -> None:
        """The receive last sent failed with ``exc``."""
        if self.asked is not None and id(self.asked) in self._errors:
            self._errors[id(self.asked)] = exc

    def asked_not_reached(self) -> bool:
        """Whether the queue of the receive last sent is one this run has not reached."""
        return self.asked is not None and id(self.asked) in self._errors

    def error(self) -> ReceiveError | None:
        """The last failure of a queue no receive of this run has reached (as a
        ``ReceiveError``), or None when every queue answered at least once."""
        for error in self._errors.values():
            if isinstance(error, ReceiveError):
                return error
            if error is not None:
                # A custom backend's own exception: its text is not repeated.
                unreached = ReceiveError(
                    "retry", f"{type(error).__name__} (not a leasekeeper ReceiveError)"
                )
                unreached.__cause__ = error
                return unreached
        return None

    def after(self, seconds: float) -> ReceiveError | None:
        """``error()`` once a run has lasted ``seconds`` of ``REACH_WITHIN``, said in
        one ERROR line; None before, or when every queue answered."""
        if seconds < REACH_WITHIN:
            return None
        error = self.error()
        if error is not None:
            log.error(
                "no answer from the queue in %gs since the worker started, stopping: %s",
                REACH_WITHIN,
                error,
            )
        return error


def check_handler_signature(kind: str, handler: Callable[..., object]) -> None:
    """Refuse, at construction, a handler that cannot take one message: accepted,
    every message would fail with a TypeError and be retried for ever."""
    problem = handler_signature_problem(handler)
    if problem is not None:
        raise TypeError(
            f"{kind}'s handler {getattr(handler, '__qualname__', repr(handler))} "
            f"{problem}; give it one parameter for the message: def handle(message)"
        )


def handler_signature_problem(handler: Callable[..., object]) -> str | None:
    """Why ``handler`` cannot be called with one message ("cannot be called with one
    message: it takes (a, b)"), or None when it can - or when it has no signature
    to read (some builtins): then it is given the benefit of the doubt."""
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind(object())
    except TypeError as exc:
        return f"cannot be called with one message: it takes {signature} ({exc})"
    return None


#: The outcomes counted under their own name; any other is "failed".
_OUTCOMES = frozenset(
    ("completed", "rolled_over", "lost", "dead_lettered", "held_back", "interrupted")
)


def _per_queue(name: str, value: Any, count: int) -> list[Any]:
    """``value`` for each of ``count`` queues: a list of ``count``, or one for all."""
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise ValueError(
                f"{name} has {len(value)} entries for {count} queues: give one a queue, "
                "or one for all"
            )
        return list(value)
    return [value] * count


def _multi_queue_manager(
    backends: list[Backend],
    *,
    config: LeaseConfig | None,
    renewer: Literal["thread", "process", "auto"] | None,
    clock: Clock | None,
    dead_letter: DeadLetter | Sequence[DeadLetter],
    config_fields: dict[str, Any],
) -> LeaseManager:
    """One manager (and renewer) for every queue of a multi-queue worker; each queue's
    failures follow its own ``dead_letter`` and ``max_receives``."""
    fields = dict(config_fields)
    max_receives = _per_queue("max_receives", fields.pop("max_receives", None), len(backends))
    dead_letters = _per_queue("dead_letter", dead_letter, len(backends))
    for most in max_receives:
        if most is not None and (isinstance(most, bool) or not isinstance(most, int) or most < 1):
            raise ValueError(f"max_receives must be None or integers >= 1, got {most!r}")
    manager = LeaseManager(
        backends[0],
        config,
        renewer=renewer or DEFAULT_RENEWER,
        clock=clock,
        queues=backends,
        **fields,
    )
    try:
        for queue, target, most in zip(backends, dead_letters, max_receives, strict=True):
            manager.failures.add_queue(
                queue,
                resolve_dead_letter(target, queue),
                manager.config.max_receives if most is None else most,
            )
    except BaseException:
        manager.close()
        raise
    return manager


def backoff(failures: int) -> float:
    """The pause after the ``failures``-th receive failure in a row: 0.2 s doubling
    to 30 s, jittered so that workers that failed together do not retry together."""
    return min(30.0, 0.1 * 2.0 ** min(failures, 9) * random.uniform(0.8, 1.2))
