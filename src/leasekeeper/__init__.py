"""leasekeeper: keep queue messages invisible while workers process them.

A LeaseManager registers each received message and one background scheduler
renews every message whose remaining invisibility drops under a threshold, so a
queue can use a short visibility timeout (fast failover when a worker dies) and
still run long jobs (no second worker grabs a message that is being processed).
"""

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what mypy and an IDE see; at run time each name is imported on first use
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

# Where each public name lives. ``import leasekeeper`` imports none of them: the
# first use of a name imports its module (PEP 562), so a process that needs only a
# part - the renewer process, a CLI - pays only for that part.
_HOMES = {
    "Backend": "leasekeeper.backends.contract",
    "Handle": "leasekeeper.backends.contract",
    "Message": "leasekeeper.backends.contract",
    "Outcome": "leasekeeper.backends.contract",
    "MemoryQueue": "leasekeeper.backends.memory",
    "connect": "leasekeeper.backends.registry",
    "LeaseConfig": "leasekeeper.config",
    "current_lease": "leasekeeper.current",
    "configure": "leasekeeper.defaults",
    "default_manager": "leasekeeper.defaults",
    "lease": "leasekeeper.defaults",
    "leased": "leasekeeper.defaults",
    "receive": "leasekeeper.defaults",
    "shutdown": "leasekeeper.defaults",
    "BackendError": "leasekeeper.errors",
    "ConfigError": "leasekeeper.errors",
    "LeaseError": "leasekeeper.errors",
    "LeaseLost": "leasekeeper.errors",
    "LeaseTooShort": "leasekeeper.errors",
    "ManagerClosed": "leasekeeper.errors",
    "ReceiveError": "leasekeeper.errors",
    "Lease": "leasekeeper.lease",
    "LeaseScope": "leasekeeper.lease",
    "LeaseState": "leasekeeper.lease",
    "WatchLease": "leasekeeper.lease",
    "LeaseManager": "leasekeeper.manager",
    "Stats": "leasekeeper.manager",
    "LostReason": "leasekeeper.reasons",
    "ProcessRenewer": "leasekeeper.renewers.process",
    "Renewer": "leasekeeper.renewers.protocol",
    "ThreadRenewer": "leasekeeper.renewers.thread",
    "Lineage": "leasekeeper.rollover",
    "Rollover": "leasekeeper.rollover",
    "Worker": "leasekeeper.worker",
    "WorkerStats": "leasekeeper.worker",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # the next use is an ordinary attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


class _Package(types.ModuleType):
    """The package's module type: a public name that is also a submodule's
    (``lease``, the decorator; ``leasekeeper.lease``, the module) stays the public
    name when the submodule is imported, as it did when this package imported
    everything at once (the import system sets a package's attribute to each
    submodule it loads)."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _HOMES and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
