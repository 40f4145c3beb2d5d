"""Leases held back from the schedule until their first renewal nears (what the
renewer process does with each lease: ``ThreadRenewer.hold``, ``adopt``,
``complete_held``): the same outcomes, counts and renewals as registered leases."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from leasekeeper import BackendError, LeaseError, LeaseLost, LeaseState, Outcome
from leasekeeper.backends.contract import Handle
from leasekeeper.backends.forwarding import ForwardingBackend
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.renewers.thread import ThreadRenewer
from leasekeeper.testing import ManualClock
from tests.core.test_batch_ops import fill
from tests.helpers import ScriptedBackend


def renewer_of(manager: Any) -> ThreadRenewer:
    renewer = manager.renewer
    assert isinstance(renewer, ThreadRenewer)
    return renewer


def held(renewer: ThreadRenewer, messages: list[Any]) -> list[Any]:
    leases = []
    for message in messages:
        got = renewer.hold(message)
        assert got is not None
        leases.append(got[0])
    return leases


def receive(backend: Any, queue: MemoryQueue, n: int) -> list[Any]:
    return fill(queue, backend, n)


def test_a_held_lease_completed_before_its_first_renewal_is_deleted_once_and_counted(
    clock: ManualClock, make_manager: Any
) -> None:
    queue = MemoryQueue(30, clock=clock, max_batch=10)
    manager = make_manager(queue)
    renewer = renewer_of(manager)
    leases = held(renewer, receive(queue, queue, 12))
    assert manager.stats().registered == 12
    clock.advance(5)
    before = queue.calls["delete"]
    assert renewer.complete_held(leases) == [None] * 12
    assert queue.calls["delete"] - before == 2  # 10 + 2
    assert queue.deleted_count == 12
    assert all(lease.state is LeaseState.COMPLETED for lease in leases)
    assert all(lease.extensions == 0 for lease in leases)
    stats = manager.stats()
    assert (stats.registered, stats.completed, stats.lost, stats.in_flight) == (12, 12, 0, 0)


def test_a_held_lease_waits_only_until_a_tick_before_its_first_renewal(
    clock: ManualClock, make_manager: Any
) -> None:
    queue = MemoryQueue(30, clock=clock)
    manager = make_manager(queue, extend_threshold=10.0)
    renewer = renewer_of(manager)
    (message,) = receive(queue, queue, 1)
    got = renewer.hold(message)
    assert got is not None
    lease, until = got
    assert until == message.visible_until - 10.0 - 1.0  # threshold, one timer tick
    clock.advance(until - clock.now())
    renewer.adopt(lease)  # its owner hands it over in time
    assert renewer.count() == 1
    clock.advance(1.5)  # past its first due time: renewed as if registered at receive
    assert lease.extensions == 1
    assert lease.visible_until == message.visible_until - 10.0 + 30  # sent when due
    assert lease.complete() is None
    stats = manager.stats()
    assert (stats.registered, stats.completed, stats.extended) == (1, 1, 1)


def test_what_cannot_wait_is_not_held(clock: ManualClock, make_manager: Any) -> None:
    queue = MemoryQueue(30, clock=clock)
    renewer = renewer_of(make_manager(queue, extend_threshold=10.0))
    first, short = receive(queue, queue, 2)
    renewer.register(first)
    assert renewer.hold(first) is None  # a lease on it is registered: register decides
    clock.advance(19)
    assert renewer.hold(short) is None  # its first renewal is due within a tick
    capped = renewer_of(make_manager(queue, max_lease_duration=60.0))
    (other,) = receive(queue, queue, 1)
    assert capped.hold(other) is None  # its first due time depends on when it is scheduled


def test_a_held_lease_whose_delete_is_rejected_is_lost(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    manager = make_manager(scripted)
    renewer = renewer_of(manager)
    a, b = held(renewer, receive(scripted, scripted.inner, 2))
    scripted.inner.rotate_receipt(b.id)  # someone else received b meanwhile
    results = renewer.complete_held([a, b])
    assert results[0] is None
    assert isinstance(results[1], LeaseLost)
    assert (a.state, b.state) == (LeaseState.COMPLETED, LeaseState.LOST)
    assert b.lost.is_set()
    stats = manager.stats()
    assert (stats.registered, stats.completed, stats.lost, stats.in_flight) == (2, 1, 1, 0)


def test_a_held_lease_whose_delete_keeps_failing_is_renewed_from_then_on(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    manager = make_manager(scripted)
    renewer = renewer_of(manager)
    (lease,) = held(renewer, receive(scripted, scripted.inner, 1))
    scripted.script("delete", *[Outcome("retry", detail="Throttled")] * 4)
    (result,) = renewer.complete_held([lease])
    assert isinstance(result, BackendError)
    assert lease.state is LeaseState.ACTIVE
    clock.advance(25)
    assert lease.extensions >= 1  # adopted: still renewed, as after a failed complete()
    assert lease.complete() is None
    stats = manager.stats()
    assert (stats.registered, stats.completed, stats.in_flight) == (1, 1, 0)


def test_a_held_lease_completed_after_its_deadline_goes_by_rule_5(
    clock: ManualClock, make_manager: Any
) -> None:
    queue = MemoryQueue(30, clock=clock)  # receipts do not rotate: a late delete proves nothing
    manager = make_manager(queue)
    renewer = renewer_of(manager)
    (lease,) = held(renewer, receive(queue, queue, 1))
    clock.advance(31)  # nobody adopted it in time
    (result,) = renewer.complete_held([lease])
    assert isinstance(result, LeaseLost)
    assert lease.state is LeaseState.LOST
    stats = manager.stats()
    assert (stats.registered, stats.completed, stats.lost) == (1, 0, 1)


def test_close_releases_adopted_held_leases(clock: ManualClock, make_manager: Any) -> None:
    queue = MemoryQueue(30, clock=clock)
    manager = make_manager(queue)
    renewer = renewer_of(manager)
    leases = held(renewer, receive(queue, queue, 3))
    for lease in leases:
        renewer.adopt(lease)
    manager.close()
    assert all(lease.state is LeaseState.RELEASED for lease in leases)
    assert queue.visible_count() == 3


class SlowDeletes(ForwardingBackend):
    """Deletes that wait until the test lets them through."""

    def __init__(self, inner: MemoryQueue) -> None:
        super().__init__(inner)
        self.entered = threading.Event()
        self.go_on = threading.Event()

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        self.entered.set()
        self.go_on.wait(10)
        return super().delete(handles)


def test_a_release_during_a_held_lease_s_delete_waits_for_it_rule_4(
    clock: ManualClock, make_manager: Any
) -> None:
    queue = MemoryQueue(30, clock=clock)
    slow = SlowDeletes(queue)
    manager = make_manager(slow)
    renewer = renewer_of(manager)
    (lease,) = held(renewer, receive(slow, queue, 1))
    completing = threading.Thread(target=renewer.complete_held, args=([lease],))
    completing.start()
    assert slow.entered.wait(10)
    refused: list[Exception] = []

    def release() -> None:  # the worker's shutdown, say
        try:
            lease.release()
        except LeaseError as exc:
            refused.append(exc)

    releasing = threading.Thread(target=release)
    releasing.start()
    releasing.join(0.2)
    assert releasing.is_alive()  # it waits for the delete's answer
    slow.go_on.set()
    completing.join(10)
    releasing.join(10)
    assert lease.state is LeaseState.COMPLETED
    assert [str(exc) for exc in refused] == [
        f"lease on message {lease.id!r} was completed; cannot release"  # as any lease's
    ]
    assert queue.calls["release"] == 0
    stats = manager.stats()
    assert (stats.completed, stats.released) == (1, 0)


def test_a_lease_the_worker_drops_before_its_adoption_is_never_adopted(
    clock: ManualClock, make_manager: Any
) -> None:
    """The renewer process's promoter reads what the worker wrote (``sync``) after a
    held lease's time to be adopted came and before it adopts: a lease the worker
    said it deletes itself (``drop``) is never renewed; the others are adopted."""
    from leasekeeper.renewers._held import HeldLeases

    queue = MemoryQueue(30, clock=clock)
    manager = make_manager(queue, extend_threshold=10.0)
    renewer = renewer_of(manager)
    mine, other = receive(queue, queue, 2)
    synced = threading.Event()
    holder: list[HeldLeases] = []
    dropped: list[Any] = []

    def sync() -> Any:  # the worker's Drop of key 1, read before adopting
        dropped.append(holder[0].drop([1]))
        synced.set()
        return lambda: None

    held_leases = HeldLeases(renewer, lambda key, lease, error: None, sync)
    holder.append(held_leases)
    clock.advance(25)  # both past their time to be held (30 - 10 - 1)
    first = held_leases.hold(1, 0, mine, own=True)  # held all the same: the worker may drop it
    second = held_leases.hold(2, 0, other, own=True)
    assert first is not None and second is not None
    assert synced.wait(10)
    for _ in range(1000):  # the promoter adopts the other right after
        if renewer.count() == 1:
            break
        threading.Event().wait(0.01)
    assert renewer.get(other) is second and renewer.get(mine) is None
    clock.advance(1)  # both were due to be renewed: only the adopted one is
    assert second.extensions == 1 and first.extensions == 0
    assert held_leases.take([1]) == {}  # let go of: the worker deletes it
    # (once a round: a second one, for the lease held after the first round, finds
    # nothing more to drop)
    assert dropped[0] == [(1, first)] and all(more == [] for more in dropped[1:])
    held_leases.adopt_all()


def test_without_the_worker_s_leave_a_late_lease_is_not_held(
    clock: ManualClock, make_manager: Any
) -> None:
    from leasekeeper.renewers._held import HeldLeases

    queue = MemoryQueue(30, clock=clock)
    manager = make_manager(queue, extend_threshold=10.0)
    renewer = renewer_of(manager)
    (message,) = receive(queue, queue, 1)
    held_leases = HeldLeases(renewer, lambda key, lease, error: None)
    clock.advance(25)
    assert held_leases.hold(1, 0, message) is None  # registered at once instead
    assert held_leases.drop([1]) == []
