"""Measure 8: the renewer in another process, against the renewer thread.

Rows, thread vs process, in one run:

1. register+complete round trip: what the process renewer's IPC costs. The
   backend answers at once (``benchmarks.nullq``), so what is timed is the lease
   machinery: in process mode a frame to the renewer (register), and for the
   complete a frame (``Drop``) and the delete, made in the worker while the renewer
   still holds the lease back - no round trip. Target: process p50 under 100 µs.
1b. the same at 8 handler threads at once (pairs a second, all threads together),
   and a ``Worker`` of 8 handler threads running no-op jobs off a queue that
   answers at once (messages a second, receive to delete): the worst case for
   the process renewer, whose cost is all IPC. ``Worker`` and ``AsyncWorker``
   renew in a process by default (``renewer="auto"``) when the worker's
   throughput there is within 2x of the thread renewer's (issue 24); the ratios
   come from this one run. Target: within 2x; and register+complete at 8 threads at
   least a third of the thread renewer's rate (issue 31).
1c. start-up of the renewer process, from asking for it to its "serving": with the
   null backend (leasekeeper's own part) and with SQS (the renewer imports boto3
   and builds its client). Target: under 1 s.
2. lapses with a handler holding the GIL for 3x the visibility timeout: 5 leases
   at 2 s on the local MNS server (run as its own process, so the held GIL holds
   nothing the service needs); counted are the lapses the manager reports and the
   messages another consumer could receive meanwhile. Goal: 0 in process mode.
3. failover after SIGKILL at visibility 30 s: a worker process holds 20 leases and
   is killed; timed is how long until another consumer has received all 20. In
   process mode the renewer sees the death at once and releases them; in thread
   mode nothing can until the 30 s run out (measured in the full run).
"""

from __future__ import annotations

import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.common import (
    MOTO_ENV,
    REPO_ROOT,
    BenchResult,
    Context,
    Row,
    fmt,
    fmt_ratio,
    moto_server,
    percentile,
    ratio,
    run_child,
    sqs_client,
)
from benchmarks.nullq import NullBackend
from leasekeeper import LeaseManager

NAME = "renewer"
TITLE = "8. renewer thread vs process"
TARGET_ROUND_TRIP_US = 100.0
TARGET_WORKER_RATIO = 2.0  # within this, Worker and AsyncWorker renew in a process by default
TARGET_STARTUP_S = 1.0
TARGET_PAIRS_RATIO = 3.0  # register+complete at 8 threads: process >= 1/3 of thread (issue 31)
HANDLER_THREADS = 8
GIL_VISIBILITY = 2.0
FAILOVER_VISIBILITY = 30.0
ACCESS = {"MNS_ACCESS_KEY_ID": "test-id", "MNS_ACCESS_KEY_SECRET": "test-key"}


# ---------------------------------------------------------------------- 1. IPC


def round_trips(mode: str, pairs: int) -> dict[str, Any]:
    backend = NullBackend()
    manager = LeaseManager(backend, renewer=mode, visibility_timeout=60)  # type: ignore[arg-type]
    messages = backend.receive(max_messages=pairs + 200, visibility_timeout=60)
    samples: list[int] = []
    for message in messages[:200]:  # warm-up
        manager.register(message).complete()
    for message in messages[200:]:
        t0 = time.perf_counter_ns()
        manager.register(message).complete()
        samples.append(time.perf_counter_ns() - t0)
    manager.close()
    return {"p50_us": percentile(samples, 0.5) / 1000, "p99_us": percentile(samples, 0.99) / 1000}


def concurrent_pairs(mode: str, pairs: int, threads: int = 8) -> dict[str, Any]:
    """``threads`` handler threads, each registering and completing ``pairs / threads``
    leases one after another: pairs a second, all threads together."""
    import threading

    backend = NullBackend()
    manager = LeaseManager(backend, renewer=mode, visibility_timeout=60)  # type: ignore[arg-type]
    per_thread = pairs // threads
    batches = [
        backend.receive(max_messages=per_thread, visibility_timeout=60) for _ in range(threads)
    ]
    for message in backend.receive(max_messages=200, visibility_timeout=60):  # warm-up
        manager.register(message).complete()
    start = threading.Barrier(threads + 1)

    def run(messages: list[Any]) -> None:
        start.wait()
        for message in messages:
            manager.register(message).complete()

    workers = [threading.Thread(target=run, args=(batch,)) for batch in batches]
    for worker in workers:
        worker.start()
    start.wait()
    cpu0 = _cpu(_renewer_process(manager))
    t0 = time.perf_counter()
    for worker in workers:
        worker.join()
    took = time.perf_counter() - t0
    manager.close()  # the renewer process exits: its CPU is counted once it did
    worker_cpu, child_cpu = (after - before for after, before in zip(_cpu(), cpu0, strict=True))
    per_1000 = 1000.0 / (per_thread * threads)
    return {
        "pairs_per_s": per_thread * threads / took,
        "threads": threads,
        "cpu_ms_per_1000": (worker_cpu + child_cpu) * 1000 * per_1000,
        "child_cpu_ms_per_1000": child_cpu * 1000 * per_1000,
    }


def _renewer_process(manager: Any) -> int:
    """The pid of ``manager``'s renewer process; 0 for a thread renewer."""
    return int(manager.renewer_pid) if manager.renewer.name == "process" else 0


def _cpu(renewer_pid: int = 0) -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its children: those that
    exited (the renewer process, once its manager closed) and the renewer
    ``renewer_pid`` while it runs (so its start-up can be taken off)."""
    import resource

    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    running = 0.0
    if renewer_pid:
        with contextlib.suppress(OSError), open(f"/proc/{renewer_pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
            running = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return me.ru_utime + me.ru_stime, children.ru_utime + children.ru_stime + running


class FiniteNull(NullBackend):
    """The null backend with ``jobs`` messages on its queue, then none."""

    def __init__(self, jobs: int) -> None:
        super().__init__()
        self.left = jobs

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Any]:
        n = min(max_messages, self.left)
        self.left -= n
        return super().receive(n, wait_seconds, visibility_timeout) if n else []


def worker_throughput(mode: str, jobs: int, concurrency: int = 8) -> dict[str, Any]:
    """A Worker of ``concurrency`` handler threads running ``jobs`` no-op jobs off a
    queue that answers at once: messages a second, first receive to last delete."""
    from leasekeeper import Worker

    backend = FiniteNull(jobs)
    done = 0

    def handler(message: Any) -> None:
        pass

    worker = Worker(
        backend,  # type: ignore[arg-type]
        handler,
        concurrency=concurrency,
        wait_seconds=0.05,
        renewer=mode,  # type: ignore[arg-type]
        visibility_timeout=60,
    )
    manager = worker.manager
    manager.start()  # (returns at once where the renewer serves since construction)
    cpu0 = _cpu(_renewer_process(manager))  # its start-up not counted: a message's cost
    t0 = time.perf_counter()
    stats = worker.run(until_idle=0.3)
    took = time.perf_counter() - t0 - 0.3  # less the idle wait that ends the run
    worker_cpu, child_cpu = (after - before for after, before in zip(_cpu(), cpu0, strict=True))
    done = stats.completed
    return {
        "messages_per_s": done / took,
        "completed": done,
        "of": jobs,
        "cpu_ms_per_1000": (worker_cpu + child_cpu) * 1e6 / max(done, 1),
        "child_cpu_ms_per_1000": child_cpu * 1e6 / max(done, 1),
    }


def startup(service: str, tries: int = 5) -> dict[str, Any]:
    """Seconds from asking for a renewer process (``LeaseManager(...)``) to the
    manager's return, which waits until the renewer has built its backend and
    renews - what a worker waits for before its first receive. The median of
    ``tries``, in a fresh interpreter whose renewer imports what the service needs."""
    if service == "null":
        return _startup_samples(NullBackend, tries)
    os.environ.update(MOTO_ENV)
    with moto_server() as endpoint:
        url = sqs_client(endpoint).create_queue(QueueName="startup")["QueueUrl"]
        backend = _sqs_backend(url)
        return _startup_samples(lambda: backend, tries)


def _startup_samples(backend: Callable[[], Any], tries: int) -> dict[str, Any]:
    """Wall seconds until serving, and the renewer process's own CPU seconds: at
    serving (read from /proc while it runs) and in all, once reaped at close."""
    serving: list[float] = []
    cpu_serving: list[float] = []
    cpu_total: list[float] = []
    for _ in range(tries):
        reaped = _cpu()[1]
        t0 = time.perf_counter()
        manager = LeaseManager(backend(), renewer="process")
        manager.start()  # returns at once: the constructor waited for the renewer
        serving.append(time.perf_counter() - t0)
        cpu_serving.append(_cpu(_renewer_process(manager))[1] - reaped)
        manager.close()
        cpu_total.append(_cpu()[1] - reaped)
    return {
        "serving_seconds": statistics.median(serving),
        "child_cpu_serving_seconds": statistics.median(cpu_serving),
        "child_cpu_total_seconds": statistics.median(cpu_total),
        "tries": tries,
    }


# ---------------------------------------------------------------------- the MNS server


@contextlib.contextmanager
def mns_service(visibility: float) -> Iterator[str]:
    """The local MNS server as its own process, with queue "q"; yields its endpoint."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "leasekeeper.testing.mns_server", "--queue", "q",
         "--visibility-timeout", str(int(visibility)), "--log-level", "WARNING"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        yield proc.stdout.readline().strip()
    finally:
        proc.terminate()
        proc.wait()


def _queue(endpoint: str) -> Any:
    from mns.account import Account

    return Account(
        endpoint, ACCESS["MNS_ACCESS_KEY_ID"], ACCESS["MNS_ACCESS_KEY_SECRET"]
    ).get_queue("q")


def _send(endpoint: str, n: int) -> None:
    from mns.queue import Message as MNSMessage

    queue = _queue(endpoint)
    for i in range(n):
        queue.send_message(MNSMessage(f"job {i}"))


def _backend(endpoint: str) -> Any:
    from leasekeeper.backends.mns import MNSBackend

    return MNSBackend(_queue(endpoint))


def _receive(
    backend: Any, n: int, visibility: float, timeout: float = 30.0, *, long_poll: bool = True
) -> list[Any]:
    """Receive ``n`` messages. ``long_poll=False``: short polls 20 ms apart - moto's
    long poll does not see a message made visible during its wait (it answers at the
    end of the wait), which would add up to a second to a failover it times."""
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(got) < n and time.monotonic() < deadline:
        batch = backend.receive(
            max_messages=min(n - len(got), getattr(backend, "max_receive", 10)),
            wait_seconds=1 if long_poll else 0,
            visibility_timeout=visibility,
        )
        got += batch
        if not batch and not long_poll:
            time.sleep(0.02)
    return got


# ---------------------------------------------------------------------- 2. the GIL


def hold_the_gil(seconds: float) -> None:
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 5.0)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    finally:
        sys.setswitchinterval(previous)


def gil_trial(mode: str) -> dict[str, Any]:
    os.environ.update(ACCESS)
    with mns_service(30) as endpoint:
        _send(endpoint, 5)
        backend = _backend(endpoint)
        manager = LeaseManager(
            backend,
            renewer=mode,  # type: ignore[arg-type]
            visibility_timeout=GIL_VISIBILITY,
            timer_interval=0.2,
            minimal_life=0.5,
        )
        leases = [manager.register(m) for m in _receive(backend, 5, GIL_VISIBILITY)]
        hold_the_gil(3 * GIL_VISIBILITY)
        taken = len(_backend(endpoint).receive(max_messages=5, visibility_timeout=30))
        completed = 0
        for lease in leases:
            with contextlib.suppress(Exception):
                lease.complete()
                completed += 1
        stats = manager.stats()
        manager.close()
        return {"lapses": stats.lapses, "taken": taken, "completed": completed, "of": len(leases)}


# ---------------------------------------------------------------------- 3. failover


def worker(where: str, mode: str, count: int) -> None:
    """The worker process: lease ``count`` messages, say so, hold until killed.
    ``where``: an SQS queue URL (moto), or the MNS server's endpoint."""
    backend = _sqs_backend(where) if "/" in where.split("//", 1)[1] else _backend(where)
    manager = LeaseManager(backend, renewer=mode, visibility_timeout=FAILOVER_VISIBILITY)  # type: ignore[arg-type]
    for message in _receive(backend, count, FAILOVER_VISIBILITY):
        manager.register(message)
    print("LEASED", flush=True)
    while True:
        time.sleep(3600)


def _sqs_backend(url: str) -> Any:
    from leasekeeper.backends.sqs import SQSBackend

    return SQSBackend(sqs_client(url.rsplit("/", 2)[0]), url)


@contextlib.contextmanager
def _failover_queue(service: str, count: int) -> Iterator[str]:
    """A queue of ``count`` messages on ``service``; yields where the worker finds it."""
    if service == "mns":
        with mns_service(FAILOVER_VISIBILITY) as endpoint:
            _send(endpoint, count)
            yield endpoint
        return
    with moto_server() as endpoint:
        admin = sqs_client(endpoint)
        url: str = admin.create_queue(
            QueueName="failover", Attributes={"VisibilityTimeout": str(int(FAILOVER_VISIBILITY))}
        )["QueueUrl"]
        for start in range(0, count, 10):
            admin.send_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "MessageBody": f"job {i}"}
                    for i in range(start, min(count, start + 10))
                ],
            )
        yield url


def failover_trial(mode: str, service: str = "sqs", count: int = 20) -> dict[str, Any]:
    os.environ.update(ACCESS)
    os.environ.update(MOTO_ENV)  # the renewer process takes its credentials from here
    with _failover_queue(service, count) as where:
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.bench_renewer", where, mode, str(count)],
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            if proc.stdout.readline().strip() != "LEASED":
                raise RuntimeError("the worker did not lease its messages")
            consumer = _sqs_backend(where) if service == "sqs" else _backend(where)
            os.kill(proc.pid, signal.SIGKILL)
            killed = time.monotonic()
            got = _receive(
                consumer, count, 60, timeout=FAILOVER_VISIBILITY + 15, long_poll=service == "mns"
            )
            took = time.monotonic() - killed
            return {"received": len(got), "of": count, "seconds": took}
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


# ---------------------------------------------------------------------- report


def _cost_rows(
    result: BenchResult,
    concurrent: dict[str, dict[str, Any]],
    throughput: dict[str, dict[str, Any]],
    starts: dict[str, dict[str, Any]],
) -> None:
    """The rows that decide the workers' default renewer, and its start-up."""

    def rate(figures: dict[str, Any], key: str, mode: str) -> str:
        if key not in figures:
            return f"{mode}: error ({figures.get('error', '?')})"
        cpu = figures.get("cpu_ms_per_1000")
        if cpu is None:
            return f"{mode}: {figures[key]:,.0f}/s"
        child = figures.get("child_cpu_ms_per_1000", 0.0)
        return f"{mode}: {figures[key]:,.0f}/s, CPU {cpu:.0f} ms a 1,000" + (
            f" (renewer process {child:.0f} ms)" if child else ""
        )

    pairs = {mode: figures.get("pairs_per_s") for mode, figures in concurrent.items()}
    slower = ratio(pairs["thread"], pairs["process"])
    result.rows.append(
        Row(
            measure=(
                f"register+complete at {HANDLER_THREADS} handler threads, answering backend "
                "(pairs a second, all threads)"
            ),
            leasekeeper=rate(concurrent["process"], "pairs_per_s", "process"),
            baselines=rate(concurrent["thread"], "pairs_per_s", "thread"),
            ratio=fmt_ratio(slower, "the thread renewer's rate"),
            target=f"process at least 1/{TARGET_PAIRS_RATIO:g} of the thread renewer's rate",
            met=slower is not None and slower <= TARGET_PAIRS_RATIO,
            note=(
                "a complete is a frame and the worker's own delete while the renewer holds "
                "the lease back; the thread renewer's rate here moves 5-10x between runs: "
                "lock convoys among 8 threads on 2 cores, which it escapes in some runs "
                "(measure 14, fifth pass)"
            ),
        )
    )
    cost = ratio(
        throughput["thread"].get("messages_per_s"), throughput["process"].get("messages_per_s")
    )
    result.rows.append(
        Row(
            measure=(
                f"Worker throughput, {HANDLER_THREADS} handler threads, no-op jobs, answering "
                "backend (messages a second)"
            ),
            leasekeeper=rate(throughput["process"], "messages_per_s", "process"),
            baselines=rate(throughput["thread"], "messages_per_s", "thread"),
            ratio=fmt_ratio(cost, "the thread renewer's rate"),
            target=(
                f"process within {TARGET_WORKER_RATIO:g}x: then Worker and AsyncWorker renew "
                "in a process by default"
            ),
            met=cost is not None and cost <= TARGET_WORKER_RATIO,
        )
    )

    def start_cell(service: str) -> str:
        figures = starts[service]
        if "serving_seconds" not in figures:
            return f"{service}: error ({figures.get('error', '?')})"
        cpu = figures.get("child_cpu_serving_seconds")
        total = figures.get("child_cpu_total_seconds")
        spent = f" (its CPU {fmt(cpu, 's')} until then, {fmt(total, 's')} in all)"
        spent = "" if cpu is None else spent
        return f"{service}: renewing {fmt(figures['serving_seconds'], 's')}{spent}"

    result.rows.append(
        Row(
            measure=(
                "renewer process start-up: until the manager is constructed, its renewer "
                "renewing (median of 5, fresh process)"
            ),
            leasekeeper=start_cell("null") + "; " + start_cell("sqs"),
            baselines="thread: none",
            target=f"both < {TARGET_STARTUP_S:g} s",
            met=all(
                figures.get("serving_seconds", 99.0) < TARGET_STARTUP_S
                for figures in starts.values()
            ),
            note=(
                "an SQS client with fixed keys on the lean path: the renewer renews on that "
                "path alone, without botocore (else it imports botocore and builds its "
                "client); the constructor waits for it, so nothing is received or registered "
                "before"
            ),
        )
    )


def _trip(mode: str, figures: dict[str, Any]) -> str:
    return f"{mode}: p50 {fmt(figures['p50_us'], 'µs')}, p99 {fmt(figures['p99_us'], 'µs')}"


def run(ctx: Context) -> BenchResult:
    result = BenchResult(NAME, TITLE)
    pairs = ctx.pick(1000, 5000)
    trips = {
        m: run_child("benchmarks.bench_renewer:round_trips", mode=m, pairs=pairs)
        for m in ("thread", "process")
    }
    jobs = ctx.pick(5000, 20000)
    concurrent = {
        m: run_child(
            "benchmarks.bench_renewer:concurrent_pairs", mode=m, pairs=jobs, threads=HANDLER_THREADS
        )
        for m in ("thread", "process")
    }
    throughput = {
        m: run_child(
            "benchmarks.bench_renewer:worker_throughput",
            mode=m,
            jobs=jobs,
            concurrency=HANDLER_THREADS,
        )
        for m in ("thread", "process")
    }
    starts = {s: run_child("benchmarks.bench_renewer:startup", service=s) for s in ("null", "sqs")}
    gil = {
        m: run_child("benchmarks.bench_renewer:gil_trial", mode=m) for m in ("thread", "process")
    }
    modes = ("process", "thread") if not ctx.quick else ("process",)
    failover = {
        m: run_child("benchmarks.bench_renewer:failover_trial", mode=m, timeout=120) for m in modes
    }
    # MNS cannot make a message visible sooner than 1 s (ChangeMessageVisibility
    # refuses 0), so its row shows that floor plus leasekeeper's part.
    mns_failover = run_child(
        "benchmarks.bench_renewer:failover_trial", mode="process", service="mns", timeout=120
    )
    result.figures = {
        "round_trip": trips,
        "concurrent_pairs": concurrent,
        "worker_throughput": throughput,
        "startup": starts,
        "gil": gil,
        "failover": failover,
        "failover_mns": mns_failover,
    }

    thread, process = trips["thread"], trips["process"]
    if "p50_us" in process and "p50_us" in thread:
        result.rows.append(
            Row(
                measure="register+complete round trip, answering backend (per pair)",
                leasekeeper=_trip("process", process),
                baselines=_trip("thread", thread),
                ratio=f"IPC adds {fmt(process['p50_us'] - thread['p50_us'], 'µs')} at p50",
                target=f"process p50 < {TARGET_ROUND_TRIP_US:g} µs",
                met=process["p50_us"] < TARGET_ROUND_TRIP_US,
            )
        )

    _cost_rows(result, concurrent, throughput, starts)

    def gil_cell(mode: str) -> str:
        g = gil[mode]
        if "error" in g:
            return f"{mode}: error ({g['error']})"
        return (
            f"{mode}: {g['lapses']} lapses, {g['taken']} taken by another consumer, "
            f"{g['completed']} of {g['of']} completed"
        )

    result.rows.append(
        Row(
            measure=(
                f"handler holding the GIL {3 * GIL_VISIBILITY:g} s at visibility "
                f"{GIL_VISIBILITY:g} s (5 leases, MNS)"
            ),
            leasekeeper=gil_cell("process"),
            baselines=gil_cell("thread"),
            target="0 lapses in process mode",
            met=gil["process"].get("lapses") == 0 and gil["process"].get("taken") == 0,
        )
    )

    def failover_cell(mode: str) -> str:
        f = failover.get(mode)
        if f is None:
            return f"{mode}: bounded by the {FAILOVER_VISIBILITY:g} s timeout (not run in --quick)"
        if "error" in f:
            return f"{mode}: error ({f['error']})"
        return f"{mode}: {f['received']} of {f['of']} back after {fmt(f['seconds'], 's')}"

    fp = failover["process"]
    result.rows.append(
        Row(
            measure=(
                f"failover after SIGKILL, 20 leases at visibility {FAILOVER_VISIBILITY:g} s "
                "(SQS on moto)"
            ),
            leasekeeper=failover_cell("process"),
            baselines=failover_cell("thread"),
            target="process: all back in < 1 s",
            met=fp.get("received") == fp.get("of") and fp.get("seconds", 99.0) < 1.0,
        )
    )
    failover["process"] = mns_failover
    result.rows.append(
        Row(
            measure=(
                f"failover after SIGKILL, 20 leases at visibility {FAILOVER_VISIBILITY:g} s "
                "(MNS: a release is a visibility of at least 1 s there)"
            ),
            leasekeeper=failover_cell("process"),
            baselines=(
                f"the service's floor: 1 s; thread: bounded by the {FAILOVER_VISIBILITY:g} s "
                "timeout"
            ),
        )
    )
    return result


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
