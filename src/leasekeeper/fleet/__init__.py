"""``leasekeeper.fleet``: workers in an elastic fleet - machines and tasks that come
and go under them.

- ``ScaleInProtection`` (``fleet.ecs``): an ECS task is protected from scale-in
  while its worker holds messages (``Worker(..., scale_in_protection=True)``).
- ``serve_probes`` (``fleet.probes``): Kubernetes' ``/livez`` and ``/readyz``.
- ``InterruptionWatch`` and the ``NoticeSource``s (``fleet.interruption``,
  ``fleet.notices``): a spot or preemptible machine's notice drains the worker before
  the machine goes (``Worker(..., interruption_notice="aws")``).
- ``BacklogSampler`` and ``busy_ratio`` (``fleet.autoscaling``): the signals to
  scale on, which ``leasekeeper.prometheus`` and ``leasekeeper.otel`` expose.

Each is a ``WorkerListener`` (``leasekeeper.receiving.listeners``) or reads a worker
from outside; docs/scaling.md shows them at work.
"""

from leasekeeper.fleet.autoscaling import BacklogSampler as BacklogSampler
from leasekeeper.fleet.autoscaling import busy_ratio as busy_ratio
from leasekeeper.fleet.ecs import ScaleInProtection as ScaleInProtection
from leasekeeper.fleet.interruption import InterruptionWatch as InterruptionWatch
from leasekeeper.fleet.notices import AlibabaSpotNotices as AlibabaSpotNotices
from leasekeeper.fleet.notices import AwsSpotNotices as AwsSpotNotices
from leasekeeper.fleet.notices import AzureScheduledEvents as AzureScheduledEvents
from leasekeeper.fleet.notices import Notice as Notice
from leasekeeper.fleet.notices import NoticeError as NoticeError
from leasekeeper.fleet.notices import NoticeSource as NoticeSource
from leasekeeper.fleet.probes import Health as Health
from leasekeeper.fleet.probes import ProbeServer as ProbeServer
from leasekeeper.fleet.probes import renewer_health as renewer_health
from leasekeeper.fleet.probes import serve_probes as serve_probes

__all__ = [
    "AlibabaSpotNotices",
    "AwsSpotNotices",
    "AzureScheduledEvents",
    "BacklogSampler",
    "Health",
    "InterruptionWatch",
    "Notice",
    "NoticeError",
    "NoticeSource",
    "ProbeServer",
    "ScaleInProtection",
    "busy_ratio",
    "renewer_health",
    "serve_probes",
]
