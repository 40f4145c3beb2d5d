"""Celery on SQS: long tasks run once, a dead worker's tasks come back within the
queue's timeout.

Two lines in the module that makes the Celery app::

    from leasekeeper.celery import keep_leases
    keep_leases(app)

Every task message the worker's consumer receives from an ``sqs://`` broker is then
watched (``LeaseManager.watch``) from the moment kombu hands it over (prefetched ones
included) and renewed while it waits and while its task runs, to the timeout SQS
really applies to its queue; the lease is forgotten right before kombu acks,
rejects or requeues the message. Task code does not change. The renewals run in the
consumer process (the prefork pool's parent), on a thread of their own: a child
process stuck in C or holding its GIL cannot stop them. See docs/celery.md.

``LeaseKeeping`` is the consumer bootstep that does it, for apps that configure
their steps themselves (``app.steps["consumer"].add(LeaseKeeping)``;
``LeaseKeeping.with_options(...)`` for a step with options).
"""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from celery import Celery, bootsteps

from leasekeeper.errors import ConfigError
from leasekeeper.integrations.frameworks import FrameworkLeases, check_manager_options
from leasekeeper.integrations.kombu_sqs import ChannelWatch

__all__ = ["LeaseKeeping", "keep_leases"]

log = logging.getLogger("leasekeeper.celery")


class LeaseKeeping(bootsteps.StartStopStep):  # type: ignore[misc]
    """The consumer bootstep: watch leases on the task channel's messages.

    It starts after the consumer's broker connection (``Connection``) and installs
    its hooks on the task channel before the event loop delivers anything; the
    managers are made in the consumer process, at each queue's first message, after
    the pool forked. A reconnect hooks the new channel (the old one's messages were
    forgotten when kombu restored them); the consumer's shutdown, after the pool
    finished its tasks and before the connection closes, closes the managers.
    """

    requires = ("celery.worker.consumer.connection:Connection",)
    #: LeaseManager/LeaseConfig keywords (``with_options`` makes a step with them).
    manager_options: ClassVar[dict[str, Any]] = {}

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.leases: FrameworkLeases | None = None

    @classmethod
    def with_options(cls, **manager_options: Any) -> type[LeaseKeeping]:
        """A LeaseKeeping step whose managers take ``manager_options``."""
        check_manager_options(manager_options, "leasekeeper.celery")
        if "renewer" in manager_options:
            raise ConfigError(
                "leasekeeper.celery renews in the consumer process, which runs no task "
                "code under the prefork pool: renewer= does not apply"
            )
        return type(cls.__name__, (cls,), {"manager_options": dict(manager_options)})

    def start(self, parent: Any) -> None:
        connection = parent.connection
        driver = getattr(connection.transport, "driver_type", "")
        if driver != "sqs":
            if driver == "azurestoragequeues":
                log.warning(
                    "leasekeeper: kombu's Azure Storage Queues transport deletes each "
                    "message as it receives it, so there is no lease to keep"
                )
            else:
                log.warning("leasekeeper: the broker is %s, not SQS: no leases are kept", driver)
            return
        if self.leases is None:
            self.leases = FrameworkLeases("leasekeeper.celery", self.manager_options)
        ChannelWatch(connection.default_channel, self.leases)

    def shutdown(self, parent: Any) -> None:
        if self.leases is not None:
            self.leases.close()


def keep_leases(app: Celery, **manager_options: Any) -> type[LeaseKeeping]:
    """Make ``app``'s workers keep their SQS task messages invisible while they wait
    and run (see the module docstring). ``manager_options`` are LeaseManager and
    LeaseConfig keywords (``on_lost``, ``timer_interval``, ``minimal_life``,
    ``extend_threshold``, ``max_lease_duration``, ``visibility_timeout``...); the
    defaults work down to a 3-second queue timeout. Returns the step it added."""
    step = LeaseKeeping.with_options(**manager_options)
    app.steps["consumer"].add(step)
    return step
