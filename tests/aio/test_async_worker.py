"""AsyncWorker on MemoryQueue, on real event loops: receive, handle, settle, shut down."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import tracemalloc
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from leasekeeper import LeaseManager, Message, ReceiveError, WorkerStats, aio
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends import memory as memory_module
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import FaultyBackend

pytestmark = pytest.mark.realtime

T = TypeVar("T")
TIMING = {"visibility_timeout": 2.0, "timer_interval": 0.2, "minimal_life": 0.5}


def run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coro, 120))


# A run that handles no job for this long is hung (the long run's guard).
STALLED_AFTER = 30.0


def test_processes_everything_and_stops_when_idle() -> None:
    queue = MemoryQueue(2.0)
    queue.send_many([f"job {i}" for i in range(12)])
    seen: list[str] = []

    async def handler(message: Message) -> None:
        await asyncio.sleep(0.05)
        seen.append(message.id)

    worker = AsyncWorker(queue, handler, concurrency=4, wait_seconds=0.05, **TIMING)
    stats = run(worker.run(until_idle=0.3))
    assert (stats.received, stats.completed, stats.failed, stats.lost) == (12, 12, 0, 0)
    assert len(queue) == 0 and sorted(seen) == sorted(queue.deleted_ids)
    assert worker.manager.closed


def test_a_failing_handler_releases_its_message() -> None:
    queue = MemoryQueue(2.0)
    queue.send("poison")

    async def handler(message: Message) -> None:
        raise ValueError("bad payload")

    worker = AsyncWorker(queue, handler, wait_seconds=0.05, release_delay=5.0, **TIMING)
    stats = run(worker.run(until_idle=0.3))
    assert (stats.failed, stats.completed) == (1, 0)
    assert len(queue) == 1 and queue.visible_count() == 0  # released with a 5 s delay


def test_never_holds_more_than_it_can_run() -> None:
    queue = MemoryQueue(2.0)
    queue.send_many([f"job {i}" for i in range(10)])

    async def main() -> int:
        started: list[str] = []
        finish = asyncio.Event()

        async def handler(message: Message) -> None:
            started.append(message.id)
            await finish.wait()

        worker = AsyncWorker(queue, handler, concurrency=2, wait_seconds=0.05, **TIMING)
        running = asyncio.ensure_future(worker.run())
        while len(started) < 2:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # a few receive turns, had there been room
        held = queue.in_flight_count()
        finish.set()
        worker.stop()
        await running
        return held

    assert run(main()) == 2  # not 10: the rest stay available to other workers


def test_stop_lets_handlers_finish_then_releases_and_cancels_the_rest() -> None:
    queue = MemoryQueue(2.0)
    queue.send_many(["quick", "stuck"])
    done: list[str] = []
    cancelled: list[str] = []
    started: list[str] = []
    both = asyncio.Event()

    async def handler(message: Message) -> None:
        started.append(str(message.body))
        if len(started) == 2:
            both.set()
        try:
            await asyncio.sleep(60 if message.body == "stuck" else 0.3)
        except asyncio.CancelledError:
            cancelled.append(str(message.body))
            raise
        done.append(str(message.body))

    async def main() -> Any:
        worker = AsyncWorker(
            queue, handler, concurrency=2, wait_seconds=0.05, shutdown_timeout=1.0, **TIMING
        )
        running = asyncio.ensure_future(worker.run())
        await asyncio.wait_for(both.wait(), 30)  # stopped while both handlers run
        worker.stop()
        return await running

    stats = run(main())
    assert done == ["quick"] and cancelled == ["stuck"]
    assert (stats.completed, stats.lost) == (1, 1)
    assert len(queue) == 1 and queue.visible_count() == 1  # "stuck" released at once


def test_on_a_shared_manager_it_leaves_the_manager_open_and_tells_the_handler() -> None:
    queue = MemoryQueue(2.0)
    queue.send("stuck")
    manager = LeaseManager(queue, **TIMING)
    told: list[bool] = []
    started = asyncio.Event()

    async def handler(message: Message) -> None:
        started.set()
        told.append(await aio.current_lease().lost.wait())  # released under it at shutdown

    async def main() -> Any:
        worker = AsyncWorker(manager, handler, wait_seconds=0.05, shutdown_timeout=0.3)
        running = asyncio.ensure_future(worker.run())
        # Stopped while its handler runs (a receive out at the stop would give its
        # message back unhandled).
        await asyncio.wait_for(started.wait(), 30)
        worker.stop()
        return await running

    stats = run(main())
    assert told == [True] and stats.lost == 1
    assert not manager.closed and queue.visible_count() == 1 and queue.deleted_ids == []
    manager.close()


def test_cancel_on_lost_cancels_a_handler_whose_lease_is_lost() -> None:
    queue = MemoryQueue(2.0, rotate_receipts=True)
    queue.send("job")
    cancelled: list[str] = []

    async def handler(message: Message) -> None:
        queue.rotate_receipt(message.id)  # someone else received it: the next extend fails
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.append(message.id)
            raise

    worker = AsyncWorker(queue, handler, wait_seconds=0.05, cancel_on_lost=True, **TIMING)
    stats = run(worker.run(until_idle=0.3))
    assert cancelled == ["m-000001"]
    assert (stats.lost, stats.completed, stats.failed) == (1, 0, 0)
    assert queue.deleted_ids == []


def test_deletes_share_batch_calls() -> None:
    queue = MemoryQueue(30)
    queue.send_many(["x"] * 1000)

    async def handler(message: Message) -> None:
        pass

    stats = run(AsyncWorker(queue, handler, concurrency=8, wait_seconds=0.2).run(until_idle=0.5))
    assert (stats.completed, stats.failed, stats.lost) == (1000, 0, 0)
    calls = queue.calls
    assert queue.deleted_count == 1000
    assert (calls["receive"] + calls["delete"] + calls["extend"]) / 1000 < 0.6


def test_rejects_bad_arguments() -> None:
    queue = MemoryQueue(2.0)

    def plain(message: Message) -> None: ...

    async def handler(message: Message) -> None: ...

    with pytest.raises(TypeError, match="async def"):
        AsyncWorker(queue, plain)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="callable"):
        AsyncWorker(queue, "handler")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="concurrency"):
        AsyncWorker(queue, handler, concurrency=0)
    with pytest.raises(TypeError, match="LeaseManager or a leasekeeper backend"):
        AsyncWorker(object(), handler)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not to a AsyncWorker built on one"):
        AsyncWorker(LeaseManager(queue), handler, visibility_timeout=60)


def test_a_fatal_receive_error_stops_it_after_running_handlers() -> None:
    queue = MemoryQueue(2.0)
    queue.send("job")
    faulty = FaultyBackend(queue)
    faulty.script("receive", "pass", "fatal")
    finished: list[str] = []

    async def handler(message: Message) -> None:
        while faulty.injected("fatal", "receive") == 0:
            await asyncio.sleep(0.01)
        finished.append(message.id)

    worker = AsyncWorker(faulty, handler, concurrency=2, wait_seconds=0.05, **TIMING)
    with pytest.raises(ReceiveError) as raised:
        run(worker.run())
    assert not raised.value.retryable and worker.error is raised.value
    assert finished == ["m-000001"] and queue.deleted_ids == ["m-000001"]
    assert worker.manager.closed


def test_retryable_receive_errors_are_retried(caplog: pytest.LogCaptureFixture) -> None:
    queue = MemoryQueue(2.0)
    queue.send("job")
    faulty = FaultyBackend(queue)
    faulty.script("receive", "retry", RuntimeError("custom backend failed"))
    caplog.set_level(logging.WARNING, logger="leasekeeper.worker")
    done: list[str] = []

    async def handler(message: Message) -> None:
        done.append(message.id)

    stats = run(AsyncWorker(faulty, handler, wait_seconds=0.05, **TIMING).run(until_idle=0.5))
    assert done == ["m-000001"] and stats.completed == 1
    messages = [r.getMessage() for r in caplog.records]
    assert sum("retrying in" in m for m in messages) == 2
    assert not any("custom backend failed" in m for m in messages)


# ------------------------------------------------------------------ memory


def traced_outside_the_queue() -> int:
    """Bytes traced now, leaving out what MemoryQueue itself holds: it keeps a
    deleted message's entry in its visibility heap until the entry's deadline
    passes (30 s here, longer than the run), which would grow like a leak."""
    gc.collect()  # garbage is not a leak: count what is still reachable
    snapshot = tracemalloc.take_snapshot().filter_traces(
        [
            tracemalloc.Filter(False, memory_module.__file__),
            tracemalloc.Filter(False, tracemalloc.__file__),
        ]
    )
    return sum(stat.size for stat in snapshot.statistics("filename"))


@pytest.mark.slow
def test_memory_stays_flat_over_a_long_run_of_short_jobs() -> None:
    """20,000 no-op jobs, each reading its lease's lost signal and watched for
    cancel-on-lost (the paths a leaky async renewer would grow): the memory traced
    in the last quarter of the run is within a small bound of the first quarter's."""
    jobs = 20_000
    queue = MemoryQueue(30, history=False)
    queue.send_many(["x"] * jobs)
    samples: list[tuple[int, int]] = []  # (jobs handled, bytes traced)
    handled = 0

    async def handler(message: Message) -> None:
        nonlocal handled
        held = aio.current_lease()
        assert not held.lost.is_set()
        handled += 1
        if handled % 1000 == 0:
            samples.append((handled, traced_outside_the_queue()))

    async def run_while_it_progresses() -> WorkerStats:
        # A hang fails; slowness does not. 20,000 jobs under tracemalloc are CPU-bound
        # work: beside two CPU hogs on a loaded two-core machine they outlasted the
        # 120 s that ``run`` allows a whole run, while jobs were still being done.
        task = asyncio.ensure_future(worker.run(until_idle=0.5))
        seen = -1
        while not task.done():
            await asyncio.wait({task}, timeout=STALLED_AFTER)
            if not task.done() and handled == seen:
                task.cancel()
                raise AssertionError(f"no job handled in {STALLED_AFTER:g} s: hung")
            seen = handled
        return task.result()

    worker = AsyncWorker(queue, handler, concurrency=16, wait_seconds=0.05, cancel_on_lost=True)
    tracemalloc.start()
    try:
        stats = asyncio.run(run_while_it_progresses())
    finally:
        tracemalloc.stop()
    assert stats.completed == jobs and queue.deleted_count == jobs
    quarter = jobs // 4
    first = [size for n, size in samples if quarter // 2 < n <= quarter]  # after warm-up
    last = [size for n, size in samples if n > jobs - quarter]
    # Medians: one sample taken while a batch of 16 handlers and its deletes are in
    # flight weighs nothing against the trend.
    first_mean, last_mean = statistics.median(first), statistics.median(last)
    growth = last_mean - first_mean
    per_job = growth / (jobs - quarter)
    print(
        f"\ntraced memory outside MemoryQueue: first quarter {first_mean / 1024:.1f} KiB, "
        f"last quarter {last_mean / 1024:.1f} KiB, growth {growth / 1024:+.1f} KiB "
        f"({per_job:+.2f} B a job over {jobs - quarter} jobs)"
    )
    # A leak of one small object a job (a future, a callback, a watch: ~100 B) would
    # grow ~1.5 MiB over the run; allow a tenth of that for noise.
    assert growth < 150 * 1024


# ------------------------------------------------------------------ signals

SCRIPT = textwrap.dedent(
    """
    import asyncio, json, logging, sys
    from leasekeeper.aio import AsyncWorker
    from leasekeeper.backends.memory import MemoryQueue

    queue = MemoryQueue(2.0)
    queue.send_many(["short", "long"] + (["stuck"] if "--stuck" in sys.argv else []))

    async def handler(message):
        if message.body == "long":
            print("started", flush=True)
            await asyncio.sleep(1.5)
        elif message.body == "stuck":
            await asyncio.sleep(60)

    async def main():
        worker = AsyncWorker(queue, handler, concurrency=3, wait_seconds=0.05,
                             shutdown_timeout=30, visibility_timeout=2.0,
                             timer_interval=0.2, minimal_life=0.5)
        stats = await worker.run()
        print(json.dumps({"completed": stats.completed, "lost": stats.lost,
                          "left": len(queue), "visible": queue.visible_count()}), flush=True)

    logging.basicConfig(level=logging.INFO)
    asyncio.run(main())
    """
)


def _start(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [sys.executable, str(script), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_sigterm_inside_asyncio_run_lets_running_handlers_finish(tmp_path: Path) -> None:
    proc = _start(tmp_path)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"completed": 2, "lost": 0, "left": 0, "visible": 0}


def test_a_second_signal_skips_the_wait(tmp_path: Path) -> None:
    proc = _start(tmp_path, "--stuck")
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "started"
    proc.send_signal(signal.SIGINT)
    assert proc.stderr is not None
    for line in proc.stderr:  # the first signal taken, not merged with the second
        if "a second Ctrl-C releases their messages now" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)  # not the 30 s shutdown_timeout, nor 60 s
    assert proc.returncode == 0
    result = json.loads(out.strip().splitlines()[-1])
    # "short" was done; "long" and "stuck" were released at once and cancelled.
    assert result == {"completed": 1, "lost": 2, "left": 2, "visible": 2}


def test_on_a_manual_clock_the_shared_loop_waits_for_the_test() -> None:
    """AsyncWorker runs the same receive loop as Worker, on the worker's clock: on a
    ManualClock its waits (the rest of an empty poll, the idle limit, backoff) last
    until the test advances time, however long that takes in real time."""
    import threading

    from leasekeeper.testing import ManualClock
    from tests.core.test_worker import drive

    clock = ManualClock()
    queue = MemoryQueue(30.0, clock=clock)
    queue.send_many([f"job {i}" for i in range(5)])
    faulty = FaultyBackend(queue)
    faulty.script("receive", "throttle")  # one backoff pause first
    seen: list[str] = []

    async def handler(message: Message) -> None:
        seen.append(str(message.body))

    worker = AsyncWorker(
        faulty, handler, concurrency=2, wait_seconds=1, clock=clock, visibility_timeout=30
    )
    assert worker.clock is clock
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(run(worker.run(until_idle=5))))
    thread.start()
    started = clock.now()
    drive(clock, thread, step=0.5)
    (stats,) = out
    assert stats.completed == 5 and sorted(seen) == [f"job {i}" for i in range(5)]
    assert clock.now() - started >= 5  # idle for 5 s of the worker's clock
    assert worker.manager.closed


def test_a_queue_never_reached_stops_it_as_it_stops_a_worker() -> None:
    """The rule of docs/guide.md, "When a service cannot be reached", on the event
    loop: REACH_WITHIN seconds of the worker's clock without an answer, then run()
    raises the last (retryable) error; until_idle ends it sooner."""
    import threading

    from leasekeeper.receiving import REACH_WITHIN
    from leasekeeper.testing import ManualClock
    from tests.core.test_worker import drive

    for until_idle, lasted in ((None, REACH_WITHIN), (2.0, 2.0)):
        clock = ManualClock()
        faulty = FaultyBackend(MemoryQueue(30.0, clock=clock))
        faulty.script("receive", *["retry"] * 200)

        async def handler(message: Message) -> None:
            pass

        worker = AsyncWorker(faulty, handler, clock=clock, renewer="thread", visibility_timeout=30)
        out: list[Any] = []

        def target(
            worker: AsyncWorker = worker, idle: float | None = until_idle, out: list[Any] = out
        ) -> None:
            try:
                run(worker.run(until_idle=idle))
            except ReceiveError as exc:
                out.append(exc)

        thread = threading.Thread(target=target)
        thread.start()
        started = clock.now()
        drive(clock, thread, step=0.25)
        (raised,) = out
        assert raised.retryable and worker.error is raised
        assert lasted <= clock.now() - started <= lasted + 0.5


def test_a_handler_that_cannot_take_one_message_is_refused() -> None:
    async def no_message() -> None:
        pass

    with pytest.raises(TypeError, match=r"AsyncWorker's handler .* cannot be called with one"):
        AsyncWorker(MemoryQueue(), no_message, renewer="thread")  # type: ignore[arg-type]
