"""Real threads and real time, with sub-second timeouts."""

from __future__ import annotations

import threading
import time

import pytest

from leasekeeper import LeaseManager, LeaseState
from leasekeeper.backends.memory import MemoryQueue

pytestmark = pytest.mark.realtime


def test_twenty_long_jobs_are_never_seen_by_a_competing_consumer() -> None:
    """20 jobs each running 3x the visibility timeout while another consumer polls."""
    visibility = 1.0
    queue = MemoryQueue(visibility, rotate_receipts=True)
    for i in range(20):
        queue.send(f"job {i}")
    stolen: list[str] = []
    stop = threading.Event()

    def thief() -> None:
        while not stop.is_set():
            stolen.extend(m.id for m in queue.receive(max_messages=10, wait_seconds=0.05))

    with LeaseManager(
        queue, visibility_timeout=visibility, timer_interval=0.1, minimal_life=0.3
    ) as manager:
        messages = queue.receive(max_messages=10) + queue.receive(max_messages=10)
        assert len(messages) == 20
        poller = threading.Thread(target=thief)
        poller.start()

        def job(message: object) -> None:
            with manager.lease(message):  # type: ignore[arg-type]
                time.sleep(3 * visibility)

        workers = [threading.Thread(target=job, args=(m,)) for m in messages]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        stop.set()
        poller.join()
        stats = manager.stats()
    assert stolen == []
    assert sorted(queue.deleted_ids) == sorted(m.id for m in messages)
    assert len(queue) == 0
    assert stats.lapses == 0 and stats.lost == 0
    assert stats.extended >= 20 * 2


def test_a_dead_workers_message_returns_within_one_timeout() -> None:
    visibility = 0.8
    queue = MemoryQueue(visibility)
    queue.send("job")
    manager = LeaseManager(
        queue, visibility_timeout=visibility, timer_interval=0.1, minimal_life=0.3
    )
    lease = manager.register(queue.receive()[0])
    time.sleep(1.0)  # renewed meanwhile
    assert queue.visible_count() == 0 and lease.extensions >= 1
    died = time.monotonic()
    manager.close(release=False)  # the worker "dies": nobody renews
    got = queue.receive(wait_seconds=3)
    assert len(got) == 1
    assert time.monotonic() - died <= visibility + 0.1 + 0.2
    assert lease.state is LeaseState.ACTIVE  # never told: the process is gone
