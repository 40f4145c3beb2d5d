"""One interface over the four designs, so every measure treats them alike.

``prepare(message)`` turns a received Message into what the design's handler
holds (the identity, except for AutoLockRenewer, which renews SDK message
objects); ``track`` starts keeping it invisible, ``untrack`` stops that and
deletes the message (the same operation in every design: for leasekeeper
``register`` + ``Lease.complete``); ``close`` stops the design without deleting.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.baselines.heartbeat import HeartbeatTracker
from benchmarks.baselines.scan import ScanManager
from leasekeeper import Lease, LeaseManager
from leasekeeper.backends.base import Backend, Message
from leasekeeper.clock import Clock

LEASEKEEPER = "leasekeeper"
HEARTBEAT = "heartbeat"
SCAN = "scan"
AUTOLOCK = "autolock"
DESIGNS = (LEASEKEEPER, HEARTBEAT, SCAN, AUTOLOCK)
BASELINES = (HEARTBEAT, SCAN, AUTOLOCK)
LABELS = {
    LEASEKEEPER: "leasekeeper",
    HEARTBEAT: "thread-per-message",
    SCAN: "scan-every-tick",
    AUTOLOCK: "AutoLockRenewer",
}


class Design:
    """A design under test, with the handler-side operations bound for speed."""

    name: str
    prepare: Callable[[Message], Any]
    track: Callable[[Any], Any]
    untrack: Callable[[Any], None]
    close: Callable[[], None]
    manager: Any

    def __init__(self, name: str) -> None:
        self.name = name


def _identity(message: Message) -> Message:
    return message


def build(
    name: str,
    backend: Backend,
    *,
    visibility: float,
    threshold: float,
    timer_interval: float,
    max_concurrency: int = 32,
    clock: Clock | None = None,
    minimal_life: float | None = None,
    lag_samples: list[float] | None = None,
    executor: Any = None,
) -> Design:
    """Build design ``name``. ``executor``: a simulated pool (``benchmarks.simpool``)
    to run its extend calls on a driven clock, where the design supports one."""
    design = Design(name)
    design.prepare = _identity
    if name == LEASEKEEPER:
        life = minimal_life if minimal_life is not None else min(2.0, visibility / 4)
        manager = LeaseManager(
            backend,
            clock=clock,
            visibility_timeout=visibility,
            extend_threshold=threshold,
            timer_interval=timer_interval,
            minimal_life=life,
            max_concurrency=max_concurrency,
            executor=executor,
        )
        design.manager = manager
        design.track = manager.register
        design.untrack = Lease.complete
        design.close = lambda: manager.close(release=False)
    elif name == HEARTBEAT:
        hb = HeartbeatTracker(
            backend,
            interval=visibility - threshold,
            timeout=visibility,
            lag_samples=lag_samples,
        )
        design.manager = hb
        design.track = hb.track
        design.untrack = hb.untrack
        design.close = hb.close
    elif name == SCAN:
        scan = ScanManager(
            backend,
            visibility_timeout=visibility,
            timer_interval=timer_interval,
            threshold=threshold,
            max_concurrency=max_concurrency,
            clock=clock,
            executor=executor,
        )
        design.manager = scan
        design.track = scan.register

        def untrack(entry: Any, _scan: ScanManager = scan) -> None:
            _scan.delete(entry.handle.message_id)

        design.untrack = untrack
        design.close = scan.close
    elif name == AUTOLOCK:
        from benchmarks.baselines.servicebus import AutoLockTracker

        renewer = AutoLockTracker(backend, lock_duration=visibility, max_workers=max_concurrency)
        design.manager = renewer
        design.prepare = renewer.prepare
        design.track = renewer.track
        design.untrack = renewer.untrack
        design.close = renewer.close
    else:
        raise ValueError(f"unknown design {name!r}")
    return design
