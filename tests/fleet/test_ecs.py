"""ECS task scale-in protection: when it calls the agent (``ProtectionPlan``, plain
numbers; ``ScaleInProtection`` on a ManualClock), what it makes of the agent's
answers (a local agent answering as the real one does), and a worker protected while
it holds messages (real time, MemoryQueue)."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from leasekeeper import Message, Worker
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.fleet import ScaleInProtection
from leasekeeper.fleet.ecs import EcsAgent, ProtectionError, ProtectionPlan, backoff
from leasekeeper.testing import ManualClock
from tests.fleet.clouds import CloudServer
from tests.services import free_port

# ------------------------------------------------------------------ the plan, in numbers


def test_a_busy_worker_is_protected_at_once_and_renewed_before_it_runs_out() -> None:
    plan = ProtectionPlan(minutes=60, idle_grace=5.0)
    assert plan.due(0.0) is None  # idle and unprotected: nothing to do
    plan.on_busy()
    assert plan.due(0.0) is True
    plan.answered(True, True, sent_at=0.0, now=0.2)
    assert plan.protected(0.2) and plan.due(0.2) is None
    # 60 minutes, renewed 15 minutes before they end.
    assert plan.renew_lead == 900.0
    assert plan.next_at(1.0) == 3600.0 - 900.0
    assert plan.due(2699.0) is None and plan.due(2700.0) is True
    plan.answered(True, True, sent_at=2700.0, now=2700.1)
    assert plan.next_at(2700.1) == 2700.0 + 2700.0


def test_the_renewal_lead_fits_short_protections() -> None:
    assert ProtectionPlan(minutes=1).renew_lead == 30.0  # half of one minute
    assert ProtectionPlan(minutes=2).renew_lead == 60.0  # at least a minute
    assert ProtectionPlan(minutes=2880).renew_lead == 43200.0  # a quarter


def test_idle_unprotects_after_the_grace_and_busy_again_within_it_costs_nothing() -> None:
    plan = ProtectionPlan(minutes=60, idle_grace=5.0)
    plan.on_busy()
    plan.answered(True, True, sent_at=0.0, now=0.0)
    plan.on_idle(10.0)
    assert plan.due(14.9) is None and plan.next_at(14.9) == 15.0
    plan.on_busy()  # the next message came within the grace: still protected, no call
    assert plan.due(14.9) is None
    plan.on_idle(20.0)
    assert plan.due(25.0) is False
    plan.answered(False, True, sent_at=25.0, now=25.0)
    assert not plan.protected(25.0) and plan.due(1000.0) is None


def test_draining_unprotects_at_once_and_never_protects_again() -> None:
    plan = ProtectionPlan(minutes=60, idle_grace=5.0)
    plan.on_busy()
    plan.answered(True, True, sent_at=0.0, now=0.0)
    plan.on_drain()  # handlers still run; the task is going anyway
    assert plan.due(1.0) is False
    plan.answered(False, True, sent_at=1.0, now=1.0)
    plan.on_busy()
    assert plan.due(2.0) is None


def test_a_failed_call_is_tried_again_after_a_growing_pause() -> None:
    plan = ProtectionPlan(minutes=60)
    plan.on_busy()
    plan.answered(True, False, sent_at=0.0, now=1.0)
    assert plan.due(1.0) is None and plan.next_at(1.0) == 16.0
    plan.answered(True, False, sent_at=16.0, now=16.0)
    assert plan.next_at(16.0) == 46.0
    assert [backoff(n) for n in (1, 2, 3, 4, 5, 6, 9)] == [15, 30, 60, 120, 240, 300, 300]
    # A failed removal leaves the task protected in our books: tried again too.
    plan.answered(True, True, sent_at=50.0, now=50.0)
    plan.on_drain()
    plan.answered(False, False, sent_at=51.0, now=51.0)
    assert plan.protected(52.0) and plan.next_at(52.0) == 66.0


def test_a_protect_that_may_have_taken_effect_is_lifted_all_the_same() -> None:
    plan = ProtectionPlan(minutes=60, idle_grace=5.0)
    plan.on_busy()
    plan.answered(True, False, sent_at=0.0, now=1.0, unsure=True)  # the agent's 500
    assert not plan.protected(1.0) and plan.held(1.0)
    plan.on_idle(10.0)
    assert plan.next_at(10.0) == 16.0  # the grace, and the backoff after the failure
    assert plan.due(16.0) is False
    plan.answered(False, True, sent_at=16.0, now=16.0)
    assert not plan.held(16.0) and plan.due(100.0) is None
    # A call that never reached the agent (refused) protected nothing: nothing to lift.
    plan = ProtectionPlan(minutes=60, idle_grace=5.0)
    plan.on_busy()
    plan.answered(True, False, sent_at=0.0, now=0.0)
    plan.on_idle(1.0)
    assert not plan.held(1.0) and plan.next_at(1.0) is None


def test_a_drain_lifts_the_protection_at_once_even_after_failures() -> None:
    plan = ProtectionPlan(minutes=60, idle_grace=5.0)
    plan.on_busy()
    plan.answered(True, True, sent_at=0.0, now=0.0)
    plan.on_idle(10.0)
    plan.answered(False, False, sent_at=15.0, now=15.0)  # retried at 30 s
    plan.on_drain()
    assert plan.due(16.0) is False
    plan.answered(False, False, sent_at=16.0, now=16.0)
    assert plan.due(17.0) is None and plan.next_at(17.0) == 46.0  # then the backoff


def test_a_protection_that_ran_out_is_not_removed() -> None:
    plan = ProtectionPlan(minutes=1, idle_grace=5.0)
    plan.on_busy()
    plan.answered(True, True, sent_at=0.0, now=0.0)
    plan.on_idle(10.0)
    assert plan.due(61.0) is None  # ECS let it go at 60 s


# ------------------------------------------------------------------ the agent's answers


def test_the_agent_gets_the_documented_body_and_its_answers_are_read(cloud: CloudServer) -> None:
    agent = EcsAgent(cloud.agent_uri + "/")  # a trailing slash is fine
    agent.put(True, 30)
    agent.put(False, 30)
    puts = cloud.state.puts()
    assert [c.path for c in puts] == [
        f"/api/{cloud.agent_uri.rsplit('/', 1)[1]}/task-protection/v1/state"
    ] * 2
    assert [c.body for c in puts] == [
        {"ProtectionEnabled": True, "ExpiresInMinutes": 30},
        {"ProtectionEnabled": False, "ExpiresInMinutes": 30},
    ]
    assert puts[0].headers["Content-Type"] == "application/json"
    cloud.state.ecs_mode = "error"
    with pytest.raises(ProtectionError, match="HTTP 500: ServerException: Timed out") as error:
        agent.put(True, 30)
    assert not error.value.permanent and error.value.unsure  # ECS may have done it
    cloud.state.ecs_mode = "failure"
    with pytest.raises(ProtectionError, match="ECS refused: TASK_NOT_VALID") as error:
        agent.put(True, 30)
    assert error.value.permanent and not error.value.unsure


def test_an_unreachable_agent_is_a_protection_error() -> None:
    agent = EcsAgent(f"http://127.0.0.1:{free_port()}/api/x", timeout=2.0)
    with pytest.raises(ProtectionError, match="the ECS agent did not answer") as error:
        agent.put(True, 5)
    assert not error.value.unsure  # refused: it never had the request


# ------------------------------------------------------------------ on a ManualClock


def test_protection_renews_while_busy_and_lifts_after_the_idle_grace(
    cloud: CloudServer, clock: ManualClock
) -> None:
    protection = ScaleInProtection(cloud.agent_uri, minutes=10, idle_grace=5.0, clock=clock)
    protection.started()
    try:
        protection.busy()  # returns once the agent answered
        assert cloud.state.protections() == [True]
        assert clock.wait_for_sleepers(1)  # waiting for the renewal: 450 s on
        clock.advance(449.0)
        assert clock.wait_for_sleepers(1) and cloud.state.protections() == [True]
        clock.advance(1.0)
        assert cloud.wait_puts(2) == [True, True]
        assert clock.wait_for_sleepers(1)  # the next renewal: 450 s after that one
        protection.idle()
        assert clock.wait_for_sleepers(1)
        clock.advance(4.9)
        assert clock.wait_for_sleepers(1) and cloud.state.protections() == [True, True]
        clock.advance(0.1)
        assert cloud.wait_puts(3) == [True, True, False]
        assert all(c.body["ExpiresInMinutes"] == 10 for c in cloud.state.puts())
    finally:
        protection.stopped()


def test_busy_again_within_the_grace_makes_no_call(cloud: CloudServer, clock: ManualClock) -> None:
    protection = ScaleInProtection(cloud.agent_uri, idle_grace=5.0, clock=clock)
    protection.started()
    try:
        protection.busy()
        for _ in range(20):  # one message after another, a moment idle in between
            protection.idle()
            assert clock.wait_for_sleepers(1)
            clock.advance(1.0)
            protection.busy()
        protection.draining()  # SIGTERM: lifted at once
        assert cloud.wait_puts(2) == [True, False]
    finally:
        protection.stopped()
    assert cloud.state.protections() == [True, False]


def test_a_failing_agent_warns_once_and_the_worker_does_not_wait_for_it(
    cloud: CloudServer, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    cloud.state.ecs_mode = "error"
    protection = ScaleInProtection(cloud.agent_uri, idle_grace=5.0, clock=clock)
    protection.started()
    caplog.set_level(logging.DEBUG, logger="leasekeeper.fleet")
    try:
        protection.busy()  # waited for the first answer: a failure
        assert cloud.state.protections() == [True]
        assert clock.wait_for_sleepers(1)  # the retry, 15 s on
        clock.advance(15.0)
        assert cloud.wait_puts(2) == [True, True]
        assert clock.wait_for_sleepers(1)
        cloud.state.ecs_mode = "ok"
        clock.advance(30.0)
        assert cloud.wait_puts(3) == [True, True, True]
        protection.draining()
        assert cloud.wait_puts(4) == [True, True, True, False]
    finally:
        protection.stopped()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "HTTP 500: ServerException" in warnings[0].getMessage()
    assert any("works again" in r.getMessage() for r in caplog.records)


def test_a_standalone_task_is_said_once_and_never_asked_again(
    cloud: CloudServer, clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    cloud.state.ecs_mode = "failure"
    protection = ScaleInProtection(cloud.agent_uri, clock=clock)
    protection.started()
    try:
        protection.busy()
        protection.idle()
        protection.busy()
        clock.advance(3600)
    finally:
        protection.stopped()
    assert cloud.state.protections() == [True]
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "protection is off: ECS refused: TASK_NOT_VALID" in warning.getMessage()


def test_outside_ecs_it_says_so_once_and_does_nothing(
    clock: ManualClock, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ECS_AGENT_URI", raising=False)
    protection = ScaleInProtection(clock=clock)
    protection.started()
    protection.busy()
    protection.idle()
    protection.draining()
    protection.stopped()
    [warning] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "ECS_AGENT_URI is not set" in warning.getMessage()
    assert protection.agent is None and protection.succeeded == protection.failed == 0


def test_the_agent_uri_comes_from_the_environment(
    cloud: CloudServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ECS_AGENT_URI", cloud.agent_uri)
    protection = ScaleInProtection()
    assert protection.agent is not None and protection.agent.url.startswith(cloud.agent_uri)


@pytest.mark.parametrize("minutes", [0, 2881, 1.5, True])
def test_minutes_must_be_what_ecs_takes(minutes: object) -> None:
    with pytest.raises((TypeError, ValueError), match="minutes"):
        ScaleInProtection("http://127.0.0.1:1", minutes=minutes)  # type: ignore[arg-type]


# ------------------------------------------------------------------ a worker, real time


@pytest.mark.realtime
def test_a_worker_is_protected_before_a_job_starts_and_unprotected_once_idle(
    cloud: CloudServer,
) -> None:
    queue = MemoryQueue(30.0)
    for i in range(3):
        queue.send(f"job-{i}")
    seen: list[list[bool]] = []

    def handler(message: Message) -> None:
        seen.append(cloud.state.protections())  # what the agent was told before it ran

    worker = Worker(
        queue,
        handler,
        concurrency=1,
        wait_seconds=0.05,
        renewer="thread",
        scale_in_protection=ScaleInProtection(cloud.agent_uri, idle_grace=0.5),
    )
    worker.run(until_idle=2.0)
    assert seen == [[True]] * 3  # one protection for the three, in place before each
    assert cloud.state.protections() == [True, False]
    assert worker.stats.completed == 3


@pytest.mark.realtime
def test_a_drain_unprotects_while_the_handler_still_runs(cloud: CloudServer) -> None:
    queue = MemoryQueue(30.0)
    queue.send("long")
    running, finish = threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        running.set()
        assert finish.wait(30)

    worker = Worker(
        queue,
        handler,
        wait_seconds=0.05,
        renewer="thread",
        scale_in_protection=ScaleInProtection(cloud.agent_uri, idle_grace=60.0),
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert running.wait(30)
        worker.drain()
        assert cloud.wait_puts(2) == [True, False]  # the job still runs
        assert thread.is_alive()
    finally:
        finish.set()
        thread.join(30)
    assert worker.stats.completed == 1 and len(queue) == 0


@pytest.mark.realtime
def test_an_async_worker_is_protected_the_same_way(cloud: CloudServer) -> None:
    queue = MemoryQueue(30.0)
    for i in range(2):
        queue.send(f"job-{i}")
    seen: list[list[bool]] = []

    async def handler(message: Message) -> None:
        seen.append(cloud.state.protections())

    worker = AsyncWorker(
        queue,
        handler,
        wait_seconds=0.05,
        renewer="thread",
        scale_in_protection=ScaleInProtection(cloud.agent_uri, idle_grace=0.2),
    )
    asyncio.run(asyncio.wait_for(worker.run(until_idle=1.5), 60))
    assert seen == [[True], [True]]
    assert cloud.state.protections() == [True, False]


def test_scale_in_protection_takes_a_bool_or_one_of_its_own() -> None:
    with pytest.raises(TypeError, match="scale_in_protection takes True, False or"):
        Worker(MemoryQueue(), lambda m: None, renewer="thread", scale_in_protection="yes")  # type: ignore[arg-type]
