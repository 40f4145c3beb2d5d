"""The fault matrix on a ManualClock: every fault kind at two rates on four queue shapes.

Each case simulates hours of leases (see ``tests/reliability/matrix.py``) and then
asserts the invariants plus an exact accounting: every injected fault shows up in
the manager's stats as what it should have caused, and nothing else does.
``python -m tests.reliability.figures`` prints the figures of every case.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator

import pytest

from leasekeeper import BackendError, Lease, LeaseManager, LeaseState
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import FaultyBackend, ManualClock
from tests.reliability.invariants import QueueSpy
from tests.reliability.matrix import QUEUES, TIMING_KINDS, Case, Run, all_cases, run_case


@pytest.fixture(autouse=True)
def quiet_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    # Thousands of expected warnings per case: keep them out of the captured report.
    caplog.set_level(logging.CRITICAL, logger="leasekeeper")
    yield


def assert_accounting(run: Run) -> None:
    """Every fault the FaultyBackend injected is accounted for in the stats, exactly."""
    stats = run.manager.stats()
    faulty = run.faulty
    inj, aff = faulty.injected, faulty.affected
    if run.case.kind in TIMING_KINDS:
        # Beyond the budget on purpose: whatever was exposed, leasekeeper noticed.
        if run.figures.exposures or run.figures.stolen_while_active:
            assert stats.lapses + stats.margin_warnings > 0
        return
    # (2) within the budget: nothing exposed, no extend sent late.
    assert (stats.lapses, run.figures.exposures) == (0, 0)
    # Every stale receipt was caught by the queue exactly once.
    assert run.figures.inner_lost == inj("stale")
    expected_lost = (
        inj("lost", "extend")
        + inj("lost", "delete")
        + inj("lost", "release")
        + inj("fatal", "extend")
        + inj("fatal", "delete")
        + run.figures.inner_lost
    )
    assert stats.lost == expected_lost
    assert stats.capped == stats.abandoned == inj("capped")
    transient = sum(aff(kind, "extend") for kind in ("retry", "throttle", "exception", "malformed"))
    assert stats.retries == transient, "no lease may run out of time within the budget"
    assert stats.extend_errors == transient + aff("fatal", "extend") + aff("capped", "extend")


@pytest.mark.parametrize("case", all_cases(), ids=lambda case: case.id)
def test_fault_matrix(case: Case) -> None:
    run = run_case(case)
    run.checker.assert_ok()
    assert run.finished, f"{len(run.queue)} message(s) never processed"
    # Nothing lost, nothing deleted twice: every message ends deleted exactly once.
    assert sorted(run.queue.deleted_ids) == sorted(run.sent)
    assert_accounting(run)
    if case.kind == "none":
        assert run.figures.lease_hours > 5  # the run did hold leases for hours
        assert run.figures.redelivered == run.manager.stats().released  # failed handlers


@pytest.mark.soak
@pytest.mark.timeout(0)
@pytest.mark.parametrize("seed", range(2, 12))
@pytest.mark.parametrize("shape", QUEUES, ids=lambda shape: shape.name)
def test_fault_matrix_soak(seed: int, shape: object) -> None:
    for case in all_cases(seed=seed, messages=120, concurrency=40):
        if case.queue != shape:
            continue
        run = run_case(case)
        run.checker.assert_ok()
        assert run.finished
        assert sorted(run.queue.deleted_ids) == sorted(run.sent)
        assert_accounting(run)


# ------------------------------------------------------------------ core bugs


def make(clock: ManualClock, **faults: object) -> tuple[MemoryQueue, FaultyBackend, LeaseManager]:
    queue = MemoryQueue(30, clock=clock, rotate_receipts=True)
    faulty = FaultyBackend(queue, seed=3, clock=clock, **faults)  # type: ignore[arg-type]
    manager = LeaseManager(faulty, clock=clock, visibility_timeout=30)
    return queue, faulty, manager


def test_regression_lease_scope_leaks_a_lease_whose_delete_keeps_failing() -> None:
    """``with manager.lease(msg):`` succeeds, the delete fails 4 times (InternalError):
    BackendError reaches the caller - fine - but the lease stays ACTIVE and the
    scheduler renews it for ever (no max_lease_duration by default): the message is
    neither deleted nor ever seen again. The Worker logs "released" but nothing is."""
    clock = ManualClock()
    queue, faulty, manager = make(clock)
    queue.send("job")
    message = faulty.receive()[0]
    faulty.script("delete", "retry", "retry", "retry", "retry")
    with pytest.raises(BackendError), manager.lease(message) as held:
        pass  # the handler succeeded
    clock.advance(6 * 3600)
    assert held.state is not LeaseState.ACTIVE
    assert queue.visible_count() == 1, "the message must come back to be processed again"


def test_regression_base_exception_from_extend_drops_leases_silently() -> None:
    """_call catches Exception only. A CancelledError (a BaseException since 3.8, which
    SDKs bridged onto asyncio raise) escapes _extend_batch after the leases were
    popped off the heap: they stay ACTIVE but are never scheduled again and never
    reported. On a real clock the dispatch future swallows it without a log line."""
    clock = ManualClock()
    queue, faulty, manager = make(clock)
    spy_reports: list[str] = []
    manager.on_lost = lambda lease, reason: spy_reports.append(reason)
    queue.send("job")
    lease = manager.register(faulty.receive()[0])
    faulty.script("extend", asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        clock.advance(21)
    clock.advance(60)
    # Either renewed (the error was treated as transient) or reported: not silently dropped.
    assert lease.extensions >= 1 or spy_reports, (lease.state, queue.visible_count())


def test_transient_delete_failure_outside_lease_scope_keeps_renewing() -> None:
    # The documented behaviour the bug above builds on: a caller that handles
    # BackendError itself can complete later, and meanwhile the lease is renewed.
    clock = ManualClock()
    queue, faulty, manager = make(clock)
    queue.send("job")
    lease = manager.register(faulty.receive()[0])
    faulty.script("delete", *["throttle"] * 4)
    with pytest.raises(BackendError, match="Throttling"):
        lease.complete()
    clock.advance(120)
    assert lease.state is LeaseState.ACTIVE and lease.extensions >= 5
    assert queue.visible_count() == 0
    lease.complete()
    assert queue.deleted_ids == [lease.id]
    assert faulty.injected("throttle", "delete") == 4
    assert faulty.answers["delete.ok"] == 1


def _outage(retries: int) -> tuple[LeaseManager, Lease, QueueSpy, FaultyBackend]:
    clock = ManualClock()
    queue = MemoryQueue(30, clock=clock)
    spy = QueueSpy(queue)
    faulty = FaultyBackend(spy, seed=3, clock=clock)
    manager = LeaseManager(faulty, clock=clock, visibility_timeout=30, jitter_seed=3)
    queue.send("job")
    lease = manager.register(faulty.receive()[0])
    faulty.script("extend", *["retry"] * retries)
    clock.advance(31)
    return manager, lease, spy, faulty


def test_regression_last_retry_is_sent_at_the_deadline() -> None:
    """_retry schedules the final attempt at the deadline itself, meaning (per its
    comment) that "the check above turns it into lost" there. But that check runs
    only after *another* failed call: at the deadline the scheduler sends the extend
    first. If it fails, the lease is lost (correct, one call late); if it succeeds,
    the lease carries on with a lapse, though the message was visible - another
    consumer may hold it - and its handler is never told."""
    manager, lost, spy, _ = _outage(retries=100)
    assert lost.state is LeaseState.LOST  # an outage beyond the budget: lost at the deadline
    # ... and no extend went out at or after the deadline (it would count as a lapse).
    assert (manager.stats().lapses, spy.exposures) == (0, [])
    assert "InternalError" in (lost.reason or "")
