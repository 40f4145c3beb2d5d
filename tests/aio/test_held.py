"""``async with aio.lease(msg)``, ``@aio.leased`` and ``AsyncLease``, on real event loops.

Each test drives its own loop with ``asyncio.run`` (no pytest plugin). Leases run on
a ManualClock where time matters, so a loss happens exactly when the test says.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

import leasekeeper
from leasekeeper import LeaseError, LeaseLost, LeaseManager, LeaseState, Message, Outcome, aio
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import ManualClock
from tests.helpers import ScriptedBackend

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a fresh event loop (bounded, so a hang fails instead)."""
    return asyncio.run(asyncio.wait_for(coro, 60))


@pytest.fixture(autouse=True)
def fresh_defaults(clock: ManualClock) -> Iterator[None]:
    leasekeeper.shutdown(release=False)
    leasekeeper.configure(visibility_timeout=30, timer_interval=1, minimal_life=2, clock=clock)
    yield
    leasekeeper.shutdown(release=False)
    leasekeeper.configure()


# ------------------------------------------------------------------ the scope


def test_success_deletes(queue: MemoryQueue) -> None:
    queue.send("job")
    message = queue.receive()[0]

    async def main() -> aio.AsyncLease:
        async with aio.lease(message) as held:  # the default manager of its backend
            assert held.state is LeaseState.ACTIVE and not held.lost.is_set()
            assert aio.current_lease() is held
        return held

    held = run(main())
    assert held.state is LeaseState.COMPLETED
    assert queue.deleted_ids == [message.id]


def test_an_exception_releases_after_the_release_delay_and_propagates(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("job")
    manager = make_manager(queue)
    message = queue.receive()[0]

    async def main() -> None:
        async with aio.lease(message, manager=manager, release_delay=10):
            raise ValueError("bad payload")

    with pytest.raises(ValueError, match="bad payload"):
        run(main())
    assert manager.stats().released == 1 and queue.deleted_ids == []
    clock.advance(9.9)
    assert queue.visible_count() == 0
    clock.advance(0.2)
    assert queue.visible_count() == 1


def test_renewed_while_held(clock: ManualClock, queue: MemoryQueue, make_manager: Any) -> None:
    queue.send("job")
    manager = make_manager(queue)
    message = queue.receive()[0]

    async def main() -> aio.AsyncLease:
        async with aio.lease(message, manager=manager) as held:
            clock.advance(3600)  # an hour of work on a 30 s timeout
            assert queue.visible_count() == 0
        return held

    held = run(main())
    assert held.extensions >= 3600 / 20 and held.state is LeaseState.COMPLETED
    assert queue.deleted_ids == [message.id]


def test_a_lost_lease_wakes_its_waiters_and_deletes_nothing(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    message = scripted.receive()[0]

    async def main() -> None:
        async with aio.lease(message, manager=manager) as held:
            waiters = [asyncio.ensure_future(held.lost.wait()) for _ in range(2)]
            await asyncio.sleep(0)
            assert not any(w.done() for w in waiters)
            scripted.script("extend", Outcome("lost", detail="ReceiptHandleError"))
            clock.advance(25)  # the extend is refused: lost, on this thread
            assert await asyncio.gather(*waiters) == [True, True]
            assert held.lost.is_set() and held.state is LeaseState.LOST
            with pytest.raises(LeaseLost):
                held.check()

    with pytest.raises(LeaseLost, match="ReceiptHandleError"):
        run(main())
    assert scripted.inner.deleted_ids == []


def test_a_loss_told_on_another_thread_reaches_the_loop(make_manager: Any) -> None:
    # The real case: the manager's own threads end the lease while the loop waits.
    queue = MemoryQueue(30)
    queue.send("job")
    manager = LeaseManager(queue, visibility_timeout=30)
    message = queue.receive()[0]

    async def main() -> bool:
        async with aio.lease(message, manager=manager) as held:
            loop = asyncio.get_running_loop()
            loop.run_in_executor(None, manager.revoke, held.lease)  # a shutdown, elsewhere
            return await held.lost.wait()

    with pytest.raises(LeaseLost):
        run(main())
    assert queue.deleted_ids == [] and queue.visible_count() == 1
    manager.close()


def test_cancel_on_lost_cancels_the_body_and_raises_lease_lost(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    message = scripted.receive()[0]
    got_to: list[str] = []

    async def job(started: asyncio.Event) -> None:
        async with aio.lease(message, manager=manager, cancel_on_lost=True):
            started.set()
            try:
                await asyncio.Event().wait()  # a long step
            except asyncio.CancelledError:
                got_to.append("cancelled")
                raise
            got_to.append("after the step")

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.ensure_future(job(started))
        await started.wait()
        scripted.script("extend", Outcome("lost", detail="ReceiptHandleError"))
        clock.advance(25)
        with pytest.raises(LeaseLost, match="ReceiptHandleError"):
            await task
        if hasattr(task, "cancelling"):
            assert task.cancelling() == 0  # the loss's cancellation was taken back

    run(main())
    assert got_to == ["cancelled"]
    assert scripted.inner.deleted_ids == []


def test_without_cancel_on_lost_the_body_runs_on_and_decides(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    message = scripted.receive()[0]
    steps: list[str] = []

    async def main() -> None:
        async with aio.lease(message, manager=manager) as held:
            scripted.script("extend", Outcome("lost", detail="ReceiptHandleError"))
            clock.advance(25)
            await held.lost.wait()
            steps.append("saw the loss")  # not cancelled: the handler chooses where to stop

    with pytest.raises(LeaseLost):
        run(main())
    assert steps == ["saw the loss"] and scripted.inner.deleted_ids == []


def test_a_cancelled_body_releases_its_message_and_stays_cancelled(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("job")
    manager = make_manager(queue)
    message = queue.receive()[0]
    holder: list[aio.AsyncLease] = []

    async def job(started: asyncio.Event) -> None:
        async with aio.lease(message, manager=manager, cancel_on_lost=True) as held:
            holder.append(held)
            started.set()
            await asyncio.Event().wait()

    async def main() -> None:
        started = asyncio.Event()
        task = asyncio.ensure_future(job(started))
        await started.wait()
        task.cancel()  # a timeout, a TaskGroup: not a loss
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())
    assert holder[0].state is LeaseState.RELEASED and not holder[0].is_lost
    clock.advance(1.3)  # the first failure's delay: 1 s, jittered by up to 20 %
    assert queue.visible_count() == 1 and queue.deleted_ids == []


def test_explicit_complete_and_release(queue: MemoryQueue, make_manager: Any) -> None:
    queue.send_many(["a", "b"])
    manager = make_manager(queue)
    a, b = queue.receive(max_messages=2)

    async def main() -> None:
        async with aio.lease(a, manager=manager) as held:
            await held.complete()
            assert held.state is LeaseState.COMPLETED
        # As with the sync scope: leaving normally after a release cannot delete.
        with pytest.raises(LeaseError, match="released"):
            async with aio.lease(b, manager=manager) as held:
                await held.release(0)
        assert held.state is LeaseState.RELEASED

    run(main())
    assert queue.deleted_ids == [a.id] and queue.visible_count() == 1


def test_a_waiter_cancelled_mid_delete_leaves_the_deletes_going() -> None:
    # asyncio.wrap_future would cancel the coalescer's future under it; aio does not.
    queue = MemoryQueue(30)
    queue.send_many(["a", "b"])
    manager = LeaseManager(queue, visibility_timeout=30, coalesce_window=0.5)
    a, b = (manager.register(m) for m in queue.receive(max_messages=2))

    async def main() -> None:
        async def complete_a() -> None:
            async with aio.lease(a.message, manager=manager):
                pass

        task = asyncio.ensure_future(complete_a())
        await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(main())
    assert manager.complete_soon(b).result(timeout=30) is None  # the coalescer still works
    manager.flush()
    assert sorted(queue.deleted_ids) == sorted([a.id, b.id])
    manager.close()


def test_a_coroutine_that_blocks_the_loop_does_not_stop_renewals() -> None:
    queue = MemoryQueue(2.0)
    queue.send("job")
    manager = LeaseManager(
        queue, visibility_timeout=2.0, timer_interval=0.2, minimal_life=0.5, extend_threshold=1.0
    )
    message = queue.receive()[0]

    async def main() -> aio.AsyncLease:
        async with aio.lease(message, manager=manager) as held:
            time.sleep(3)  # a blocking call in a coroutine: the loop stands still
            assert queue.visible_count() == 0
        return held

    held = run(main())
    manager.close()
    assert held.state is LeaseState.COMPLETED and held.extensions >= 1
    assert manager.stats().lapses == 0 and queue.deleted_ids == [message.id]


def test_current_lease_outside_a_lease() -> None:
    async def main() -> None:
        with pytest.raises(LookupError):
            aio.current_lease()

    run(main())
    with pytest.raises(LookupError):
        aio.current_lease()


def test_lease_takes_a_message() -> None:
    with pytest.raises(TypeError, match="Message"):
        aio.lease({"body": "x"})  # type: ignore[arg-type]


# ------------------------------------------------------------------ aio.receive


def test_receive_leases_every_message_at_arrival_so_the_second_waits_renewed(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send_many(["first", "second"])
    manager = make_manager(queue)

    async def main() -> list[aio.AsyncLease]:
        held_ones = []
        for scope in await aio.receive(manager, max_messages=2):
            async with scope as held:
                held_ones.append(held)
                if held.message.body == "first":
                    clock.advance(90)  # three visibility timeouts of work on the first
        return held_ones

    first, second = run(main())
    # Leased when received: the second was renewed while the first ran, not run out.
    assert second.extensions > 0 and second.state is LeaseState.COMPLETED
    assert first.state is LeaseState.COMPLETED
    assert sorted(queue.deleted_ids) == sorted([first.id, second.id])
    assert manager.stats().lost == 0


def test_received_then_leased_in_turn_the_second_has_run_out(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    """What aio.receive is for: the same work, leased one at a time, fails."""
    queue.send_many(["first", "second"])
    manager = make_manager(queue)

    async def main() -> None:
        for message in queue.receive(max_messages=2):
            async with aio.lease(message, manager=manager):
                if message.body == "first":
                    clock.advance(90)

    with pytest.raises(leasekeeper.LeaseTooShort):
        run(main())


def test_a_receive_cancelled_while_it_runs_releases_what_it_brings(
    queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("job")
    manager = make_manager(queue)

    async def main() -> None:
        task = asyncio.ensure_future(aio.receive(manager, max_messages=1))
        await asyncio.sleep(0)  # the receive is under way on its thread
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deadline = time.monotonic() + 30
        while manager.stats().released == 0 and time.monotonic() < deadline:
            manager.flush()
            await asyncio.sleep(0.01)  # the receive's thread finishing, the release sent

    run(main())
    assert manager.stats().released == 1 and queue.visible_count() == 1
    assert manager.leases() == []


# ------------------------------------------------------------------ @leased


def test_leased_default_manager_and_bound_forms(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    manager = make_manager(queue, release_delay=0)
    queue.send_many(["one", "two", "bad"])
    one, two, bad = queue.receive(max_messages=3)

    @aio.leased
    async def plain(message: Message) -> str:
        assert aio.current_lease().message is message
        return f"did {message.body}"

    @aio.leased(manager=manager, release_delay=5)
    async def bound(message: Message, *, fail: bool = False) -> str:
        if fail:
            raise RuntimeError("failed")
        return f"did {message.body}"

    async def main() -> list[str]:
        results = [await plain(one), await bound(two)]
        with pytest.raises(RuntimeError):
            await bound(bad, fail=True)
        return results

    assert run(main()) == ["did one", "did two"]
    assert sorted(queue.deleted_ids) == sorted([one.id, two.id])
    assert manager.stats().released == 1
    clock.advance(5.1)  # bound's release_delay, not the manager's
    assert queue.visible_count() == 1


def test_leased_cancel_on_lost(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    manager = make_manager(scripted)
    scripted.inner.send("job")
    message = scripted.receive()[0]
    started = asyncio.Event()

    @aio.leased(manager=manager, cancel_on_lost=True)
    async def handle(message: Message) -> None:
        started.set()
        await asyncio.Event().wait()

    async def main() -> None:
        task = asyncio.ensure_future(handle(message))
        await started.wait()
        scripted.script("extend", Outcome("lost", detail="ReceiptHandleError"))
        clock.advance(25)
        with pytest.raises(LeaseLost):
            await task

    run(main())
    assert scripted.inner.deleted_ids == []


def test_leased_wraps_only_coroutine_functions() -> None:
    def sync_handler(message: Message) -> None: ...

    with pytest.raises(TypeError, match="async def"):
        aio.leased(sync_handler)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="async def"):
        aio.leased(release_delay=1)(sync_handler)  # type: ignore[arg-type]


def test_leased_needs_a_message_argument() -> None:
    @aio.leased
    async def handle(body: str) -> None: ...

    with pytest.raises(TypeError, match="Message"):
        run(handle("not a message"))
