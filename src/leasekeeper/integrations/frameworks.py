"""What the Celery and Dramatiq integrations share: watch leases on the SQS messages a
task framework received, one LeaseManager per queue, forgotten by receipt.

A framework that receives, acks and rejects its own messages cannot hand them to
``manager.lease()``: leasekeeper would delete them. It *watches* them instead
(``LeaseManager.watch``): renewed like any lease, never deleted or released by
leasekeeper, forgotten (``lease.forget()``) right before the framework's own delete
or visibility change, so a late extend never overwrites it.

``FrameworkLeases`` is the per-process half the integrations share: a manager per
queue, made at the queue's first message (in the process that consumes, after a
prefork pool forked) with the timeout SQS really applies there; the receipts of the
messages watched, so an ack, a reject or a requeue that names only a receipt finds
its lease; ``close()`` at shutdown. Where a framework's own timeout is 3 seconds,
LeaseConfig's defaults (a 1 s tick, 2 s of minimal life) do not fit:
``framework_config`` scales them down with the timeout.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import ConfigError, LeaseError
from leasekeeper.lease import WatchLease
from leasekeeper.manager import LeaseManager

__all__ = [
    "FrameworkLeases",
    "QueueLeases",
    "QueueSetup",
    "check_manager_options",
    "framework_config",
    "received_before",
]

log = logging.getLogger("leasekeeper.frameworks")

# LeaseManager's own keywords a framework integration passes through (the backend
# and the config it builds itself, per queue).
_MANAGER_KEYWORDS = frozenset(
    name
    for name in inspect.signature(LeaseManager.__init__).parameters
    if name not in ("self", "backend", "config", "config_fields")
)
_CONFIG_FIELDS = frozenset(field.name for field in dataclasses.fields(LeaseConfig))


def check_manager_options(options: Mapping[str, Any], framework: str) -> None:
    """Raise ``ConfigError`` at configuration time for a name neither LeaseManager
    nor LeaseConfig takes (the values are checked per queue, with its timeout)."""
    known = _MANAGER_KEYWORDS | _CONFIG_FIELDS | {"config"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise ConfigError(
            f"{framework}: unknown leasekeeper option(s) {', '.join(unknown)}; "
            f"known: {', '.join(sorted(known))}"
        )
    config = options.get("config")
    if config is not None and not isinstance(config, LeaseConfig):
        raise ConfigError(f"{framework}: config must be a LeaseConfig, got {type(config).__name__}")


def framework_config(visibility_timeout: float, options: Mapping[str, Any]) -> LeaseConfig:
    """The LeaseConfig for a queue whose messages SQS hides for ``visibility_timeout``
    seconds at receipt, from the user's ``options`` (LeaseConfig fields, and
    ``config``).

    Extends set the visibility back to that timeout unless ``visibility_timeout`` is
    among the options. ``timer_interval`` and ``minimal_life`` default to LeaseConfig's
    (1 s and 2 s) capped at a sixth of the shorter of the two timeouts, so a 3-second
    queue gets 0.5 s and 0.5 s and renews each lease when 1 s is left.
    """
    fields = {name: value for name, value in options.items() if name in _CONFIG_FIELDS}
    base: LeaseConfig | None = options.get("config")
    renew_to = fields.get(
        "visibility_timeout", base.visibility_timeout if base else visibility_timeout
    )
    shortest = min(float(renew_to), visibility_timeout)
    scaled: dict[str, Any] = {"visibility_timeout": renew_to}
    defaults = LeaseConfig()
    for name, default in (
        ("timer_interval", defaults.timer_interval),
        ("minimal_life", defaults.minimal_life),
    ):
        if name not in fields and (base is None or getattr(base, name) == default):
            scaled[name] = min(default, shortest / 6.0)
    scaled.update(fields)
    return LeaseConfig.from_fields(base, scaled)


def received_before(message: Message, instant: float) -> Message:
    """``message`` counted from ``instant`` (a moment before the receive request was
    sent) when that is earlier than the receive time ``adopt`` assumed (now).

    A message is hidden from the moment the service hands it out, which is after the
    request left: counting from before it never makes the local deadline later than
    the service's (rule 1 in docs/design.md)."""
    if instant >= message.received_at:
        return message
    return Message(
        id=message.id,
        body=message.body,
        receipt=message.receipt,
        backend=message.backend,
        received_at=instant,
        visibility_timeout=message.visibility_timeout,
        receive_count=message.receive_count,
        raw=message.raw,
        deadline_hint=message.deadline_hint,
        hard_deadline=message.hard_deadline,
        attributes=message.attributes,
        group=message.group,
    )


class QueueSetup(NamedTuple):
    """What a framework integration tells about a queue at its first message."""

    backend: Backend  # renews this queue's messages (through the framework's client)
    visibility_timeout: float  # what SQS applies to a message of it at receipt


class QueueLeases:
    """One queue's manager and the timeout SQS applies to its messages at receipt."""

    __slots__ = ("backend", "manager", "name", "visibility_timeout")

    def __init__(
        self, name: str, backend: Backend, manager: LeaseManager, visibility_timeout: float
    ) -> None:
        self.name = name
        self.backend = backend
        self.manager = manager
        self.visibility_timeout = visibility_timeout

    def __repr__(self) -> str:
        return f"<QueueLeases {self.name!r} {self.manager!r}>"


class FrameworkLeases:
    """The watch leases of one worker process, over every queue it consumes.

    ``FrameworkLeases(framework, options)``: ``framework`` names the integration in
    log lines; ``options`` are the user's LeaseManager/LeaseConfig keywords.
    ``queue(key, setup)`` is the queue's ``QueueLeases``, made by ``setup()`` on the
    first call for ``key`` (None, logged, when it cannot be);
    ``watch(queue, raw)`` adopts an SDK message and watches it; ``forget(receipt)``
    stops renewing it; ``close()`` closes every manager (forgetting, never
    releasing, what is still watched). Safe to call from several threads.
    """

    def __init__(self, framework: str, options: Mapping[str, Any]) -> None:
        check_manager_options(options, framework)
        self.framework = framework
        self.options = dict(options)
        self._queues: dict[str, QueueLeases | None] = {}
        self._lock = threading.Lock()  # guards creating queues and closing
        # receipt -> lease: the framework's ack, reject or requeue names the receipt.
        self._leases: dict[str, WatchLease] = {}
        self.closed = False

    # ------------------------------------------------------------------ queues

    def queue(self, key: str, setup: Callable[[], QueueSetup]) -> QueueLeases | None:
        """The ``QueueLeases`` for ``key`` (a queue URL), set up at its first call.

        ``setup()`` runs once per key; when it raises, or the config its timeout
        asks for is invalid, the error is logged and the queue's messages are not
        watched (the framework runs them as it would without leasekeeper).
        """
        try:
            return self._queues[key]
        except KeyError:
            pass
        with self._lock:
            if key in self._queues:
                return self._queues[key]
            if self.closed:
                return None
            made: QueueLeases | None = None
            try:
                backend, timeout = setup()
                config = framework_config(timeout, self.options)
                # The thread renewer unless asked: Celery's consumer runs no task code,
                # and a renewer process started per queue would make a framework's
                # worker wait for it before its first receive.
                keywords = {
                    "renewer": "thread",
                    **{
                        name: value
                        for name, value in self.options.items()
                        if name in _MANAGER_KEYWORDS
                    },
                }
                manager = LeaseManager(backend, config, **keywords)
                try:
                    manager.start()  # a renewer process renews before the first receive
                except LeaseError:
                    manager.close()
                    raise
                made = QueueLeases(key, backend, manager, timeout)
            except LeaseError as exc:
                log.error(
                    "%s: messages of queue %s will not be renewed: %s", self.framework, key, exc
                )
                self._queues[key] = None
                return None
            except Exception as exc:
                # A failed read (GetQueueAttributes): try again at the next message.
                log.warning(
                    "%s: cannot set up lease renewal for queue %s yet (%s: %s); "
                    "this message is not renewed",
                    self.framework,
                    key,
                    type(exc).__name__,
                    exc,
                )
                return None
            self._queues[key] = made
            return made

    def queues(self) -> list[QueueLeases]:
        """The queues set up so far."""
        with self._lock:
            return [queue for queue in self._queues.values() if queue is not None]

    # ------------------------------------------------------------------ leases

    def watch(
        self, queue: QueueLeases, raw: Any, received_at: float | None = None
    ) -> WatchLease | None:
        """Adopt ``raw`` (the SDK's message) into ``queue`` and watch it.

        ``received_at`` (the manager's clock) is a moment before the receive request
        left, when the integration knows one; otherwise the lease counts from now.
        Returns None, logged, when the message cannot be watched (less than
        ``minimal_life`` left, or the manager closed): the framework runs it anyway.
        """
        try:
            message = queue.backend.adopt(raw, queue.visibility_timeout)
            if received_at is not None:
                message = received_before(message, received_at)
            lease = queue.manager.watch(message)
        except LeaseError as exc:
            if not self.closed:
                log.warning(
                    "%s: message %r of queue %s is not renewed: %s",
                    self.framework,
                    _message_id(raw),
                    queue.name,
                    exc,
                )
            return None
        self._leases[lease.message.receipt] = lease
        return lease

    def forget(self, receipt: str) -> None:
        """Stop renewing the message whose receipt is ``receipt`` (the framework is
        about to ack, reject or requeue it); returns once no extend of it is in
        flight. An unknown receipt (a message not watched) does nothing."""
        lease = self._leases.pop(receipt, None)
        if lease is not None:
            lease.forget()

    def lease(self, receipt: str) -> WatchLease | None:
        """The watch lease of the message whose receipt is ``receipt``, if any."""
        return self._leases.get(receipt)

    def close(self) -> None:
        """Close every manager: what is still watched is forgotten, never released
        (the framework requeues its messages itself). Closing twice does nothing."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            queues = [queue for queue in self._queues.values() if queue is not None]
        for queue in queues:
            queue.manager.close()  # forgets watch leases; releases nothing
        self._leases.clear()


def _message_id(raw: Any) -> str:
    if isinstance(raw, Mapping):
        return str(raw.get("MessageId", "?"))
    return str(getattr(raw, "message_id", "?"))
