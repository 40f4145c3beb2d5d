"""The journal the test tasks write: one line per event, appended by every worker
process (O_APPEND writes of one short line do not interleave), read by the tests.

A line is ``event label worker pid wall-time``; ``event`` is ``start``, ``end`` or
``fail``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import whole_lines


@dataclass(frozen=True)
class Entry:
    event: str
    label: str
    worker: str
    pid: int
    at: float


def write(path: str, event: str, label: str) -> None:
    worker = os.environ.get("LK_WORKER", "?")
    line = f"{event} {label} {worker} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read(path: Path) -> list[Entry]:
    entries = []
    for line in whole_lines(path):  # read while workers append to it
        event, label, worker, pid, at = line.split()
        entries.append(Entry(event, label, worker, int(pid), float(at)))
    return entries


def count(entries: list[Entry], event: str, label: str) -> int:
    return sum(1 for entry in entries if entry.event == event and entry.label == label)


GIL_HELD = 10.0  # seconds a busy task holds its GIL (issue 23: "holding the GIL 10 s")


def hold_gil(seconds: float) -> None:
    """Sit in C for ``seconds`` (whole) holding this process's GIL: a call through
    ctypes.PyDLL keeps the GIL (CDLL would release it), so no other thread of the
    process runs meanwhile - and no CPU is burnt on a shared machine."""
    import ctypes

    ctypes.PyDLL(None).sleep(ctypes.c_uint(round(seconds)))


def work(path: str, label: str, seconds: float, *, busy: bool, fail: bool) -> None:
    """A test task's body: journal its start, work, journal its end (or fail)."""
    write(path, "start", label)
    if busy:
        # The last 10 s (at most) in C holding the GIL; the rest asleep, so that the
        # other threads of the process (a Dramatiq worker's) get going first.
        held = min(seconds, GIL_HELD)
        time.sleep(seconds - held)
        hold_gil(held)
    else:
        time.sleep(seconds)
    if fail:
        write(path, "fail", label)
        raise RuntimeError(f"planned failure of {label}")
    write(path, "end", label)
