"""Leases from the moment of receipt (``manager.receive``, ``with held:``) and watch
leases (``manager.watch``, ``lease.forget()``), on MemoryQueue with a ManualClock."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

import leasekeeper
from leasekeeper import LeaseError, LeaseLost, LeaseState, LeaseTooShort, Outcome, WatchLease
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import ManualClock
from tests.helpers import ScriptedBackend


def test_received_messages_are_leased_at_once_so_the_waiting_ones_never_lapse(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    # The README's loop: ten messages at a 30 s timeout, each job taking 25 s. The
    # ones waiting their turn in the list are renewed from the instant they arrived.
    sent = [queue.send(f"job {n}") for n in range(10)]
    manager = make_manager(queue)
    done: list[str] = []
    for held in manager.receive(max_messages=10):
        with held:
            clock.advance(25)  # the job
            assert queue.receive(max_messages=10) == []  # a second consumer gets nothing
            done.append(str(held.message.body))
    assert done == [f"job {n}" for n in range(10)]
    assert sorted(queue.deleted_ids) == sorted(sent)
    stats = manager.stats()
    assert (stats.completed, stats.lost, stats.lapses) == (10, 0, 0)


def test_the_same_loop_with_lease_and_no_receive_loses_the_waiting_messages(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    # The control: leasing one at a time after a batch receive is what the old README
    # did; the second message has burnt its invisibility by the time its turn comes,
    # and the error says what to do instead.
    queue.send("a")
    queue.send("b")
    manager = make_manager(queue)
    first, second = queue.receive(max_messages=2)
    with manager.lease(first):
        clock.advance(29)
    with pytest.raises(LeaseTooShort, match=r"manager\.receive\(\.\.\.\)"):
        manager.register(second)


def test_with_held_releases_on_an_exception_and_raises_lease_lost_when_lost(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("fails")
    scripted.inner.send("lost")
    manager = make_manager(scripted, release_delay=5)
    fails, lost = sorted(manager.receive(max_messages=2), key=lambda h: str(h.message.body))
    with pytest.raises(RuntimeError), fails:
        raise RuntimeError("handler failed")
    assert fails.state is LeaseState.RELEASED
    scripted.script("extend", Outcome("lost", detail="ReceiptHandleError"))
    with pytest.raises(LeaseLost, match="ReceiptHandleError"), lost:
        clock.advance(25)
    assert lost.state is LeaseState.LOST
    assert scripted.inner.deleted_ids == []


def test_receive_count_comes_from_the_service(clock: ManualClock, queue: MemoryQueue) -> None:
    queue.send("again")
    manager = leasekeeper.LeaseManager(queue, clock=clock, visibility_timeout=30)
    (held,) = manager.receive()
    assert held.receive_count == 1
    held.release(0)
    (held,) = manager.receive()
    assert held.receive_count == 2
    manager.close(release=False)


def test_receive_checks_its_arguments_and_its_backend(clock: ManualClock) -> None:
    manager = leasekeeper.LeaseManager(clock=clock, visibility_timeout=30, minimal_life=2)
    with pytest.raises(leasekeeper.ConfigError, match="receive\\(\\) needs a backend"):
        manager.receive()
    queue = MemoryQueue(clock=clock)
    manager = leasekeeper.LeaseManager(queue, clock=clock, visibility_timeout=30, minimal_life=2)
    with pytest.raises(ValueError, match="wait_seconds"):
        manager.receive(wait_seconds=28)
    with pytest.raises(TypeError, match="wait_seconds"):
        manager.receive(wait_seconds="1")  # type: ignore[arg-type]
    manager.close()
    with pytest.raises(leasekeeper.ManagerClosed):
        manager.receive()


@pytest.fixture
def fresh_defaults(clock: ManualClock) -> Iterator[None]:
    leasekeeper.shutdown(release=False)
    leasekeeper.configure(visibility_timeout=30, timer_interval=1, minimal_life=2, clock=clock)
    yield
    leasekeeper.shutdown(release=False)
    leasekeeper.configure()


def test_module_level_receive_uses_the_default_manager(
    fresh_defaults: None, clock: ManualClock, queue: MemoryQueue
) -> None:
    queue.send("job")
    (held,) = leasekeeper.receive(queue, max_messages=10)
    assert leasekeeper.default_manager(queue).get(held.message) is held
    with held:
        clock.advance(60)  # renewed twice meanwhile
    assert held.state is LeaseState.COMPLETED and held.extensions >= 2
    assert queue.deleted_ids == [held.id]


# ---------------------------------------------------------------- watch leases


def test_a_watch_lease_is_renewed_but_never_ended_by_leasekeeper(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("owned elsewhere")
    manager = make_manager(queue)
    (message,) = queue.receive()
    watched = manager.watch(message)
    assert isinstance(watched, WatchLease)
    clock.advance(100)
    assert watched.extensions >= 4 and queue.receive() == []
    with pytest.raises(LeaseError, match="watch"):
        watched.complete()
    with pytest.raises(LeaseError, match="watch"):
        watched.release()
    # The owner deletes the message with its own receipt, then says so.
    queue.delete([message.handle])
    watched.forget()
    assert watched.state is LeaseState.FORGOTTEN and not watched.is_lost
    calls = queue.calls["extend"]
    clock.advance(100)
    assert queue.calls["extend"] == calls  # not renewed after forget()
    watched.forget()  # twice: nothing
    stats = manager.stats()
    assert (stats.forgotten, stats.lost, stats.completed, stats.in_flight) == (1, 0, 0, 0)


def test_close_forgets_watch_leases_and_releases_the_others(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("watched")
    queue.send("leased")
    manager = make_manager(queue)
    watched_message, leased_message = queue.receive(max_messages=2)
    watched = manager.watch(watched_message)
    leased = manager.register(leased_message)
    manager.close()
    assert watched.state is LeaseState.FORGOTTEN
    assert leased.state is LeaseState.RELEASED
    # The released one is back at once; the watched one stays with its owner.
    (back,) = queue.receive(max_messages=2)
    assert back.id == leased_message.id


def test_a_lost_watch_is_reported_like_any_lease(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    told: list[str] = []
    manager = make_manager(scripted, on_lost=lambda lease, reason: told.append(lease.id))
    (message,) = scripted.receive()
    watched = manager.watch(message)
    scripted.script("extend", Outcome("lost", detail="MessageNotExist"))
    clock.advance(25)
    assert watched.state is LeaseState.LOST and watched.is_lost
    assert told == [message.id]


def test_forget_waits_for_an_extend_in_flight() -> None:
    # Real threads and the system clock: the extend is held inside the backend while
    # forget() is called.
    rotating = MemoryQueue(visibility_timeout=4, rotate_receipts=True)
    backend = ScriptedBackend(rotating)
    rotating.send("job")
    manager = leasekeeper.LeaseManager(
        backend, visibility_timeout=4, extend_threshold=3.5, timer_interval=0.5, minimal_life=0.1
    )
    try:
        backend.hold("extend")
        (message,) = backend.receive(visibility_timeout=4)
        watched = manager.watch(message)
        assert backend.entered["extend"].wait(30), "no extend was sent"
        forgot = threading.Event()
        forgetter = threading.Thread(target=lambda: (watched.forget(), forgot.set()))
        forgetter.start()
        # forget() is blocked behind the extend that is out...
        assert not forgot.wait(0.3)
        extends = len(backend.calls_of("extend"))
        backend.let_go("extend")
        # ...and returns once it came back; nothing is extended after that.
        assert forgot.wait(30)
        forgetter.join()
        assert watched.state is LeaseState.FORGOTTEN
        assert len(backend.calls_of("extend")) == extends
    finally:
        manager.close()
