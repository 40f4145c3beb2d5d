"""What happens to a message whose handler failed: ``Failures``, the poison-message policy.

A failed message is released with a delay that grows per receive (``release_delay``
grown by ``release_backoff``, jittered, at most ``release_delay_max``: by default
1 s, 2 s, 4 s ... 5 min), so a handler that always fails is tried again a few times
a minute at first and then every few minutes - never in a hot loop. A message
received ``max_receives`` times that fails again is a poison message:

- with a dead-letter queue (``dead_letter=``), its body and attributes are *sent*
  there, with a few attributes of leasekeeper's own (where it came from, how often
  it was received, the last error's type), and only *then* deleted from its queue:
  a crash in between leaves a duplicate in the dead-letter queue, never a loss;
- without one, it is left to the service, released as before: SQS moves it to the
  queue's own dead-letter queue if the queue has a redrive policy (read once, and
  said in one INFO line when a worker starts); otherwise it is retried for ever,
  which one WARNING says at the first such failure of the process (not at start: a
  program whose handlers never fail hears nothing of it).

Every failure is one WARNING line naming the message id and its receive count
(never a receipt). The same policy serves ``with held:``, ``with lease(msg):``,
``@leased`` and the workers: they all end a failed message through it.

A handler stopped by a ``BaseException`` that is not an ``Exception`` - Ctrl-C's
``KeyboardInterrupt``, ``SystemExit``, a cancellation - did not fail: it was
interrupted (``interrupted``). Its message is released at once (no release delay),
is never dead-lettered whatever its receive count, and is not counted or warned of
as a failure; one INFO line says so.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from leasekeeper.backends.contract import Backend
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import ConfigError

if TYPE_CHECKING:
    from leasekeeper.lease import Lease

__all__ = [
    "DEFAULT_MAX_RECEIVES",
    "RETRIED_FOR_EVER",
    "Failures",
    "OncePerProcess",
    "interrupted",
    "resolve_dead_letter",
    "say_interrupted",
]

log = logging.getLogger("leasekeeper.failures")

#: ``max_receives`` when a ``dead_letter`` queue is given without one.
DEFAULT_MAX_RECEIVES = 5
#: The attributes leasekeeper adds to a dead-letter copy.
SOURCE, RECEIVES, ERROR = "leasekeeper-source", "leasekeeper-receive-count", "leasekeeper-error"


class OncePerProcess:
    """A warning said once in a process, whichever manager or worker comes to it first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.said = False

    def claim(self) -> bool:
        """True the first time only: the caller says it."""
        with self._lock:
            first, self.said = not self.said, True
        return first


#: "A failing message is retried for ever": said at the first failure it concerns.
RETRIED_FOR_EVER = OncePerProcess()


def interrupted(error: BaseException | None) -> bool:
    """Was the handler interrupted rather than failed: stopped by a ``BaseException``
    that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``,
    ``asyncio.CancelledError``, ``GeneratorExit``)?"""
    return error is not None and not isinstance(error, Exception)


def say_interrupted(lease: Lease, error: BaseException | None) -> None:
    """The one line of an interrupted handler's message, released at once: INFO, as
    Ctrl-C is no failure."""
    log.info("handler for message %r interrupted%s; released at once", lease.id, _what(error))


def resolve_dead_letter(target: Backend | str | None, source: Backend | None) -> Backend | None:
    """The dead-letter queue ``target`` names: a backend as given; a URL (with a
    ``://``) through ``leasekeeper.connect``; ``"poison"`` on a backend that has a
    poison-queue convention (Azure: ``<queue>-poison``, created if missing); any other
    name, the queue of that name beside ``source`` on the same service."""
    if target is None or not isinstance(target, str):
        return target
    if "://" in target:
        from leasekeeper.backends.registry import connect

        return connect(target)
    if source is None:
        raise ConfigError(
            f"dead_letter={target!r} names a queue beside the manager's backend; "
            "give the manager a backend"
        )
    if target == "poison" and hasattr(source, "poison_queue"):
        queue: Backend = source.poison_queue()
        return queue
    sibling = getattr(source, "sibling", None)
    if sibling is None:
        raise ConfigError(
            f"{source!r} cannot open a queue by name: give dead_letter a backend or a URL"
        )
    queue = sibling(target, create=True)
    return queue


class Failures:
    """The poison-message policy of one manager (see the module docstring)."""

    def __init__(
        self,
        config: LeaseConfig,
        dead_letter: Backend | None,
        rng: random.Random | None = None,
        *,
        max_receives: int | None = None,
    ) -> None:
        if dead_letter is not None and not callable(getattr(dead_letter, "send", None)):
            raise ConfigError(f"dead_letter {dead_letter!r} cannot take messages (no send())")
        self.dead_letter = dead_letter
        self._config = config
        # The jitter of release delays: seeded (jitter_seed) for a replayable test.
        self._rng = rng if rng is not None else random.Random()
        self.max_receives = config.max_receives if max_receives is None else max_receives
        if self.max_receives is None and dead_letter is not None:
            self.max_receives = DEFAULT_MAX_RECEIVES
        self._lock = threading.Lock()  # guards _dead_lettered, _announced and _redrives
        self._dead_lettered = 0
        self._announced = False
        # Each source queue's redrive policy, read once (id of the backend -> policy).
        self._redrives: dict[int, Mapping[str, Any] | None] = {}
        # A multi-queue worker's queues' own policies, by id(backend) (add_queue).
        self._queues: dict[int, tuple[Backend, Failures]] = {}
        #: How the announcement names the queue (a multi-queue worker's: its name).
        self.queue_label = ""

    def add_queue(
        self, backend: Backend, dead_letter: Backend | None, max_receives: int | None
    ) -> Failures:
        """Give the messages of ``backend`` a policy of their own: their
        ``dead_letter`` queue and ``max_receives`` (a multi-queue worker's, per queue).
        Returns it."""
        own = Failures(self._config, dead_letter, self._rng, max_receives=max_receives)
        own.queue_label = f"{_queue_name(backend)}: "
        self._queues[id(backend)] = (backend, own)
        return own

    def _policy(self, lease: Lease) -> Failures:
        """The policy of ``lease``'s queue: its own (``add_queue``), else this one."""
        if self._queues:
            backend = lease.message.backend
            found = self._queues.get(id(backend))
            if found is not None and found[0] is backend:
                return found[1]
        return self

    @property
    def dead_lettered(self) -> int:
        """Messages sent to a dead-letter queue (every queue's, with ``add_queue``)."""
        return self._dead_lettered + sum(own.dead_lettered for _, own in self._queues.values())

    def poisoned(self, lease: Lease) -> bool:
        """Has ``lease``'s message had its last try (received ``max_receives`` times)?"""
        policy = self._policy(lease)
        if policy is not self:
            return policy.poisoned(lease)
        return self.max_receives is not None and lease.receive_count >= self.max_receives

    def fail(self, lease: Lease, error: BaseException | None, delay: float | None) -> None:
        """End ``lease`` whose handler failed with ``error``, now: dead-letter a poison
        message, release any other (after ``delay``, or the grown delay). A handler
        that was ``interrupted`` did not fail: its message is released at once."""
        if interrupted(error):
            lease.release(0.0)
            say_interrupted(lease, error)
            return
        policy = self._policy(lease)
        if policy is not self:
            return policy.fail(lease, error, delay)
        if self.dead_letters(lease) and self.dead_letter_now(lease, error):
            return
        seconds = self.delay_for(lease, delay)
        lease.release(seconds)
        if lease.state.value == "released":  # else lost meanwhile: reported as such
            self.warn_released(lease, error, seconds)

    def dead_letters(self, lease: Lease) -> bool:
        """Does a failure of ``lease`` now send its message to the dead-letter queue?"""
        policy = self._policy(lease)
        if policy is not self:
            return policy.dead_letters(lease)
        return self.dead_letter is not None and self.poisoned(lease)

    def delay_for(self, lease: Lease, delay: float | None) -> float:
        """How long the failed message stays invisible: ``delay``, or ``release_delay``
        grown per receive and jittered."""
        if delay is not None:
            return delay
        return self._config.failed_delay(lease.receive_count, self._rng.uniform(0.8, 1.2))

    def dead_letter_now(
        self, lease: Lease, error: BaseException | None, *, traceback: bool = False
    ) -> bool:
        """Send ``lease``'s message to the dead-letter queue, then delete it. False
        when the send failed (the caller releases it as any failed message)."""
        policy = self._policy(lease)
        if policy is not self:
            return policy.dead_letter_now(lease, error, traceback=traceback)
        if not self._copy(lease, error):
            return False
        lease.complete()  # only once the copy is in: a crash leaves a duplicate, not a loss
        with self._lock:
            self._dead_lettered += 1
        log.warning(
            "handler failed for message %r (receive %d%s)%s; moved to the dead-letter queue %r",
            lease.id,
            lease.receive_count,
            self._of(),
            _what(error),
            self.dead_letter,
            exc_info=error if traceback else None,
        )
        return True

    def warn_released(
        self,
        lease: Lease,
        error: BaseException | None,
        delay: float,
        *,
        traceback: bool = False,
    ) -> None:
        """The one WARNING of a failure whose message was released (with ``error``'s
        traceback when nobody else will see it: a worker swallows it); for a handler
        ``interrupted``, no failure, its INFO line."""
        if interrupted(error):
            return say_interrupted(lease, error)
        policy = self._policy(lease)
        if policy is not self:
            return policy.warn_released(lease, error, delay, traceback=traceback)
        tail = "; left to the queue's own redrive policy" if self.poisoned(lease) else ""
        log.warning(
            "handler failed for message %r (receive %d%s)%s; released: back in %.1fs%s",
            lease.id,
            lease.receive_count,
            self._of(),
            _what(error),
            delay,
            tail,
            exc_info=error if traceback else None,
        )
        if self.dead_letter is None and not RETRIED_FOR_EVER.said:
            self._say_retried_for_ever(lease.message.backend)

    def _say_retried_for_ever(self, source: Backend | None) -> None:
        """Once per process, at the first failure with nowhere for the message to end."""
        if self._redrive_of(source) is None and RETRIED_FOR_EVER.claim():
            log.warning(
                "a message whose handler keeps failing is retried for ever (with growing "
                "delays): give max_receives and dead_letter (--max-receives, --dead-letter), "
                "or the queue a redrive policy"
            )

    def _redrive_of(self, source: Backend | None) -> Mapping[str, Any] | None:
        """``source``'s redrive policy, asked of the service once."""
        key = id(source)
        with self._lock:
            if key in self._redrives:
                return self._redrives[key]
        policy = _redrive(source)
        with self._lock:
            self._redrives[key] = policy
        return policy

    def _of(self) -> str:
        return "" if self.max_receives is None else f" of {self.max_receives}"

    def _copy(self, lease: Lease, error: BaseException | None) -> bool:
        """Send ``lease``'s message to the dead-letter queue; False (logged) when the
        send failed: then the message is released as any failed one."""
        target = self.dead_letter
        assert target is not None
        message = lease.message
        attributes: dict[str, str] = dict(getattr(message, "attributes", None) or {})
        attributes[SOURCE] = _queue_name(message.backend)
        attributes[RECEIVES] = str(lease.receive_count)
        if error is not None:
            attributes[ERROR] = type(error).__name__
        # A FIFO dead-letter queue (SQS wants one for a FIFO queue) takes each message
        # in a group: the failed message's own, so the copies keep their groups' order.
        options: dict[str, Any] = {}
        if getattr(target, "fifo", False) and message.group is not None:
            options["group_id"] = message.group
        try:
            if getattr(target, "carries_attributes", True):
                try:
                    target.send(message.body, attributes, **options)  # type: ignore[attr-defined]
                except ValueError:
                    # Too many attributes for the service (SQS takes ten): the
                    # message's own are what matters.
                    own = dict(getattr(message, "attributes", None) or {})
                    target.send(message.body, own or None, **options)  # type: ignore[attr-defined]
            else:
                target.send(message.body, **options)  # type: ignore[attr-defined]
        except Exception as exc:
            log.error(
                "could not send message %r to the dead-letter queue %r (%s); released instead",
                lease.id,
                target,
                type(exc).__name__,
            )
            return False
        return True

    def announce(self, source: Backend | None) -> None:
        """Say once, when a worker or a receive loop starts, where failing messages
        end: the dead-letter queue, or the queue's own redrive policy. Nowhere is said
        at the first failure (``warn_released``), if one comes."""
        found = self._queues.get(id(source))
        if found is not None and found[0] is source:
            found[1].announce(source)
            return
        with self._lock:
            if self._announced:
                return
            self._announced = True
        if self.dead_letter is not None:
            log.info(
                "%sa message whose handler fails %d times goes to the dead-letter queue %r",
                self.queue_label,
                self.max_receives,
                self.dead_letter,
            )
            return
        redrive = self._redrive_of(source)
        if redrive is not None:
            log.info(
                "%sthe queue's redrive policy moves a message received %s times to %s",
                self.queue_label,
                redrive.get("maxReceiveCount", "?"),
                redrive.get("deadLetterTargetArn", "its dead-letter queue"),
            )


def _what(error: BaseException | None) -> str:
    # The type only: an exception's text may quote what it was handling.
    return "" if error is None else f": {type(error).__name__}"


def _redrive(source: Backend | None) -> Mapping[str, Any] | None:
    read = getattr(source, "redrive_policy", None)
    if read is None:
        return None
    try:
        policy: Mapping[str, Any] | None = read()
    except Exception as exc:  # the announcement must not stop a worker
        log.info("could not read the queue's redrive policy (%s)", type(exc).__name__)
        return None
    return policy


def _queue_name(backend: object) -> str:
    for name in ("url", "queue_url", "name", "queue_name"):
        value = getattr(backend, name, None)
        if isinstance(value, str) and value:
            return value
    return type(backend).__name__
