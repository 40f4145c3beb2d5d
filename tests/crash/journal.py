"""The crash tests' journal: what every worker process did, in one append-only file.

Workers write it (``Journal``); the test reads it back (``read_journal``) and
decides, together with its own kill log, which duplicates the crashes made
unavoidable (``analyse``).

One line per event, ``<worker> <pid> <wall time> <event> <message id or ->``,
written with a single ``write`` on a file opened with ``O_APPEND`` and
``fsync``-ed at once, so several processes may append to it, and a line that
was written survives the SIGKILL that follows it.

Events (``<id>`` is the service's message id):

========  ================================================================
go        the worker got the test's go-ahead and starts receiving
recv      a receive returned the message (the worker now holds it)
start     the handler started on it
done      the handler finished its work on it (written before the delete)
deleted   the delete call answered "ok": the service confirmed the deletion
delfail   the delete call answered something else (the detail follows)
released  the message was released (a shutdown)
lost      leasekeeper reported the lease lost (``on_lost``)
kill      the worker is about to SIGKILL itself at a kill point (``arg`` is
          the kill point, the message ids it holds at that call follow)
exit      the worker stopped normally (its stats follow)
========  ================================================================
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import whole_lines

EVENTS = frozenset(
    {"go", "recv", "start", "done", "deleted", "delfail", "released", "lost", "kill", "exit"}
)

_PER_MESSAGE = frozenset({"recv", "start", "done", "deleted", "delfail", "released", "lost"})


class Journal:
    """Appends events to the journal file; safe to use from several threads."""

    def __init__(self, path: str | os.PathLike[str], worker: int) -> None:
        self._fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._worker = worker
        self._pid = os.getpid()
        self._lock = threading.Lock()

    def write(self, event: str, arg: str = "-", *extra: str) -> None:
        if event not in EVENTS:
            raise ValueError(f"unknown journal event {event!r}")
        fields = [str(self._worker), str(self._pid), f"{time.time():.6f}", event, arg, *extra]
        line = (" ".join(fields) + "\n").encode()
        with self._lock:  # one write per line; the fsync makes it survive the SIGKILL
            os.write(self._fd, line)
            os.fsync(self._fd)

    def close(self) -> None:
        os.close(self._fd)


@dataclass(frozen=True)
class Entry:
    worker: int
    pid: int
    at: float
    event: str
    arg: str
    extra: tuple[str, ...]


def read_journal(path: Path) -> list[Entry]:
    entries: list[Entry] = []
    for number, line in enumerate(whole_lines(path), 1):  # read while workers append
        parts = line.split()
        if len(parts) < 5 or parts[3] not in EVENTS:
            raise AssertionError(f"{path}:{number}: malformed journal line {line!r}")
        entries.append(
            Entry(
                int(parts[0]), int(parts[1]), float(parts[2]), parts[3], parts[4], tuple(parts[5:])
            )
        )
    return entries


@dataclass
class Analysis:
    """What the journal and the kill log say about every message.

    A *duplicate* is a "done" beyond a message's first. It is *unavoidable* when
    the worker that wrote an earlier "done" was SIGKILLed before its delete was
    confirmed ("deleted"): the crash came after the work and before the
    deletion, so the message had to come back and be processed again. It is
    explained by *load* when a surviving worker was told its lease was lost
    (a lapse: the scheduler was too late to extend, and the message was
    received again). Anything else is *unexplained*: a leasekeeper bug.
    """

    sent: list[str]
    dones: dict[str, list[int]] = field(default_factory=dict)  # id -> workers, in order
    receives: Counter[str] = field(default_factory=Counter)
    starts: Counter[str] = field(default_factory=Counter)
    duplicates: dict[str, int] = field(default_factory=dict)
    unavoidable: dict[str, int] = field(default_factory=dict)
    load: dict[str, int] = field(default_factory=dict)
    unexplained: dict[str, int] = field(default_factory=dict)
    never_done: list[str] = field(default_factory=list)
    unknown_ids: list[str] = field(default_factory=list)
    done_without_start: list[tuple[int, str]] = field(default_factory=list)
    done_after_deleted: list[str] = field(default_factory=list)
    # per killed worker: the messages it held (received, not confirmed deleted)
    held_at_kill: dict[int, list[str]] = field(default_factory=dict)
    # per killed worker: messages it had finished ("done") but not confirmed deleted
    orphaned_at_kill: dict[int, list[str]] = field(default_factory=dict)
    # per worker that killed itself: (kill point, the message ids of the fatal call)
    self_kills: dict[int, tuple[str, list[str]]] = field(default_factory=dict)
    # per worker that stopped normally: its Worker and LeaseManager stats
    exit_stats: dict[int, dict[str, Any]] = field(default_factory=dict)

    @property
    def total_duplicates(self) -> int:
        return sum(self.duplicates.values())

    def problems(self) -> list[str]:
        out: list[str] = []
        if self.never_done:
            out.append(f"messages never processed (lost): {self.never_done}")
        if self.unknown_ids:
            out.append(f"messages in the journal that were never sent: {self.unknown_ids}")
        if self.done_without_start:
            out.append(f"'done' without a 'start' in the same worker: {self.done_without_start}")
        if self.done_after_deleted:
            out.append(
                "processed again after a worker had its delete confirmed: "
                f"{self.done_after_deleted}"
            )
        if self.unexplained:
            out.append(
                "duplicates no crash explains (a done, then another done, with no kill "
                f"between the first one and its delete): {self.unexplained}"
            )
        return out


def analyse(entries: Iterable[Entry], sent: list[str], killed: Iterable[int]) -> Analysis:
    """Classify every message's processing from the journal and the killed workers."""
    killed_workers = set(killed)
    result = Analysis(sent=list(sent))
    sent_set = set(sent)
    started: dict[int, set[str]] = defaultdict(set)
    deleted_by: dict[int, set[str]] = defaultdict(set)
    received_by: dict[int, set[str]] = defaultdict(set)
    done_by: dict[int, set[str]] = defaultdict(set)
    lost_by: dict[int, set[str]] = defaultdict(set)
    confirmed_deleted: set[str] = set()
    unknown: set[str] = set()
    for entry in entries:
        mid = entry.arg
        if entry.event in _PER_MESSAGE and mid not in sent_set:
            unknown.add(mid)
            continue
        if entry.event == "recv":
            result.receives[mid] += 1
            received_by[entry.worker].add(mid)
        elif entry.event == "start":
            result.starts[mid] += 1
            started[entry.worker].add(mid)
        elif entry.event == "done":
            if mid not in started[entry.worker]:
                result.done_without_start.append((entry.worker, mid))
            if mid in confirmed_deleted:
                result.done_after_deleted.append(mid)
            result.dones.setdefault(mid, []).append(entry.worker)
            done_by[entry.worker].add(mid)
        elif entry.event == "deleted":
            deleted_by[entry.worker].add(mid)
            confirmed_deleted.add(mid)
        elif entry.event == "lost":
            lost_by[entry.worker].add(mid)
        elif entry.event == "kill":
            result.self_kills[entry.worker] = (entry.arg, list(entry.extra))
        elif entry.event == "exit":
            result.exit_stats[entry.worker] = json.loads(entry.extra[0]) if entry.extra else {}
    result.unknown_ids = sorted(unknown)
    for worker in sorted(killed_workers):
        result.held_at_kill[worker] = sorted(received_by[worker] - deleted_by[worker])
        result.orphaned_at_kill[worker] = sorted(done_by[worker] - deleted_by[worker])
    for mid in sent:
        workers = result.dones.get(mid, [])
        if not workers:
            result.never_done.append(mid)
            continue
        extra = len(workers) - 1
        if extra <= 0:
            continue
        result.duplicates[mid] = extra
        # Every "done" but the last must have been followed by the message coming back.
        earlier = workers[:-1]
        crash = sum(1 for w in earlier if w in killed_workers and mid not in deleted_by[w])
        lapse = sum(1 for w in earlier if w not in killed_workers and mid in lost_by[w])
        unavoidable = min(extra, crash)
        load = min(extra - unavoidable, lapse)
        if unavoidable:
            result.unavoidable[mid] = unavoidable
        if load:
            result.load[mid] = load
        if extra - unavoidable - load:
            result.unexplained[mid] = extra - unavoidable - load
    return result
