"""Tools for testing code that uses leasekeeper.

- ``ManualClock``: injectable time, so tests run hours of leases in milliseconds.
- ``FaultyBackend`` and ``Faults`` (``leasekeeper.testing.faults``): wrap a backend
  and inject transient errors, throttling, lost and stale receipts, fatal answers,
  exceptions, hangs, latency and malformed answers, deterministically with a seed.
- ``leasekeeper.testing.mns_server``: a local Aliyun MNS server for the real SDK.
"""

from leasekeeper.testing.clock import ManualClock
from leasekeeper.testing.faults import FaultEvent, Faults, FaultyBackend, InjectedError

__all__ = ["FaultEvent", "Faults", "FaultyBackend", "InjectedError", "ManualClock"]
