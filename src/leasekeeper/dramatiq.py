"""Dramatiq on SQS (dramatiq-sqs): long tasks run once, a dead worker's tasks come
back within the timeout.

Two lines where the broker is made::

    from leasekeeper.dramatiq import LeaseMiddleware
    broker.add_middleware(LeaseMiddleware(visibility_timeout=30))

dramatiq-sqs's ``SQSBroker`` sends its own ``visibility_timeout`` on every receive,
12 hours unless told otherwise; the middleware sets it to its ``visibility_timeout``
(LeaseConfig's 30 s by default) in each worker process, and watches
(``LeaseManager.watch``) every message its consumers receive, from just before the
receive request (prefetched ones included), through the work queue and the actor,
until dramatiq acks (deletes), nacks (dead-letter copy, then delete) or requeues it:
the lease is forgotten right before each. See docs/dramatiq.md.

Dramatiq has no middleware hook at receipt nor at requeue (``Worker.requeue_messages``
and the consumer's ``close()`` put prefetched messages back without one), so the
middleware wraps the broker's ``consume`` in each worker process (at
``before_worker_boot``: ``after_consumer_thread_boot`` fires before the consumer
exists) and hands dramatiq a ``WatchingConsumer``, dramatiq-sqs's own consumer
with the watches added.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import Any

from dramatiq import Broker, Middleware, Worker
from dramatiq_sqs import SQSBroker
from dramatiq_sqs.broker import MAX_VISIBILITY_TIMEOUT_SECONDS, SQSConsumer

from leasekeeper.backends.shared import is_seconds
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import ConfigError
from leasekeeper.integrations.frameworks import FrameworkLeases, QueueSetup, check_manager_options

__all__ = ["LeaseMiddleware", "WatchingConsumer"]

log = logging.getLogger("leasekeeper.dramatiq")

FRAMEWORK = "leasekeeper.dramatiq"


class WatchingConsumer(SQSConsumer):  # type: ignore[misc]
    """dramatiq-sqs's consumer, watching every message it receives until dramatiq
    acks, nacks or requeues it. Made by ``LeaseMiddleware``'s wrapped ``consume``
    with the arguments the broker gave its own consumer, plus ``leases`` and the
    broker's boto3 ``client`` (renewals go through it)."""

    def __init__(
        self,
        queue: Any,
        prefetch: int,
        timeout: int,
        *,
        dead_letter_queue: Any,
        visibility_timeout: int | None,
        leases: FrameworkLeases,
        client: Any,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(
            queue,
            prefetch,
            timeout,
            dead_letter_queue=dead_letter_queue,
            visibility_timeout=visibility_timeout,
        )
        self.leases = leases
        self.client = client
        self.clock = clock
        # Set up now, in the consumer thread before its first receive: a manager with
        # renewer="process" takes seconds to start its process, which a message
        # received meanwhile would spend out of its lease.
        self.watched = leases.queue(queue.url, self._setup)

    def _setup(self) -> QueueSetup:
        backend = SQSBackend(self.client, self.queue.url, clock=self.clock)
        sent = self.visibility_timeout
        applied = float(sent) if sent is not None else backend.queue_visibility_timeout()
        log.info(
            "leasekeeper: renewing the messages of queue %s; SQS hides them for %gs at "
            "receipt (%s)",
            self.queue.url,
            applied,
            "SQSBroker's visibility_timeout, sent on every receive"
            if sent is not None
            else "the queue's VisibilityTimeout",
        )
        return QueueSetup(backend, applied)

    def __next__(self) -> Any:
        if self.messages:
            return super().__next__()  # a prefetched message: no receive this time
        # A receive happens only when the buffer is empty; its messages count from
        # before the request (the long poll may wait up to the worker timeout).
        started = self.clock.now()
        message = super().__next__()
        if message is not None:
            queue = self.watched or self.leases.queue(self.queue.url, self._setup)
            if queue is not None:
                for received in (message, *self.messages):
                    self.leases.watch(queue, received._sqs_message, received_at=started)
        return message

    def ack(self, message: Any) -> None:
        self.leases.forget(message._sqs_message.receipt_handle)
        super().ack(message)

    def nack(self, message: Any) -> None:
        self.leases.forget(message._sqs_message.receipt_handle)
        super().nack(message)

    def requeue(self, messages: Iterable[Any]) -> None:
        # Worker.requeue_messages, and close() for the prefetch buffer.
        messages = list(messages)
        for message in messages:
            self.leases.forget(message._sqs_message.receipt_handle)
        super().requeue(messages)


class LeaseMiddleware(Middleware):
    """Keep dramatiq-sqs's messages invisible while they wait and run (see the module
    docstring). ``manager_options`` are LeaseManager and LeaseConfig keywords;
    ``visibility_timeout`` (whole seconds, default 30) is both what the broker
    receives with and what every renewal sets. The defaults work down to 3 s."""

    def __init__(self, **manager_options: Any) -> None:
        check_manager_options(manager_options, FRAMEWORK)
        base: LeaseConfig | None = manager_options.get("config")
        timeout = manager_options.get(
            "visibility_timeout",
            base.visibility_timeout if base is not None else LeaseConfig.visibility_timeout,
        )
        if not is_seconds(timeout) or not 0 < timeout <= MAX_VISIBILITY_TIMEOUT_SECONDS:
            raise ConfigError(
                f"{FRAMEWORK}: visibility_timeout must be seconds in (0, "
                f"{MAX_VISIBILITY_TIMEOUT_SECONDS}], got {timeout!r}"
            )
        # SQSBroker sends it as whole seconds: a fraction is rounded up (the safe side).
        self.visibility_timeout = math.ceil(timeout)
        self.manager_options = {**manager_options, "visibility_timeout": self.visibility_timeout}
        self.leases: FrameworkLeases | None = None

    def before_worker_boot(self, broker: Broker, worker: Worker) -> None:
        if not isinstance(broker, SQSBroker):
            log.warning(
                "leasekeeper: %s is not dramatiq-sqs's SQSBroker: no leases are kept",
                type(broker).__name__,
            )
            return
        broker.visibility_timeout = self.visibility_timeout
        leases = self.leases = FrameworkLeases(FRAMEWORK, self.manager_options)
        clock: Clock = self.manager_options.get("clock") or SYSTEM_CLOCK
        plain_consume = broker.consume
        client = broker.sqs.meta.client

        def consume(queue_name: str, prefetch: int = 1, timeout: int = 20000) -> WatchingConsumer:
            plain = plain_consume(queue_name, prefetch, timeout)
            return WatchingConsumer(
                plain.queue,
                prefetch,
                timeout,
                dead_letter_queue=plain.dead_letter_queue,
                visibility_timeout=plain.visibility_timeout,
                leases=leases,
                client=client,
                clock=clock,
            )

        broker.consume = consume

    def after_worker_shutdown(self, broker: Broker, worker: Worker) -> None:
        if self.leases is not None:
            self.leases.close()
