"""LeaseManager on a ManualClock: hours of lease time in milliseconds."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from leasekeeper import (
    BackendError,
    ConfigError,
    Lease,
    LeaseError,
    LeaseLost,
    LeaseManager,
    LeaseState,
    LeaseTooShort,
    LostReason,
    ManagerClosed,
    Outcome,
)
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import ManualClock
from tests.helpers import ScriptedBackend


def receive_all(backend: Any, n: int) -> list[Any]:
    got: list[Any] = []
    while len(got) < n:
        batch = backend.receive(max_messages=min(10, n - len(got)))
        assert batch, f"queue ran dry after {len(got)} of {n}"
        got.extend(batch)
    return got


# ---------------------------------------------------------------- renewal


def test_leased_message_stays_invisible_for_hours_and_is_extended_on_schedule(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("long job")
    manager = make_manager(queue)
    lease = manager.register(queue.receive()[0])

    for _ in range(5 * 60):  # five hours, checked every minute
        clock.advance(60)
        assert queue.visible_count() == 0, "a leased message became visible"
        assert lease.state is LeaseState.ACTIVE

    # 30 s visibility renewed at 10 s left: one extension every 20 s.
    assert lease.extensions == 5 * 3600 // 20
    assert 10 <= lease.visible_for() <= 30
    lease.complete()
    assert queue.deleted_ids == [lease.id]
    assert manager.stats().completed == 1


def test_unleased_message_does_reappear(clock: ManualClock, queue: MemoryQueue) -> None:
    # The control for the test above: without a lease the message comes back.
    queue.send("job")
    queue.receive()
    clock.advance(29.9)
    assert queue.visible_count() == 0
    clock.advance(0.2)
    assert queue.visible_count() == 1


def test_scheduler_extends_in_deadline_order(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    ids = [scripted.inner.send(f"job {i}") for i in range(3)]
    scripted.inner.max_batch = scripted.max_batch = 1
    manager = make_manager(scripted, max_concurrency=1)
    messages = []
    for _ in range(3):  # received 3 s apart, so due 3 s apart
        messages.append(scripted.receive()[0])
        clock.advance(3)
    for message in reversed(messages):  # registered in the opposite order
        manager.register(message)
    clock.advance(30)
    order = [c[1][0] for c in scripted.calls_of("extend")]
    assert order[:3] == ids


def test_batching_fills_batches_without_cutting_long_term_renewals(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    # Extending early to fill a batch must not multiply the calls per lease-hour.
    for i in range(10):
        queue.send(f"job {i}")
    manager = make_manager(queue)
    for message in receive_all(queue, 10):
        manager.register(message)
    clock.advance(3600)
    assert queue.calls["extend"] == 3600 // 20  # one batch per 20 s renewal period


# ---------------------------------------------------------------- failures


def test_transient_errors_are_retried_and_the_lease_survives(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    lease = manager.register(scripted.receive()[0])
    scripted.script("extend", Outcome("retry", detail="Throttled"), RuntimeError("boom"))
    clock.advance(60)
    assert lease.state is LeaseState.ACTIVE
    stats = manager.stats()
    assert stats.retries == 2
    assert stats.extend_errors == 2
    assert lease.extensions >= 2
    assert scripted.inner.visible_count() == 0


def test_retries_until_the_deadline_then_lost(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    reports: list[tuple[str, str]] = []
    scripted.inner.send("job")
    manager = make_manager(
        scripted, on_lost=lambda lease, reason: reports.append((lease.id, reason))
    )
    message = scripted.receive()[0]
    lease = manager.register(message)
    scripted.script("extend", *[Outcome("retry", detail="ServiceUnavailable")] * 1000)
    clock.advance(29.0)
    assert lease.state is LeaseState.ACTIVE  # still trying, time left
    clock.advance(1.5)
    assert lease.state is LeaseState.LOST
    assert lease.lost.is_set()
    assert "ServiceUnavailable" in (lease.reason or "")
    assert reports == [(message.id, LostReason.LAPSED)] and lease.lost_reason is LostReason.LAPSED
    attempts = len(scripted.calls_of("extend"))
    assert 5 <= attempts <= 40, attempts  # backoff, not a hot loop
    with pytest.raises(LeaseLost):
        lease.check()


def test_lost_outcome_is_reported_once_and_nothing_is_deleted(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    reports: list[str] = []
    scripted.inner.send("job")
    manager = make_manager(scripted, on_lost=lambda lease, reason: reports.append(reason))
    lease = manager.register(scripted.receive()[0])
    scripted.script("extend", Outcome("lost", detail="ReceiptHandleError"))
    clock.advance(21)
    assert lease.state is LeaseState.LOST
    assert reports == [LostReason.REJECTED] == ["rejected"]
    assert "ReceiptHandleError" in (lease.reason or "")
    assert lease.lost.is_set()
    with pytest.raises(LeaseLost):
        lease.complete()
    assert scripted.inner.deleted_ids == []
    stats = manager.stats()
    assert (stats.lost, stats.in_flight) == (1, 0)
    clock.advance(600)
    assert len(scripted.calls_of("extend")) == 1, "a lost lease must not be extended again"


def test_fatal_outcome_ends_the_lease(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    lease = manager.register(scripted.receive()[0])
    scripted.script("extend", Outcome("fatal", detail="QueueNotExist"))
    clock.advance(21)
    assert lease.state is LeaseState.LOST
    assert lease.reason == "fatal: QueueNotExist"


def test_capped_lease_is_abandoned_and_reported(clock: ManualClock, make_manager: Any) -> None:
    # A service limit on total invisibility (SQS: 12 h after the receive).
    queue = MemoryQueue(30, clock=clock, visibility_cap=100.0)
    queue.send("job")
    reasons: list[str] = []
    manager = make_manager(queue, on_lost=lambda lease, reason: reasons.append(reason))
    lease = manager.register(queue.receive()[0])
    clock.advance(95)
    assert lease.state is LeaseState.ABANDONED
    assert reasons and reasons[0].startswith("capped")
    assert manager.stats().capped == 1
    assert queue.visible_count() == 0  # not released: it runs out at the cap
    clock.advance(6)
    assert queue.visible_count() == 1


def test_capped_outcome_from_the_service(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    lease = manager.register(scripted.receive()[0])
    scripted.script("extend", Outcome("capped", detail="beyond the limit"))
    clock.advance(21)
    assert lease.state is LeaseState.ABANDONED
    assert lease.reason == "capped: beyond the limit"


def test_max_lease_duration_abandons_on_time(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("stuck job")
    manager = make_manager(queue, max_lease_duration=300)
    lease = manager.register(queue.receive()[0])
    clock.advance(299)
    assert lease.state is LeaseState.ACTIVE
    clock.advance(1)
    assert lease.state is LeaseState.ABANDONED
    assert "max_lease_duration" in (lease.reason or "")
    assert lease.lost.is_set()
    assert queue.visible_count() == 0  # left to time out, not released
    clock.advance(30)
    assert queue.visible_count() == 1
    assert manager.stats().abandoned == 1


def test_abandoned_lease_can_still_complete_while_invisible(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("slow job")
    manager = make_manager(queue, max_lease_duration=100)
    lease = manager.register(queue.receive()[0])
    clock.advance(100)
    assert lease.state is LeaseState.ABANDONED
    lease.complete()  # still invisible: the delete is safe and saves a redo
    assert lease.state is LeaseState.COMPLETED
    assert queue.deleted_ids == [lease.id]


def test_malformed_backend_answer_is_treated_as_transient(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    lease = manager.register(scripted.receive()[0])
    scripted.script("extend", "malformed")
    clock.advance(25)
    assert lease.state is LeaseState.ACTIVE
    assert manager.stats().retries == 1


def test_on_lost_callback_that_raises_does_not_stop_the_scheduler(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    def explode(lease: Any, reason: str) -> None:
        raise ValueError("callback bug")

    for i in range(2):
        scripted.inner.send(f"job {i}")
    manager = make_manager(scripted, on_lost=explode)
    first, second = (manager.register(m) for m in receive_all(scripted, 2))
    scripted.script("extend", Outcome("lost", detail="gone"))
    clock.advance(21)
    assert first.state is LeaseState.LOST and second.state is LeaseState.LOST
    assert manager.stats().callback_errors == 2
    scripted.inner.send("job 3")
    third = manager.register(scripted.receive()[0])
    clock.advance(100)
    assert third.state is LeaseState.ACTIVE and third.extensions >= 4


# ---------------------------------------------------------------- handler operations


def test_complete_waits_for_an_inflight_extend_and_uses_its_receipt(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    """The rotation race: a delete arriving mid-extend must use the new receipt."""
    scripted.inner.send("job")
    manager = make_manager(scripted)
    message = scripted.receive()[0]
    lease = manager.register(message)
    scripted.hold("extend")
    ticker = threading.Thread(target=clock.advance, args=(21,))
    ticker.start()
    assert scripted.entered["extend"].wait(5)
    errors: list[BaseException] = []

    def complete() -> None:
        try:
            lease.complete()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    completer = threading.Thread(target=complete)
    completer.start()
    completer.join(0.3)
    assert completer.is_alive(), "complete() did not wait for the in-flight extend"
    assert scripted.calls_of("delete") == []
    scripted.let_go("extend")
    ticker.join(5)
    completer.join(5)
    assert errors == []
    assert lease.state is LeaseState.COMPLETED
    assert scripted.inner.deleted_ids == [message.id]
    assert lease.extensions == 1


def test_nothing_touches_a_lease_after_complete(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    lease = manager.register(scripted.receive()[0])
    lease.complete()
    clock.advance(3600)
    assert scripted.calls_of("extend") == []
    lease.complete()  # a second complete is a no-op
    assert len(scripted.calls_of("delete")) == 1


def test_delete_after_the_message_was_taken_is_lost_not_success(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted, max_concurrency=1)
    lease = manager.register(scripted.receive()[0])
    scripted.script("delete", Outcome("lost", detail="MessageNotExist"))
    with pytest.raises(LeaseLost):
        lease.complete()
    assert lease.state is LeaseState.LOST
    assert manager.stats().lost == 1


def test_complete_retries_transient_errors_then_raises_and_keeps_renewing(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    lease = manager.register(scripted.receive()[0])
    scripted.script("delete", *[Outcome("retry", detail="InternalError")] * 4)
    with pytest.raises(BackendError) as raised:
        lease.complete()
    assert raised.value.kind == "retry"
    assert lease.state is LeaseState.ACTIVE
    clock.advance(60)
    assert lease.extensions >= 2, "a lease whose delete failed must still be renewed"
    lease.complete()
    assert lease.state is LeaseState.COMPLETED


def test_complete_after_transient_error_succeeds_within_retries(
    scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    lease = manager.register(scripted.receive()[0])
    scripted.script("delete", Outcome("retry"), ConnectionError("reset"))
    lease.complete()
    assert lease.state is LeaseState.COMPLETED
    assert len(scripted.calls_of("delete")) == 3


def test_release_makes_the_message_visible_after_the_delay(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("job")
    manager = make_manager(queue)
    lease = manager.register(queue.receive()[0])
    lease.release(delay=5)
    assert lease.state is LeaseState.RELEASED
    assert not lease.lost.is_set()  # the handler released it itself
    clock.advance(4.9)
    assert queue.visible_count() == 0
    clock.advance(0.2)
    assert queue.visible_count() == 1
    lease.release()  # twice: no-op
    with pytest.raises(LeaseError, match="released"):
        lease.complete()


def test_release_after_complete_is_an_error(queue: MemoryQueue, make_manager: Any) -> None:
    queue.send("job")
    manager = make_manager(queue)
    lease = manager.register(queue.receive()[0])
    lease.complete()
    with pytest.raises(LeaseError, match="completed"):
        lease.release()


def test_release_delay_grows_with_receive_count(clock: ManualClock, make_manager: Any) -> None:
    queue = MemoryQueue(30, clock=clock)
    queue.send("flaky job")
    manager = make_manager(queue, release_delay=2, release_backoff=3)
    delays = []
    for _ in range(3):
        message = queue.receive()[0]
        released_at = clock.now()
        manager.register(message).release()
        while queue.visible_count() == 0:
            clock.advance(0.5)
        delays.append(clock.now() - released_at)
    # 2 s, x3 per receive, each jittered by up to 20 % (seen in 0.5 s steps).
    for delay, base in zip(delays, [2.0, 6.0, 18.0], strict=True):
        assert 0.8 * base <= delay <= 1.2 * base + 0.5, delays


def test_release_of_a_lost_lease_does_nothing(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any
) -> None:
    scripted.inner.send("job")
    manager = make_manager(scripted)
    lease = manager.register(scripted.receive()[0])
    scripted.script("extend", Outcome("lost"))
    clock.advance(21)
    lease.release()
    assert scripted.calls_of("release") == []


def test_bad_release_delay_is_rejected(queue: MemoryQueue, make_manager: Any) -> None:
    queue.send("job")
    lease = make_manager(queue).register(queue.receive()[0])
    for bad in (-1, float("nan"), float("inf"), "5"):
        with pytest.raises(ValueError, match="delay"):
            lease.release(bad)  # type: ignore[arg-type]
    assert lease.state is LeaseState.ACTIVE


# ---------------------------------------------------------------- register


def test_register_is_idempotent(queue: MemoryQueue, make_manager: Any) -> None:
    queue.send("job")
    manager = make_manager(queue)
    message = queue.receive()[0]
    assert manager.register(message) is manager.register(message)
    assert manager.stats().registered == 1


def test_register_rejects_a_message_about_to_reappear(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("job")
    manager = make_manager(queue)
    message = queue.receive()[0]
    clock.advance(28.5)  # 1.5 s left, minimal_life is 2 s
    with pytest.raises(LeaseTooShort) as raised:
        manager.register(message)
    assert raised.value.message_id == message.id
    assert message.receipt not in str(raised.value)
    assert manager.stats().in_flight == 0


def test_register_rejects_what_is_not_a_message(queue: MemoryQueue, make_manager: Any) -> None:
    manager = make_manager(queue)
    for bad in ({"MessageId": "1"}, "receipt", None):
        with pytest.raises(TypeError, match="Message"):
            manager.register(bad)


def test_a_message_received_again_supersedes_its_old_lease(
    queue: MemoryQueue, make_manager: Any
) -> None:
    queue.send("job")
    manager = make_manager(queue)
    old = manager.register(queue.receive()[0])
    queue.release([old.handle()], 0)  # made visible behind the manager's back
    again = queue.receive()[0]
    new = manager.register(again)
    assert new is not old
    assert old.state is LeaseState.LOST
    assert old.lost.is_set()
    assert new.state is LeaseState.ACTIVE
    new.complete()
    assert queue.deleted_ids == [again.id]


def test_register_after_close_raises(queue: MemoryQueue, make_manager: Any) -> None:
    queue.send("job")
    manager = make_manager(queue)
    manager.close()
    with pytest.raises(ManagerClosed):
        manager.register(queue.receive()[0])


# ---------------------------------------------------------------- close


def test_close_releases_every_active_lease(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    for i in range(12):
        queue.send(f"job {i}")
    manager = make_manager(queue)
    leases = [manager.register(m) for m in receive_all(queue, 12)]
    leases[0].complete()
    manager.close()
    assert queue.visible_count() == 11  # at once, not after the timeout
    assert queue.calls["release"] == 2  # batched
    for lease in leases[1:]:
        assert lease.state is LeaseState.RELEASED
        assert lease.lost.is_set()  # its handler must stop: someone else may take it
        with pytest.raises(LeaseLost):
            lease.complete()
    manager.close()  # twice: no-op


def test_close_without_release_leaves_leases_to_lapse(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    for i in range(2):
        queue.send(f"job {i}")
    manager = make_manager(queue)
    first, second = (manager.register(m) for m in receive_all(queue, 2))
    manager.close(release=False)
    assert queue.visible_count() == 0
    first.complete()  # still invisible: a handler may finish
    clock.advance(31)
    assert queue.visible_count() == 1  # not renewed any more
    assert second.extensions == 0


def test_manager_as_context_manager_closes(queue: MemoryQueue, clock: ManualClock) -> None:
    queue.send("job")
    with LeaseManager(queue, clock=clock, visibility_timeout=30) as manager:
        lease = manager.register(queue.receive()[0])
    assert manager.closed
    assert lease.state is LeaseState.RELEASED
    assert queue.visible_count() == 1


def test_real_clock_close_stops_the_scheduler_thread() -> None:
    before = set(threading.enumerate())  # other tests' threads are not ours to judge
    queue = MemoryQueue(5)
    queue.send("job")
    manager = LeaseManager(queue, visibility_timeout=5, timer_interval=0.5, minimal_life=1)
    manager.register(queue.receive()[0])
    started = set(threading.enumerate()) - before
    assert "leasekeeper-scheduler" in {t.name for t in started}
    manager.close(timeout=5)
    assert [t.name for t in started if t.is_alive()] == []


# ---------------------------------------------------------------- stats and secrets


def test_stats_snapshot(clock: ManualClock, scripted: ScriptedBackend, make_manager: Any) -> None:
    for i in range(3):
        scripted.inner.send(f"job {i}")
    manager = make_manager(scripted)
    a, b, c = (manager.register(m) for m in receive_all(scripted, 3))
    clock.advance(21)
    a.complete()
    b.release()
    scripted.script("extend", Outcome("lost"))
    clock.advance(20)
    stats = manager.stats()
    assert c.state is LeaseState.LOST
    assert stats.as_dict() | {} == stats.as_dict()
    assert (stats.registered, stats.completed, stats.released, stats.lost) == (3, 1, 1, 1)
    assert (stats.extended, stats.extend_calls, stats.in_flight) == (3, 2, 0)
    assert stats.scheduler_lag_p99 >= stats.scheduler_lag_p50 >= 0


def test_receipts_never_reach_reprs_logs_or_errors(
    clock: ManualClock, scripted: ScriptedBackend, make_manager: Any, caplog: Any
) -> None:
    caplog.set_level(logging.DEBUG, logger="leasekeeper")
    for i in range(3):
        scripted.inner.send(f"job {i}")
    manager = make_manager(scripted)
    messages = receive_all(scripted, 3)
    leases = [manager.register(m) for m in messages]
    receipts = {m.receipt for m in messages}
    clock.advance(21)
    receipts |= {lease.receipt for lease in leases}
    scripted.script("extend", Outcome("retry", detail="Throttled"), Outcome("lost"))
    clock.advance(40)
    texts = [caplog.text, repr(manager), repr(manager.stats())]
    for lease, message in zip(leases, messages, strict=True):
        texts += [repr(lease), repr(message), repr(message.handle), repr(message.raw)]
        try:
            lease.complete()
        except LeaseError as exc:
            texts.append(str(exc))
    texts.append(repr(scripted.inner.extend([leases[0].handle()], 1)))
    blob = "\n".join(texts)
    assert "lost" in blob  # the scenario did produce log lines and errors
    for receipt in receipts:
        assert receipt not in blob


def test_close_releases_in_parallel_on_a_backend_without_batches() -> None:
    # 40 leases on a 1-per-call backend whose calls each take 50 ms: released on
    # the dispatch pool, not one after another (which would take 2 s).
    import time

    queue = MemoryQueue(30, max_batch=1)
    slow = ScriptedBackend(queue)
    for i in range(40):
        queue.send(f"job {i}")
    manager = LeaseManager(slow, visibility_timeout=30, max_concurrency=16)
    leases = [manager.register(m) for m in receive_all(slow, 40)]
    original = queue.release
    threads_seen: set[str] = set()

    def slow_release(handles: Any, delay: float) -> Any:
        threads_seen.add(threading.current_thread().name)
        time.sleep(0.05)
        return original(handles, delay)

    queue.release = slow_release  # type: ignore[method-assign]
    manager.close()
    assert all(lease.state is LeaseState.RELEASED for lease in leases)
    assert queue.visible_count() == 40
    assert len(threads_seen) > 4, "releases ran one after another"


def test_a_completed_lease_and_its_message_are_freed_at_once(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    import gc
    import weakref

    manager = make_manager(queue)
    for i in range(200):
        queue.send(f"job {i}")
    held = [manager.register(m) for m in receive_all(queue, 100)]  # stay in flight
    done = receive_all(queue, 100)
    refs = []
    for message in done:
        lease = manager.register(message)
        lease.complete()
        refs.append((weakref.ref(lease), weakref.ref(message)))
    del lease, message, done
    gc.collect()
    alive = sum(1 for lease_ref, message_ref in refs if lease_ref() or message_ref())
    assert alive == 0, f"{alive} completed leases still referenced (by stale heap entries?)"
    assert all(h.state is LeaseState.ACTIVE for h in held)
    clock.advance(3600)  # the stale entries are skipped, the live ones renewed
    assert all(h.extensions > 100 for h in held)


def test_lapses_are_counted_measured_and_logged_without_flooding(caplog: Any) -> None:
    # One dispatch thread, held for 1 s by the first batch: the other batches wait in
    # the pool's queue past their leases' deadlines and are sent late.
    caplog.set_level(logging.WARNING, logger="leasekeeper")
    queue = MemoryQueue(1.0, rotate_receipts=True)
    slow = ScriptedBackend(queue)
    for i in range(30):
        queue.send(f"job {i}")
    manager = LeaseManager(
        slow, visibility_timeout=1.0, timer_interval=0.1, minimal_life=0.3, max_concurrency=1
    )
    slow.hold("extend")
    for message in receive_all(slow, 30):
        manager.register(message)
    assert slow.entered["extend"].wait(5)
    threading.Timer(1.2, slow.let_go, args=("extend",)).start()
    deadline = threading.Event()
    deadline.wait(2.0)
    manager.close(release=False, timeout=5)
    stats = manager.stats()
    # The 20 leases queued behind the held call lapse, and so, afterwards, do the 10
    # held ones (their extend was sent on time but answered late).
    assert stats.lapses >= 20
    assert stats.send_lag_p99 >= 0.5  # the wait for the busy dispatch thread counts
    lines = [r for r in caplog.records if r.getMessage().startswith("lapse:")]
    assert len(lines) == 10  # the rest are summed up, not logged one by one


def test_memory_stays_flat_over_a_day_of_renewals(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    # Timing samples (lag, latency) are kept in storage allocated up front: a long-
    # running manager holds the same bytes in its first hour as in its hundredth.
    import tracemalloc

    def manager_bytes() -> int:
        snapshot = tracemalloc.take_snapshot()
        ours = tracemalloc.Filter(True, "*leasekeeper*manager.py")
        return sum(s.size for s in snapshot.filter_traces([ours]).statistics("filename"))

    queue.send("long job")
    manager = make_manager(queue)
    tracemalloc.start()
    try:
        lease = manager.register(queue.receive()[0])
        clock.advance(3600)
        early = manager_bytes()
        clock.advance(24 * 3600)
        late = manager_bytes()
    finally:
        tracemalloc.stop()
    assert lease.extensions == 25 * 3600 // 20
    assert late - early < 2048, f"manager memory grew by {late - early} B over a day"
    stats = manager.stats()
    assert stats.scheduler_lag_p99 == stats.extend_latency_p99 == 0.0  # a driven clock


def test_a_returned_extend_leaves_no_wakeup_at_its_old_deadline(
    clock: ManualClock, queue: MemoryQueue, make_manager: Any
) -> None:
    # While an extend is out its lease's deadline is watched; once it has come back
    # the scheduler's next wake-up is the next renewal, not the old deadline.
    queue.send("job")
    manager = make_manager(queue)
    lease = manager.register(queue.receive()[0])
    first_deadline = lease.visible_until
    clock.advance(20)  # the first renewal, 10 s before that deadline
    assert lease.extensions == 1
    assert manager.next_wakeup() == pytest.approx(lease.visible_until - 10)
    assert manager.next_wakeup() > first_deadline


@pytest.mark.parametrize("choice", [None, 42, "threads", object()])
def test_a_renewer_that_names_no_renewer_is_a_config_error(choice: Any) -> None:
    with pytest.raises(ConfigError) as raised:
        LeaseManager(MemoryQueue(), renewer=choice)
    for name in ("'thread'", "'process'", "'auto'", "Renewer instance"):
        assert name in str(raised.value)


def test_a_thread_renewer_subclass_sees_every_complete_release_and_fail() -> None:
    from leasekeeper import ThreadRenewer

    calls: list[str] = []

    class Counting(ThreadRenewer):
        def complete(self, lease: Lease) -> None:
            calls.append("complete")
            super().complete(lease)

        def release(self, lease: Lease, delay: float | None = None) -> None:
            calls.append("release")
            super().release(lease, delay)

        def fail(
            self, lease: Lease, error: BaseException | None, delay: float | None = None
        ) -> None:
            calls.append("fail")
            super().fail(lease, error, delay)

    clock = ManualClock()
    queue = MemoryQueue(visibility_timeout=30, clock=clock)
    for i in range(6):
        queue.send(f"job {i}")
    manager = LeaseManager(queue, renewer=Counting(clock=clock))
    a, b, c, d, e, f = manager.receive(max_messages=6)
    with a:
        pass
    b.complete()
    assert manager.complete_many([c]) == [None]
    assert manager.complete_soon(d).result(5) is None
    with pytest.raises(RuntimeError), e:
        raise RuntimeError("the handler failed")
    assert manager.release_many([f]) == [None]
    assert calls == ["complete"] * 4 + ["fail", "release", "release"]
    assert [x.state for x in (a, b, c, d, e, f)] == [LeaseState.COMPLETED] * 4 + [
        LeaseState.RELEASED
    ] * 2
    manager.close()
