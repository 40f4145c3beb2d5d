"""Shared pieces: result rows, sizes, percentiles, process metrics, child processes."""

from __future__ import annotations

import contextlib
import datetime
import itertools
import json
import logging
import math
import os
import platform
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from leasekeeper.backends.base import Backend, Message

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"
CHILD_MARKER = "BENCH-RESULT:"

# The one set of timeout settings every design is given (issue #7): an SQS-style
# 30 s visibility renewed when less than 10 s remain, checked at least every second.
VISIBILITY = 30.0
THRESHOLD = 10.0
TIMER_INTERVAL = 1.0
RENEW_EVERY = VISIBILITY - THRESHOLD  # a lease is renewed every 20 s in steady state


@dataclass
class Row:
    """One line of the results table."""

    measure: str
    leasekeeper: str
    baselines: str = ""
    ratio: str = ""
    target: str = ""
    met: bool | None = None  # None: the row carries no target
    note: str = ""


@dataclass
class BenchResult:
    name: str
    title: str
    rows: list[Row] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Context:
    quick: bool

    def pick(self, quick: Any, full: Any) -> Any:
        return quick if self.quick else full


# ---------------------------------------------------------------------- numbers


def percentile(samples: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ``samples`` (0 <= q <= 1); nan when empty."""
    if not samples:
        return math.nan
    ordered = sorted(samples)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    """A number with ``digits`` significant digits and its unit; "n/a" for None/nan."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if value == 0:
        text = "0"
    elif abs(value) >= 10 ** (digits - 1):
        text = f"{value:,.0f}"
    else:
        text = f"{value:.{digits}g}"
    return f"{text} {unit}".strip()


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or denominator is None or denominator == 0:
        return None
    if math.isnan(numerator) or math.isnan(denominator):
        return None
    return numerator / denominator


def fmt_ratio(value: float | None, what: str = "") -> str:
    if value is None:
        return "n/a"
    text = f"{value:.1f}x" if value < 100 else f"{value:,.0f}x"
    return f"{text} {what}".strip()


# ---------------------------------------------------------------------- process


def rss_bytes() -> int:
    """Current resident set size of this process (Linux /proc; ru_maxrss elsewhere)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def thread_limit() -> int | None:
    """How many threads this machine lets one process start, roughly (Linux)."""
    limits: list[int] = []
    for path in ("/proc/sys/kernel/threads-max", "/proc/sys/kernel/pid_max"):
        with contextlib.suppress(OSError, ValueError):
            limits.append(int(Path(path).read_text().strip()))
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY:
        limits.append(int(soft))
    return min(limits) if limits else None


def machine_info() -> dict[str, Any]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        load: list[float] | None = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    try:
        import importlib.metadata as md

        servicebus = md.version("azure-servicebus")
    except Exception:
        servicebus = None
    return {
        "cpu_model": cpu,
        "cores": os.cpu_count(),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_at_start": load,
        "thread_limit": thread_limit(),
        "azure_servicebus": servicebus,
    }


def quiet_logs() -> None:
    """Benchmarks overload designs on purpose; one warning per lapsed lease would flood
    the output (and cost time), so only errors are shown."""
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    for name in ("leasekeeper", "benchmarks", "azure"):
        logging.getLogger(name).setLevel(logging.ERROR)


class CountingHandler:
    """A no-op handler that says when it has run ``jobs`` times (``done``).

    A CPU benchmark waits on ``done`` rather than polling the worker's stats: a
    poll every 10 ms wakes the measured process 100 times a second, and each
    wake-up costs it 50-90 µs of CPU on these machines - at moto's 15-30
    messages a second, more than the worker's own cost a message."""

    def __init__(self, jobs: int) -> None:
        self.jobs = jobs
        self.done = threading.Event()
        self._runs = itertools.count(1)  # next() on it is atomic under the GIL

    def __call__(self, message: Message) -> None:
        if next(self._runs) >= self.jobs:
            self.done.set()


def wait_completed(worker: Any, handler: CountingHandler, timeout: float) -> None:
    """Wait until ``worker`` completed ``handler.jobs`` (their deletes answered) or
    ``timeout`` seconds passed: asleep until the last job ran, then polling only
    while its delete is in flight."""
    give_up = time.monotonic() + timeout
    handler.done.wait(timeout)
    while worker.stats.completed < handler.jobs and time.monotonic() < give_up:
        time.sleep(0.01)


def run_child(func: str, timeout: float = 600.0, **kwargs: Any) -> dict[str, Any]:
    """Run ``module:function(**kwargs)`` in a fresh interpreter and return its JSON result.

    Measures that count threads, CPU time or memory run in their own process so
    nothing another design left behind (threads, arenas, pools) skews them.
    """
    argv = [sys.executable, "-m", "benchmarks._child", func, json.dumps(kwargs)]
    started = time.monotonic()
    try:
        proc = subprocess.run(
            argv,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"{func} timed out after {timeout:.0f}s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(CHILD_MARKER):
            result: dict[str, Any] = json.loads(line[len(CHILD_MARKER) :])
            result.setdefault("child_seconds", round(time.monotonic() - started, 2))
            return result
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
    return {"error": f"{func} exited {proc.returncode}: " + " | ".join(tail)}


# ---------------------------------------------------------------------- messages


def synthetic_messages(
    backend: Backend, count: int, *, now: float, visibility: float, prefix: str = "s"
) -> list[Message]:
    """Messages that look received ``now`` with ``visibility`` left, made without a queue.

    For measures where no backend call ever happens (memory, idle CPU): building
    100,000 messages through a queue would only slow the run down.
    """
    return [
        Message(
            id=f"{prefix}-{i}",
            body="",
            receipt=f"r-{i}",
            backend=backend,
            received_at=now,
            visibility_timeout=visibility,
        )
        for i in range(count)
    ]


def received_messages(backend: Backend, count: int, visibility: float) -> list[Message]:
    """``count`` real messages: sent to the queue behind ``backend`` and received through it."""
    inner: Any = getattr(backend, "inner", backend)
    send_many = inner.send_many
    send_many(["x"] * count)
    out: list[Message] = []
    while len(out) < count:
        got = backend.receive(max_messages=count - len(out), visibility_timeout=visibility)
        if not got:
            raise RuntimeError("queue ran dry while preparing messages")
        out.extend(got)
    return out


def yes_no(met: bool | None) -> str:
    if met is None:
        return "-"
    return "yes" if met else "**NO - missed**"


def join_nonempty(parts: Iterable[str], sep: str = "; ") -> str:
    return sep.join(p for p in parts if p)


MOTO_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def sqs_client(endpoint: str) -> Any:
    """A boto3 SQS client of moto's server at ``endpoint`` (its dummy credentials)."""
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@contextlib.contextmanager
def moto_server(
    timeout: float = 30.0, command: Callable[[int], list[str]] | None = None
) -> Iterator[str]:
    """moto's SQS server as a process of its own on a free loopback port, ready to
    answer; yields its endpoint. ``command(port)``: the arguments after the
    interpreter that start another server of moto's kind (the journaling one)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = ["-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    proc = subprocess.Popen(
        [sys.executable, *(args if command is None else command(port))],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **MOTO_ENV},
        cwd=str(REPO_ROOT),
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        admin = sqs_client(endpoint)
        deadline = time.monotonic() + timeout
        while True:
            try:
                admin.list_queues()
                break
            except Exception:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait()
