"""leasekeeper: keep queue messages invisible while workers process them.

A LeaseManager registers each received message and one background scheduler
renews every message whose remaining invisibility drops under a threshold, so a
queue can use a short visibility timeout (fast failover when a worker dies) and
still run long jobs (no second worker grabs a message that is being processed).
"""

from leasekeeper.backends.contract import Backend, Handle, Message, Outcome

# Built in (no SDK): the in-process queue of the demo and of your own tests.
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.backends.registry import connect
from leasekeeper.config import LeaseConfig
from leasekeeper.current import current_lease
from leasekeeper.defaults import (
    configure,
    default_manager,
    lease,
    leased,
    receive,
    shutdown,
)
from leasekeeper.errors import (
    BackendError,
    ConfigError,
    LeaseError,
    LeaseLost,
    LeaseTooShort,
    ManagerClosed,
    ReceiveError,
)
from leasekeeper.lease import Lease, LeaseScope, LeaseState, WatchLease
from leasekeeper.manager import LeaseManager, Stats
from leasekeeper.reasons import LostReason
from leasekeeper.renewers.process import ProcessRenewer
from leasekeeper.renewers.protocol import Renewer
from leasekeeper.renewers.thread import ThreadRenewer
from leasekeeper.rollover import Lineage, Rollover
from leasekeeper.worker import Worker, WorkerStats

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "BackendError",
    "ConfigError",
    "Handle",
    "Lease",
    "LeaseConfig",
    "LeaseError",
    "LeaseLost",
    "LeaseManager",
    "LeaseScope",
    "LeaseState",
    "LeaseTooShort",
    "Lineage",
    "LostReason",
    "ManagerClosed",
    "MemoryQueue",
    "Message",
    "Outcome",
    "ProcessRenewer",
    "ReceiveError",
    "Renewer",
    "Rollover",
    "Stats",
    "ThreadRenewer",
    "WatchLease",
    "Worker",
    "WorkerStats",
    "__version__",
    "configure",
    "connect",
    "current_lease",
    "default_manager",
    "lease",
    "leased",
    "receive",
    "shutdown",
]
