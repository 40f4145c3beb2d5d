"""``RemoteLease``: a handler's lease whose renewals happen in the renewer process.

The worker's side (``renewers.process``) keeps one per lease; ``key`` names it to
the renewer process.
"""

from __future__ import annotations

from leasekeeper.lease import Lease, WatchLease


class RemoteLease(Lease):
    """A lease whose renewals happen in the renewer process; ``key`` names it there.
    ``progress_told``: when its handler's progress was last sent there.
    ``own_until``: until when the worker may delete its message itself
    (``renewers._own``; minus infinity: never). ``dropped``: the renewer was told
    the worker deletes it. ``deleting``: the worker's own delete of it is under way."""

    __slots__ = ("deleting", "dropped", "key", "own_until", "progress_told")
    key: int
    progress_told: float
    own_until: float
    dropped: bool
    deleting: bool


class RemoteWatchLease(RemoteLease, WatchLease):
    """A watch lease (``LeaseManager.watch``) renewed in the renewer process."""

    __slots__ = ()
