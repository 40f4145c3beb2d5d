"""The three ways to use leasekeeper: manager.lease(), lease(), and @leased."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import leasekeeper
from leasekeeper import LeaseError, LeaseLost, LeaseState, Message, Outcome, lease, leased
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import ManualClock
from tests.helpers import ScriptedBackend


@pytest.fixture(autouse=True)
def fresh_defaults(clock: ManualClock) -> Iterator[None]:
    leasekeeper.shutdown(release=False)
    leasekeeper.configure(visibility_timeout=30, timer_interval=1, minimal_life=2, clock=clock)
    yield
    leasekeeper.shutdown(release=False)
    leasekeeper.configure()


def test_with_manager_lease_completes_on_success(queue: MemoryQueue, make_manager: Any) -> None:
    queue.send("job")
    manager = make_manager(queue)
    message = queue.receive()[0]
    with manager.lease(message) as held:
        assert held.state is LeaseState.ACTIVE
    assert held.state is LeaseState.COMPLETED
    assert queue.deleted_ids == [message.id]


def test_with_manager_lease_releases_on_error_after_release_delay(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("job")
    manager = make_manager(queue, release_delay=10)
    message = queue.receive()[0]
    with pytest.raises(ZeroDivisionError), manager.lease(message) as held:
        1 / 0  # noqa: B018
    assert held.state is LeaseState.RELEASED
    assert queue.deleted_ids == []
    clock.advance(7.9)  # 10 s, jittered by up to 20 %
    assert queue.visible_count() == 0
    clock.advance(4.2)
    assert queue.visible_count() == 1


def test_with_manager_lease_raises_lease_lost_and_deletes_nothing(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    message = scripted.receive()[0]
    scripted.script("extend", Outcome("lost", detail="ReceiptHandleError"))
    with pytest.raises(LeaseLost, match="ReceiptHandleError"), manager.lease(message) as held:
        clock.advance(25)  # the job runs; meanwhile the lease is lost
        assert held.lost.is_set()
    assert scripted.calls_of("delete") == []


def test_module_lease_uses_one_default_manager_per_backend(
    clock: ManualClock, queue: MemoryQueue
) -> None:
    other = MemoryQueue(30, clock=clock)
    queue.send("a")
    other.send("b")
    with lease(queue.receive()[0]) as first:
        clock.advance(25)
        assert first.extensions == 1
    with lease(other.receive()[0]):
        pass
    assert leasekeeper.default_manager(queue) is not leasekeeper.default_manager(other)
    assert leasekeeper.default_manager(queue) is leasekeeper.default_manager(queue)
    assert queue.deleted_ids and other.deleted_ids


def test_module_lease_rejects_non_messages() -> None:
    with pytest.raises(TypeError, match="Message"):
        lease({"ReceiptHandle": "x"})  # type: ignore[arg-type]


def test_configure_applies_and_refuses_while_leases_are_held(
    clock: ManualClock, queue: MemoryQueue
) -> None:
    leasekeeper.configure(visibility_timeout=60, timer_interval=1, minimal_life=2, clock=clock)
    queue.send("job")
    message = queue.receive(visibility_timeout=60)[0]
    with lease(message):
        assert leasekeeper.default_manager(queue).config.visibility_timeout == 60
        with pytest.raises(LeaseError, match="hold leases"):
            leasekeeper.configure(visibility_timeout=10)


def test_leased_decorator_forms(clock: ManualClock, queue: MemoryQueue, make_manager: Any) -> None:
    manager = make_manager(queue, release_delay=5)
    seen: list[str] = []

    @leased
    def plain(message: Message) -> str:
        seen.append(message.id)
        return "ok"

    @leased(manager=manager, release_delay=0)
    def failing(message: Message) -> None:
        raise RuntimeError("handler bug")

    @manager.leased
    def via_manager(message: Message, extra: int) -> int:
        return extra * 2

    class Handler:
        @manager.leased(release_delay=1)
        def handle(self, message: Message) -> str:
            return message.id

    for i in range(4):
        queue.send(f"job {i}")
    m1, m2, m3, m4 = (queue.receive()[0] for _ in range(4))
    assert plain(m1) == "ok"
    with pytest.raises(RuntimeError):
        failing(m2)
    assert via_manager(m3, 21) == 42
    assert Handler().handle(m4) == m4.id
    assert queue.deleted_ids == [m1.id, m3.id, m4.id]
    assert queue.visible_count() == 1  # m2 released at once (release_delay=0)
    with pytest.raises(TypeError, match="Message"):
        plain("not a message")  # type: ignore[arg-type]
