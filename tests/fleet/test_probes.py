"""Kubernetes probes: ``renewer_health`` on both renewers (a renewer process killed
and replaced included), and ``/livez``/``/readyz`` over HTTP through a worker's
life."""

from __future__ import annotations

import os
import signal
import threading
import time
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest

from leasekeeper import LeaseManager, Message, Worker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.fleet import Health, ProbeServer, renewer_health, serve_probes
from leasekeeper.receiving.listeners import Listeners
from tests.services import make_client


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def stand_in(**stats: Any) -> Any:
    """A manager as ``renewer_health`` reads it, its stats given."""
    figures = {"extend_threshold": 10.0, "scheduler_lag_p50": 0.002, "scheduler_lag_p99": 0.01}
    figures.update(stats)
    return SimpleNamespace(
        renewer=SimpleNamespace(name="thread"),
        closed=False,
        running=True,
        renewer_pid=os.getpid(),
        stats=lambda: SimpleNamespace(**figures),
    )


def test_a_renewer_later_than_its_threshold_is_not_keeping_up() -> None:
    assert renewer_health(stand_in()) == Health(
        True, "the thread renewer keeps up: scheduler lag p50 2 ms, p99 10 ms"
    )
    late = renewer_health(stand_in(scheduler_lag_p50=12.5))
    assert not late.ok
    assert late.reason == (
        "the scheduler is late: median lag 12.500s over the 10s limit (renewals go out "
        "after their deadlines)"
    )
    # The limit is the extend threshold in force, unless given.
    assert renewer_health(stand_in(scheduler_lag_p50=0.5), lag_limit=0.25).ok is False
    # A spike in the last 2,048 wake-ups (p99) is not a reason to restart.
    assert renewer_health(stand_in(scheduler_lag_p99=30.0)).ok


def test_the_thread_renewer_is_alive_while_it_runs() -> None:
    manager = LeaseManager(MemoryQueue(30.0), renewer="thread").start()
    health = renewer_health(manager)
    assert health.ok and health.reason.startswith("the thread renewer keeps up")
    manager.close()
    assert renewer_health(manager) == Health(
        False, "the lease manager is closed: nothing is renewed"
    )


@pytest.mark.realtime
def test_a_renewer_process_killed_is_being_replaced_and_then_serves(
    moto_endpoint: str, sqs_queue: str
) -> None:
    manager = LeaseManager(SQSBackend(make_client(moto_endpoint), sqs_queue), renewer="process")
    try:
        first = manager.renewer_pid
        health = renewer_health(manager)
        assert health.ok and f"the process renewer (pid {first}) keeps up" in health.reason
        os.kill(first, signal.SIGKILL)
        # Dead and not noticed yet, being replaced, or replaced: alive all along.
        seen = set()
        deadline = time.monotonic() + 30
        while manager.renewer_pid in (0, first) or not manager.running:
            health = renewer_health(manager)
            assert health.ok, health
            seen.add(health.reason)
            assert time.monotonic() < deadline, f"no new renewer serves: {seen}"
            time.sleep(0.01)
        health = renewer_health(manager)
        assert health.ok and f"(pid {manager.renewer_pid}) keeps up" in health.reason
    finally:
        manager.close()
    assert not renewer_health(manager).ok
    assert manager.renewer.replacing is False  # type: ignore[attr-defined]


def test_a_check_still_waiting_for_the_renewer_answers_503_itself() -> None:
    answer = threading.Event()
    manager = stand_in()
    stats = manager.stats
    manager.stats = lambda: (answer.wait(30), stats())[1]
    probes = ProbeServer(SimpleNamespace(manager=manager, listeners=Listeners(), stopping=False),  # type: ignore[arg-type]
                         check_timeout=0.2)  # fmt: skip
    first = threading.Thread(target=probes.liveness)
    first.start()
    try:
        health = probes.liveness()  # the first check still waits
        assert health == Health(
            False, "the renewer did not answer within 0.2s (a check is still waiting for it)"
        )
    finally:
        answer.set()
        first.join(30)
    assert probes.liveness().ok


@pytest.mark.realtime
def test_livez_and_readyz_through_a_worker_s_life() -> None:
    queue = MemoryQueue(30.0)
    queue.send("job")
    running, finish = threading.Event(), threading.Event()

    def handler(message: Message) -> None:
        running.set()
        assert finish.wait(30)

    worker = Worker(queue, handler, wait_seconds=0.05, renewer="thread")
    probes = serve_probes(worker, 0, addr="127.0.0.1")
    url = probes.url
    try:
        assert get(f"{url}/readyz") == (503, "not receiving yet\n")
        thread = threading.Thread(target=worker.run)
        thread.start()
        assert running.wait(30)
        assert get(f"{url}/readyz") == (200, "ok: receiving\n")
        status, body = get(f"{url}/livez")
        assert status == 200 and body.startswith("ok: the thread renewer keeps up")
        assert get(f"{url}/healthz")[0] == 404
        worker.drain()
        assert get(f"{url}/readyz") == (
            503,
            "draining: no longer receiving; running handlers finish\n",
        )
        assert get(f"{url}/livez")[0] == 200  # renewing what still runs
        finish.set()
        thread.join(30)
        assert get(f"{url}/readyz") == (503, "the worker has stopped\n")
        assert get(f"{url}/livez") == (503, "the lease manager is closed: nothing is renewed\n")
    finally:
        finish.set()
        probes.close()
    assert probes not in list(worker.listeners)
    assert worker.stats.completed == 1


def test_probes_on_a_port_in_use_raise_and_leave_no_listener() -> None:
    worker = Worker(MemoryQueue(30.0), print, renewer="thread")
    first = serve_probes(worker, 0, addr="127.0.0.1")
    try:
        with pytest.raises(OSError):
            serve_probes(worker, first.port, addr="127.0.0.1")
        assert list(worker.listeners) == [first]
    finally:
        first.close()
        worker.manager.close()
