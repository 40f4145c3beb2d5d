"""Tools for testing code that uses leasekeeper.

- ``ManualClock``: injectable time, so tests run hours of leases in milliseconds.
- ``leasekeeper.testing.mns_server``: a local Aliyun MNS server for the real SDK.
"""

from leasekeeper.testing.clock import ManualClock

__all__ = ["ManualClock"]
