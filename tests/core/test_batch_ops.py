"""complete_many / release_many: per lease what complete()/release() do, in batch calls."""

from __future__ import annotations

from typing import Any

import pytest

from leasekeeper import BackendError, LeaseError, LeaseLost, LeaseState, Outcome
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import ManualClock
from tests.helpers import ScriptedBackend


def fill(queue: MemoryQueue, backend: Any, n: int) -> list[Any]:
    for i in range(n):
        queue.send(f"job {i}")
    got: list[Any] = []
    while len(got) < n:
        got += backend.receive(max_messages=10)
    return got


def test_complete_many_deletes_in_calls_of_max_batch(clock: ManualClock, make_manager: Any) -> None:
    queue = MemoryQueue(30, clock=clock, max_batch=10)
    manager = make_manager(queue)
    leases = [manager.register(m) for m in fill(queue, queue, 25)]
    before = queue.calls["delete"]
    assert manager.complete_many(leases) == [None] * 25
    assert queue.calls["delete"] - before == 3  # 10 + 10 + 5
    assert queue.deleted_count == 25
    assert all(lease.state is LeaseState.COMPLETED for lease in leases)
    assert manager.stats().completed == 25
    assert manager.complete_many(leases) == [None] * 25  # a second time does nothing
    assert queue.calls["delete"] - before == 3


def test_one_failing_entry_fails_only_its_own_lease(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    manager = make_manager(scripted)
    a, b, c = (manager.register(m) for m in fill(scripted.inner, scripted, 3))
    taken = b.id
    scripted.inner.rotate_receipt(taken)  # someone else received b meanwhile
    results = manager.complete_many([a, b, c])
    assert results[0] is None and results[2] is None
    assert isinstance(results[1], LeaseLost)
    assert (a.state, b.state, c.state) == (
        LeaseState.COMPLETED,
        LeaseState.LOST,
        LeaseState.COMPLETED,
    )
    assert len(scripted.calls_of("delete")) == 1  # one call for all three
    assert b.lost.is_set()


def test_transient_errors_are_retried_per_lease(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    manager = make_manager(scripted)
    leases = [manager.register(m) for m in fill(scripted.inner, scripted, 3)]
    scripted.script("delete", Outcome("retry", detail="Throttled"))
    assert manager.complete_many(leases) == [None, None, None]
    deletes = scripted.calls_of("delete")
    assert len(deletes[0][1]) == 3  # the batch, answered "retry" for every entry
    assert [len(ids) for _, ids, _ in deletes[1:]] == [1, 1, 1]  # then one by one
    assert scripted.inner.deleted_count == 3


def test_errors_that_outlast_the_retries_raise_per_lease_and_keep_renewing(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    manager = make_manager(scripted)
    (lease,) = (manager.register(m) for m in fill(scripted.inner, scripted, 1))
    scripted.script("delete", *[Outcome("retry", detail="Throttled")] * 4)
    (result,) = manager.complete_many([lease])
    assert isinstance(result, BackendError)
    assert lease.state is LeaseState.ACTIVE
    clock.advance(25)
    assert lease.extensions >= 1  # still renewed, as after a failed complete()


def test_finished_and_lapsed_leases_raise_what_complete_would(
    clock: ManualClock, make_manager: Any
) -> None:
    queue = MemoryQueue(30, clock=clock)
    manager = make_manager(queue)
    done, released, lapsing = (manager.register(m) for m in fill(queue, queue, 3))
    done.complete()
    released.release()
    manager.close(release=False)  # no more renewals: lapsing will lapse
    clock.advance(31)
    results = manager.complete_many([done, released, lapsing])
    assert results[0] is None
    assert isinstance(results[1], LeaseError) and not isinstance(results[1], LeaseLost)
    assert isinstance(results[2], LeaseLost)  # rule 5: nothing sent
    assert lapsing.state is LeaseState.LOST


def test_release_many_in_batches_with_a_delay(clock: ManualClock, make_manager: Any) -> None:
    queue = MemoryQueue(30, clock=clock, max_batch=10)
    manager = make_manager(queue)
    leases = [manager.register(m) for m in fill(queue, queue, 12)]
    assert manager.release_many(leases, 5.0) == [None] * 12
    assert queue.calls["release"] == 2
    assert all(lease.state is LeaseState.RELEASED for lease in leases)
    assert not any(lease.is_lost for lease in leases)  # the caller's own release
    assert queue.visible_count() == 0
    clock.advance(5)
    assert queue.visible_count() == 12


def test_release_many_rejects_a_bad_delay_for_every_lease(
    clock: ManualClock, make_manager: Any
) -> None:
    queue = MemoryQueue(30, clock=clock)
    manager = make_manager(queue)
    leases = [manager.register(m) for m in fill(queue, queue, 2)]
    results = manager.release_many(leases, -1.0)
    assert all(isinstance(r, ValueError) for r in results)
    assert all(lease.state is LeaseState.ACTIVE for lease in leases)


def test_the_same_lease_twice_is_done_once(clock: ManualClock, make_manager: Any) -> None:
    queue = MemoryQueue(30, clock=clock)
    manager = make_manager(queue)
    (lease,) = (manager.register(m) for m in fill(queue, queue, 1))
    assert manager.complete_many([lease, lease]) == [None, None]
    assert queue.calls["delete"] == 1


@pytest.mark.parametrize("rotate", [False, True])
def test_leases_of_two_backends_go_to_their_own_backend(
    clock: ManualClock, make_manager: Any, rotate: bool
) -> None:
    one = MemoryQueue(30, clock=clock, rotate_receipts=rotate, name="one")
    two = MemoryQueue(30, clock=clock, rotate_receipts=rotate, name="two")
    manager = make_manager(None)
    leases = [manager.register(m) for m in fill(one, one, 3) + fill(two, two, 2)]
    assert manager.complete_many(leases) == [None] * 5
    assert (one.deleted_count, two.deleted_count) == (3, 2)
    assert (one.calls["delete"], two.calls["delete"]) == (1, 1)
