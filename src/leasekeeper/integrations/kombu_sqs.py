"""Watch leases on the messages a kombu SQS channel delivers (what leasekeeper.celery
installs on a Celery worker's task channel).

kombu's SQS transport receives asynchronously and hands each message to the consumer
through the channel's QoS (``qos.append``): that is where a watch starts. Its own
visibility changes go through three channel methods, and the lease is forgotten
right *before* each, never after (``QoS.ack`` runs after the delete: a renewal in
between would hit a deleted receipt and report a false loss):

- ``basic_ack``: DeleteMessage (the task succeeded, or failed under
  ``task_acks_on_failure_or_timeout``);
- ``basic_reject``: without requeue, DeleteMessage (unless a redrive policy or a
  backoff policy wants it back); with requeue, ``_restore`` below;
- ``_restore``: ChangeMessageVisibility to kombu's ``wait_time_seconds`` (a requeue,
  ``task_reject_on_worker_lost``, and every unacked message when the channel closes).

The hooks are the channel instance's own attributes, wrapping the bound methods:
nothing is patched on kombu's classes, and a channel not watched is untouched.

Renewals go through the boto3 client kombu itself uses for the queue, asked of the
channel at each call (``KombuQueueBackend``): where kombu renews credentials (an STS
role on predefined queues) the renewals use the new ones; its region, endpoint and
``client-config`` apply as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from leasekeeper.backends.contract import Handle, Outcome
from leasekeeper.backends.forwarding import ForwardingBackend
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.integrations.frameworks import FrameworkLeases, QueueSetup

__all__ = ["ChannelWatch", "KombuQueueBackend", "queue_setup"]

log = logging.getLogger("leasekeeper.celery")


class KombuQueueBackend(ForwardingBackend):
    """An ``SQSBackend`` on one queue through kombu's own client for it.

    ``channel.sqs(queue=name)`` is asked at every call (kombu caches the client, so
    it is a dict lookup): when kombu replaced its client (new STS credentials), a new
    SQSBackend is made on the new one. A channel that closed meanwhile answers with
    its last client. ``channel`` may be re-pointed at the channel of a new connection.
    """

    def __init__(self, channel: Any, queue_name: str | None, queue_url: str) -> None:
        self.channel = channel
        self.queue_name = queue_name
        self.queue_url = queue_url
        self._client = channel.sqs(queue=queue_name)
        super().__init__(SQSBackend(self._client, queue_url))

    def current(self) -> SQSBackend:
        """The SQSBackend on the client kombu uses now."""
        inner = self.inner
        try:
            client = self.channel.sqs(queue=self.queue_name)
        except Exception:  # a closed channel has no transport options left
            client = self._client
        if client is not self._client:
            self._client = client
            inner = self.inner = SQSBackend(client, self.queue_url)
        assert isinstance(inner, SQSBackend)
        return inner

    def queue_visibility_timeout(self) -> float:
        """The queue's VisibilityTimeout attribute (GetQueueAttributes, once)."""
        return self.current().queue_visibility_timeout()

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        return self.current().extend(handles, timeout)

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        return self.current().delete(handles)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        return self.current().release(handles, delay)

    def __repr__(self) -> str:
        return f"KombuQueueBackend(queue_url={self.queue_url!r})"


def queue_setup(channel: Any, queue_name: str | None, queue_url: str) -> QueueSetup:
    """A queue's backend and the timeout SQS applies to its messages, read at its
    first message: kombu sends no VisibilityTimeout on receive and uses Celery's
    ``visibility_timeout`` only when it creates a queue, so on a predefined or
    existing queue the queue's own attribute rules. Says in one INFO line which
    timeout is used, and WARNs when Celery's differs."""
    backend = KombuQueueBackend(channel, queue_name, queue_url)
    applied = backend.queue_visibility_timeout()
    configured = float(channel.visibility_timeout)
    explicit = "visibility_timeout" in (channel.transport_options or {})
    log.info(
        "leasekeeper: renewing the messages of queue %s; SQS hides them for %gs at "
        "receipt (the queue's VisibilityTimeout)",
        queue_name or queue_url,
        applied,
    )
    if configured != applied:
        log.warning(
            "leasekeeper: Celery's visibility_timeout (%gs%s) is not what SQS applies "
            "to queue %s: kombu sets it only when it creates a queue, and this one's "
            "VisibilityTimeout is %gs, which leasekeeper renews",
            configured,
            "" if explicit else ", kombu's default",
            queue_name or queue_url,
            applied,
        )
    return QueueSetup(backend, applied)


class ChannelWatch:
    """Watch leases on the task messages ``channel`` (a kombu SQS channel) delivers,
    kept in ``leases``. ``ChannelWatch(channel, leases)`` installs the hooks."""

    def __init__(self, channel: Any, leases: FrameworkLeases) -> None:
        self.channel = channel
        self.leases = leases
        qos = channel.qos
        self._append = qos.append
        self._basic_ack = channel.basic_ack
        self._basic_reject = channel.basic_reject
        self._restore = channel._restore
        qos.append = self.append
        channel.basic_ack = self.basic_ack
        channel.basic_reject = self.basic_reject
        channel._restore = self.restore

    def append(self, message: Any, delivery_tag: Any) -> Any:
        """kombu hands a message over to the consumer: watch it from now on."""
        try:
            self.watch(message)
        except Exception:  # never stand between kombu and its consumer
            log.exception("leasekeeper: could not watch a delivered message")
        return self._append(message, delivery_tag)

    def watch(self, message: Any) -> None:
        info = message.delivery_info or {}
        raw = info.get("sqs_message")
        url = info.get("sqs_queue")
        if raw is None or not url:
            return  # not an SQS delivery of this channel (or already restored)
        channel = self.channel
        # The client kombu's basic_ack uses for this message's queue.
        routing_key = info.get("routing_key")
        name = channel.canonical_queue_name(routing_key) if routing_key else None
        queue = self.leases.queue(url, lambda: queue_setup(channel, name, url))
        if queue is None:
            return
        backend = queue.backend
        if isinstance(backend, KombuQueueBackend) and backend.channel is not channel:
            backend.channel = channel  # the consumer reconnected: a new channel
        self.leases.watch(queue, raw)

    def basic_ack(self, delivery_tag: Any, multiple: bool = False) -> Any:
        self.leases.forget(delivery_tag)
        return self._basic_ack(delivery_tag, multiple=multiple)

    def basic_reject(self, delivery_tag: Any, requeue: bool = False) -> Any:
        self.leases.forget(delivery_tag)
        return self._basic_reject(delivery_tag, requeue=requeue)

    def restore(self, message: Any, *args: Any, **kwargs: Any) -> Any:
        self.leases.forget(message.delivery_tag)
        return self._restore(message, *args, **kwargs)
