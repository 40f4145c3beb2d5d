"""Real worker processes for the framework tests: start, wait for, kill, stop, and
read their logs.

Each worker runs in a session of its own, so SIGKILL reaches its whole process group
(Celery's prefork children, Dramatiq's worker processes) at once, as when a machine
dies.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.services import CHILD_ENV, REPO

DEADLINE = 60.0  # generous: a loaded 2-core machine


def wait_for(what: str, condition: Callable[[], object], timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)


class WorkerProcess:
    """One worker command, its log file (``log``: ``{log}`` in the command is its path)
    and its console output (``out``)."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], folder: Path) -> None:
        self.name = name
        self.log = folder / f"{name}.log"
        self.out = folder / f"{name}.out"
        self.terminated = False
        full_env = {**os.environ, **CHILD_ENV, **env, "LK_WORKER": name}
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", *(part.replace("{log}", str(self.log)) for part in command)],
                cwd=str(REPO),
                env=full_env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def log_text(self) -> str:
        """What the worker logged to its log file (its ``{log}``)."""
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def console(self) -> str:
        """What it wrote to stdout and stderr."""
        return self.out.read_text(errors="replace") if self.out.exists() else ""

    def text(self) -> str:
        return self.log_text() + self.console()

    def wait_ready(self, marker: str) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"worker {self.name} exited with {self.proc.returncode}:\n{self.text()[-4000:]}"
                )
            return marker in self.text()

        wait_for(f"worker {self.name} to be ready", ready)

    def kill(self) -> None:
        """SIGKILL the worker's whole process group."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> None:
        """SIGTERM to the main process, once (a second one means hurry to both)."""
        if not self.terminated and self.proc.poll() is None:
            self.terminated = True
            self.proc.terminate()

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM to the worker's main process (a warm shutdown: it stops its own
        children), then SIGKILL after ``grace`` seconds. Returns the exit code when it
        stopped by itself."""
        if self.proc.poll() is None:
            self.terminate()
            try:
                return self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        return self.proc.returncode


def stop_all(workers: list[WorkerProcess], grace: float = 15.0) -> list[int | None]:
    """``stop`` them all at once; their exit codes."""
    for worker in workers:
        worker.terminate()
    return [worker.stop(grace) for worker in workers]


class WorkerSet:
    """The workers a test started; ``close()`` stops those still running."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.started: list[WorkerProcess] = []

    def start(self, name: str, command: list[str], env: dict[str, str]) -> WorkerProcess:
        worker = WorkerProcess(name, command, env, self.folder)
        self.started.append(worker)
        return worker

    def close(self) -> None:
        for worker in self.started:
            worker.kill()


# A log record starts with "[<date>"; the lines after it until the next belong to it.
_RECORD = re.compile(r"^\[\d{4}-\d\d-\d\d", re.MULTILINE)
_BAD = re.compile(r"\b(WARNING|ERROR|CRITICAL)\b|Traceback")


def log_records(text: str) -> list[str]:
    starts = [match.start() for match in _RECORD.finditer(text)]
    return [text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)]


def unexpected_records(text: str, expected: Iterable[str] = ()) -> list[str]:
    """The log records of ``text`` at WARNING or above, or carrying a traceback,
    except those that contain one of the ``expected`` substrings."""
    allowed = list(expected)
    return [
        record
        for record in log_records(text)
        if _BAD.search(record) and not any(word in record for word in allowed)
    ]
