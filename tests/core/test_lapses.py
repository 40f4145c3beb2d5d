"""One truth about a lapse (rule 5), decided when a call is sent, not by a race.

A lapse: a lease's deadline passed before a successful extend. Where receipts do
not rotate (SQS, ``MemoryQueue()``), the service answers a late extend, delete or
release with success whether or not another consumer received the message
meanwhile, so leasekeeper ends such a lease lost and sends nothing. Where they
rotate (MNS, Azure, ``MemoryQueue(rotate_receipts=True)``), the service rejects a
stale receipt itself, so the call is sent and its answer decides.

On a ManualClock these are deterministic; the real-time ones at the end hold the
GIL past the visibility timeout, as a CPU-bound handler does.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from leasekeeper import LeaseLost, LeaseManager, LeaseState, LostReason, Worker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import Faults, FaultyBackend, ManualClock
from tests.helpers import hold_the_gil

VIS = 30.0


def setup(clock: ManualClock, rotate: bool, **faults: Any) -> tuple[MemoryQueue, Any, LeaseManager]:
    queue = MemoryQueue(VIS, clock=clock, rotate_receipts=rotate, max_batch=1)
    backend = FaultyBackend(queue, seed=1, clock=clock, extend=Faults(**faults))
    reports: list[str] = []
    manager = LeaseManager(
        backend,
        clock=clock,
        visibility_timeout=VIS,
        on_lost=lambda lease, reason: reports.append(reason),
    )
    manager.reports = reports  # type: ignore[attr-defined]
    return queue, backend, manager


@pytest.mark.parametrize("rotate", [False, True])
def test_complete_after_an_unrenewed_deadline(clock: ManualClock, rotate: bool) -> None:
    queue, backend, manager = setup(clock, rotate)
    queue.send("job")
    lease = manager.register(backend.receive()[0])
    manager.close(release=False)  # nothing renews it any more
    clock.advance(VIS + 1)  # its deadline passes; nobody else received it
    if rotate:
        lease.complete()  # the queue itself vouches for the receipt: deleted
        assert lease.state is LeaseState.COMPLETED
        assert queue.deleted_ids == [lease.id]
    else:
        with pytest.raises(LeaseLost, match="lapsed"):
            lease.complete()
        assert lease.state is LeaseState.LOST
        assert queue.deleted_ids == []
        assert backend.calls["delete"] == 0  # nothing was sent
        assert lease.lost.is_set()
        assert manager.reports == [lease.lost_reason] == [LostReason.LAPSED]  # type: ignore[attr-defined]
    assert manager.stats().lapses == 1


@pytest.mark.parametrize("rotate", [False, True])
def test_complete_after_another_consumer_took_it_deletes_nothing(
    clock: ManualClock, rotate: bool
) -> None:
    queue, backend, manager = setup(clock, rotate)
    queue.send("job")
    lease = manager.register(backend.receive()[0])
    manager.close(release=False)
    clock.advance(VIS + 1)
    other = queue.receive()[0]  # another consumer has it now
    with pytest.raises(LeaseLost):
        lease.complete()
    assert lease.state is LeaseState.LOST
    assert queue.deleted_ids == []
    assert queue.delete([other.handle])[0].kind == "ok"  # the other one still can


@pytest.mark.parametrize("rotate", [False, True])
def test_release_after_an_unrenewed_deadline(clock: ManualClock, rotate: bool) -> None:
    queue, backend, manager = setup(clock, rotate)
    queue.send("job")
    lease = manager.register(backend.receive()[0])
    manager.close(release=False)
    clock.advance(VIS + 1)
    if rotate:
        lease.release(5.0)
        assert lease.state is LeaseState.RELEASED
    else:
        with pytest.raises(LeaseLost, match="lapsed"):
            lease.release(5.0)
        assert lease.state is LeaseState.LOST
        assert backend.calls["release"] == 0


@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("operation", ["complete", "release"])
def test_an_extend_failing_before_close_does_not_decide_the_handlers_call(
    clock: ManualClock, rotate: bool, operation: str
) -> None:
    # An extend fails (a transient error), close(release=False) stops renewal before
    # its retry, the deadline passes. The lease lapsed because nothing renews it any
    # more - as in the tests above - not after transient errors all the way to its
    # deadline: that is the extender's verdict on its own retries, and says nothing
    # of a delete or release never tried. Where receipts rotate, the call is sent and
    # the queue decides; where they do not, nothing is sent, and the error says why.
    queue, backend, manager = setup(clock, rotate)
    queue.send("job")
    lease = manager.register(backend.receive()[0])
    backend.script("extend", "retry")
    due = manager.next_wakeup()
    assert due is not None
    clock.advance(due - clock.now())  # the extend is sent, and fails
    assert backend.calls["extend"] == 1 and lease.state is LeaseState.ACTIVE
    manager.close(release=False)
    clock.advance(VIS)  # its deadline passes; nobody else received it
    act = lease.complete if operation == "complete" else lambda: lease.release(5.0)
    call = "delete" if operation == "complete" else "release"
    if rotate:
        act()  # the queue itself vouches for the receipt
        assert lease.state is (
            LeaseState.COMPLETED if operation == "complete" else LeaseState.RELEASED
        )
        assert backend.calls[call] == 1
        assert queue.deleted_ids == ([lease.id] if operation == "complete" else [])
    else:
        with pytest.raises(LeaseLost, match=f"ran out before the {call} was sent"):
            act()
        assert lease.state is LeaseState.LOST and backend.calls[call] == 0
        assert manager.reports == [LostReason.LAPSED]  # type: ignore[attr-defined]


@pytest.mark.parametrize("rotate", [False, True])
def test_an_extend_answered_after_the_deadline(clock: ManualClock, rotate: bool) -> None:
    # The call leaves on time (10 s before the deadline) but takes 12 s: the
    # service may have got it after the deadline, when its success proves nothing.
    queue, backend, manager = setup(clock, rotate, latency=12.0)
    queue.send("job")
    lease = manager.register(backend.receive()[0])
    clock.advance(21)
    if rotate:
        assert lease.state is LeaseState.ACTIVE  # a fresh receipt: nobody took it
        assert lease.extensions == 1
    else:
        assert lease.state is LeaseState.LOST
        assert "answered after the deadline" in (lease.reason or "")
        assert manager.reports == [lease.lost_reason] == [LostReason.LAPSED]  # type: ignore[attr-defined]


@pytest.mark.parametrize("rotate", [False, True])
def test_a_delete_answered_after_the_deadline(clock: ManualClock, rotate: bool) -> None:
    # complete() sends the delete 2 s before the deadline; it takes 5 s, so it may
    # have reached the service after the deadline, when (on SQS) its success proves
    # nothing: another consumer may hold the message and nothing was deleted.
    queue = MemoryQueue(VIS, clock=clock, rotate_receipts=rotate)
    backend = FaultyBackend(queue, seed=1, clock=clock, delete=Faults(latency=5.0))
    manager = LeaseManager(backend, clock=clock, visibility_timeout=VIS)
    queue.send("job")
    lease = manager.register(backend.receive()[0])
    manager.close(release=False)
    clock.advance(VIS - 2)
    if rotate:
        lease.complete()  # the queue vouched for the receipt when it deleted
        assert lease.state is LeaseState.COMPLETED
    else:
        with pytest.raises(LeaseLost, match="delete was answered after the deadline"):
            lease.complete()
        assert lease.state is LeaseState.LOST and lease.lost.is_set()
        assert manager.stats().lost == 1


@pytest.mark.parametrize("rotate", [False, True])
def test_an_extend_sent_after_the_deadline(clock: ManualClock, rotate: bool) -> None:
    # One dispatch at a time on a ManualClock, 12 s a call: a's extend (due at 20)
    # comes back at 32, and b's (due at 21, deadline 31) only leaves then.
    queue, backend, manager = setup(clock, rotate, latency=12.0)
    queue.send("a")
    queue.send("b")
    a = manager.register(backend.receive()[0])
    clock.advance(1)
    b = manager.register(backend.receive()[0])
    clock.advance(19.5)
    assert manager.stats().lapses == 1  # b's: its deadline passed before a send
    if rotate:
        assert (a.state, b.state) == (LeaseState.ACTIVE, LeaseState.ACTIVE)
        assert b.extensions == 1  # sent late, answered ok with a fresh receipt: ours
    else:
        assert (a.state, b.state) == (LeaseState.LOST, LeaseState.LOST)
        assert "answered after the deadline" in (a.reason or "")
        assert (b.reason or "").startswith("lapsed")
        assert backend.calls["extend"] == 1  # only a's: b's was never sent


# ---------------------------------------------------------------- real time, GIL held


@pytest.mark.realtime
@pytest.mark.parametrize("rotate", [False, True])
@pytest.mark.parametrize("taken", [False, True])
def test_a_handler_holding_the_gil_past_the_timeout(rotate: bool, taken: bool) -> None:
    """The issue's scenario: a handler holds the GIL for 3.5 s at a 2 s visibility
    timeout, so no renewal runs; then (``taken``) another consumer receives the
    messages, and the handlers complete. Decided the same way every run: where
    receipts do not rotate, every lease ends lost and nothing is deleted; where
    they rotate, the queue tells - completed if nobody took it, lost if somebody did.
    Never "completed" for a message another consumer holds."""
    queue = MemoryQueue(2.0, rotate_receipts=rotate)
    for n in range(5):
        queue.send(f"job {n}")
    manager = LeaseManager(queue, visibility_timeout=2.0, timer_interval=0.2, minimal_life=0.5)
    leases = [manager.register(m) for m in queue.receive(max_messages=5)]
    hold_the_gil(3.5)
    others = {m.id for m in queue.receive(max_messages=5)} if taken else set()
    completed, lost = set(), set()
    for lease in leases:
        try:
            lease.complete()
            completed.add(lease.id)
        except LeaseLost:
            lost.add(lease.id)
    manager.close()
    assert not completed & others, "reported completed while another consumer held it"
    assert queue.deleted_count == len(completed)
    if not rotate:
        assert (completed, len(lost)) == (set(), 5)
        assert manager.stats().lapses == 5
    elif taken:
        # A late extend may have won the race against the other consumer's receive:
        # then the message stayed ours, and it is completed, not lost.
        assert completed | lost == {lease.id for lease in leases}
        assert lost == others
    else:
        assert (len(completed), lost) == (5, set())
        assert manager.stats().lapses == 5


@pytest.mark.realtime
def test_a_worker_leases_its_whole_batch_before_a_handler_grabs_the_gil() -> None:
    # The first handler to run holds the GIL for 1.2 s at once. Registered one at a
    # time as each handler started, the rest of the batch waited behind that hold
    # and was refused as LeaseTooShort (0.3 s left of 1.5 s, under minimal_life).
    queue = MemoryQueue(1.5)
    for n in range(5):
        queue.send(f"job {n}")
    first = threading.Event()

    def handler(message: Any) -> None:
        if not first.is_set():
            first.set()
            hold_the_gil(1.2)

    worker = Worker(
        queue,
        handler,
        concurrency=5,
        batch_size=5,
        wait_seconds=0.1,
        visibility_timeout=1.5,
        timer_interval=0.2,
        minimal_life=0.5,
    )
    stats = worker.run(until_idle=1.0)
    assert stats.refused == 0
    assert stats.received >= 5
    # Whatever lapsed behind the hold came back and was done again: nothing is left.
    assert len(queue) == 0


@pytest.mark.realtime
def test_the_same_handlers_sleeping_lose_nothing() -> None:
    # The control: as long a job that lets the renewal thread run.
    queue = MemoryQueue(2.0)
    for n in range(5):
        queue.send(f"job {n}")
    worker = Worker(
        queue,
        lambda message: time.sleep(3.5),
        concurrency=5,
        batch_size=5,
        wait_seconds=0.1,
        visibility_timeout=2.0,
        timer_interval=0.2,
        minimal_life=0.5,
    )
    stats = worker.run(until_idle=0.5)
    assert (stats.completed, stats.lost, stats.refused) == (5, 0, 0)
    assert queue.deleted_count == 5
    assert worker.manager.stats().lapses == 0
