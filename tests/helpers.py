"""Test doubles and helpers shared by the tests."""

from __future__ import annotations

import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from leasekeeper import Handle, Outcome
from leasekeeper.backends.base import ForwardingBackend
from leasekeeper.backends.memory import MemoryQueue

Plan = Outcome | BaseException | str  # "malformed": answer with the wrong number of entries


class ScriptedBackend(ForwardingBackend):
    """Wraps a MemoryQueue; a test scripts what the next calls answer, or blocks them.

    ``script("extend", Outcome("retry"), Outcome("retry"))`` makes the next two extend
    calls answer "retry" for every entry without reaching the queue; an exception in
    the script is raised by the call. ``hold("extend")`` makes the next extend call
    wait until ``let_go("extend")``; ``entered["extend"]`` is set while it waits.
    """

    inner: MemoryQueue

    def __init__(self, inner: MemoryQueue) -> None:
        super().__init__(inner)
        self.calls: list[tuple[str, list[str], float]] = []
        self._plans: dict[str, deque[Plan]] = defaultdict(deque)
        self._gates: dict[str, threading.Event] = {}
        self.entered: dict[str, threading.Event] = defaultdict(threading.Event)

    def script(self, operation: str, *plans: Plan) -> None:
        self._plans[operation].extend(plans)

    def hold(self, operation: str) -> None:
        self._gates[operation] = threading.Event()

    def let_go(self, operation: str) -> None:
        self._gates.pop(operation).set()

    def calls_of(self, operation: str) -> list[tuple[str, list[str], float]]:
        return [c for c in self.calls if c[0] == operation]

    def _run(self, operation: str, handles: Sequence[Handle], arg: float) -> list[Outcome] | None:
        self.calls.append((operation, [h.message_id for h in handles], arg))
        gate = self._gates.get(operation)
        if gate is not None:
            self.entered[operation].set()
            assert gate.wait(10), f"{operation} held for more than 10 s"
        if self._plans[operation]:
            plan = self._plans[operation].popleft()
            if isinstance(plan, BaseException):
                raise plan
            if plan == "malformed":
                return []
            assert isinstance(plan, Outcome)
            return [plan] * len(handles)
        return None

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        scripted = self._run("extend", handles, timeout)
        return super().extend(handles, timeout) if scripted is None else scripted

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        scripted = self._run("delete", handles, 0.0)
        return super().delete(handles) if scripted is None else scripted

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        scripted = self._run("release", handles, delay)
        return super().release(handles, delay) if scripted is None else scripted


def whole_lines(path: Path) -> list[str]:
    """The lines of a file other processes append to, each ended by its newline.

    Linux does not make a read of a regular file atomic with a write to it, so a
    read that overlaps an append can end in part of a line. That part is left out;
    the next read has it whole. A missing file has no lines.
    """
    if not path.exists():
        return []
    return path.read_text().split("\n")[:-1]


def renewed_twice_then_completed(manager: Any, message: Any, within: float = 30.0) -> None:
    """Register ``message`` with ``manager``, wait (up to ``within`` seconds, on a
    loaded machine) until its lease is renewed twice, complete it, and check that
    nothing was lost or lapsed. Polls every 0.1 s: the renewals are another
    thread's or process's, against a real service."""
    from leasekeeper import LeaseState

    lease = manager.register(message)
    deadline = time.monotonic() + within
    active = lease.state is LeaseState.ACTIVE
    while lease.extensions < 2 and active and time.monotonic() < deadline:
        time.sleep(0.1)
        active = lease.state is LeaseState.ACTIVE
    assert lease.extensions >= 2, (lease.state, manager.stats())
    lease.complete()
    stats = manager.stats()
    assert (stats.completed, stats.lost, stats.lapses) == (1, 0, 0)


def hold_the_gil(seconds: float) -> None:
    """Keep every other thread of this process off the CPU for ``seconds``, as a
    C call that never releases the GIL (a big regex, a sort) would."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(seconds + 5.0)
    try:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
    finally:
        sys.setswitchinterval(previous)


# ---------------------------------------------------------------- SVG text boxes

_NARROW = set("ijlft.,:;'!|()[] ")
_WIDE = set("mwMW@%")


def text_width(text: str, size: float, *, bold: bool = False) -> float:
    """An estimate of ``text``'s width in a sans-serif font of ``size`` px, from
    Helvetica's proportions (narrow letters and spaces ~0.3 em, wide ones ~0.85 em,
    capitals ~0.68 em, digits and other letters ~0.56 em), a little generous."""
    em = 0.0
    for char in text:
        if char in _NARROW:
            em += 0.3
        elif char in _WIDE:
            em += 0.85
        elif char.isupper():
            em += 0.68
        else:
            em += 0.56
    return em * size * (1.08 if bold else 1.0)


def svg_text_boxes(document: str) -> list[tuple[str, float, float, float, float]]:
    """Every ``<text>`` of an SVG document as (text, left, top, right, bottom), its
    box estimated from its font size, weight, anchor and length."""
    import xml.etree.ElementTree as ET

    boxes = []
    for element in ET.fromstring(document).iter("{http://www.w3.org/2000/svg}text"):
        text = "".join(element.itertext())
        size = float(element.get("font-size", "12"))
        x, y = float(element.get("x", "0")), float(element.get("y", "0"))
        width = text_width(text, size, bold=element.get("font-weight") == "bold")
        anchor = element.get("text-anchor", "start")
        left = {"start": x, "middle": x - width / 2, "end": x - width}[anchor]
        boxes.append((text, left, y - 0.78 * size, left + width, y + 0.22 * size))
    return boxes


def svg_text_problems(document: str) -> list[str]:
    """Texts of an SVG document that overlap each other or leave its canvas."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(document)
    width, height = float(root.get("width", "0")), float(root.get("height", "0"))
    boxes = svg_text_boxes(document)
    problems = []
    for text, left, top, right, bottom in boxes:
        if left < 0 or top < 0 or right > width or bottom > height:
            problems.append(f"{text!r} leaves the {width:g}x{height:g} canvas")
    for i, (text, left, top, right, bottom) in enumerate(boxes):
        for other, o_left, o_top, o_right, o_bottom in boxes[i + 1 :]:
            if left < o_right and o_left < right and top < o_bottom and o_top < bottom:
                problems.append(f"{text!r} overlaps {other!r}")
    return problems


def runs_three_jobs_in_a_thread_and_warns(backend: Any, caplog: Any) -> str:
    """A default ``Worker`` on ``backend``, whose renewer process cannot start: it
    renews in a thread, completes the queue's 3 jobs, and says why once (returned)."""
    from leasekeeper import Worker

    with caplog.at_level("WARNING", logger="leasekeeper"):
        worker = Worker(backend, lambda message: None, concurrency=2, wait_seconds=1)
        assert worker.manager.renewer.name == "thread"
        stats = worker.run(until_idle=1.0)
    assert (stats.completed, stats.lost, stats.failed) == (3, 0, 0)
    [warning] = [r.getMessage() for r in caplog.records if "renewer" in r.getMessage()]
    return str(warning)


def renews_a_job(backend: Any, renewer: str, **receive_options: Any) -> None:
    """Send a job to ``backend`` and receive it: ``renewer`` renews its 2 s lease
    twice, and it completes, with nothing lost."""
    from leasekeeper import LeaseManager

    backend.send("job")
    manager = LeaseManager(
        backend, renewer=renewer, visibility_timeout=2, timer_interval=0.2, minimal_life=0.5
    )
    try:
        manager.start()
        [message] = backend.receive(max_messages=1, **receive_options)
        renewed_twice_then_completed(manager, message)
    finally:
        manager.close()


class Served:
    """A test server its daemon thread (``_thread``) runs from the start of a
    ``with`` block (which gives the server) to its end (``close``)."""

    _thread: threading.Thread

    def __enter__(self: ServedT) -> ServedT:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


ServedT = TypeVar("ServedT", bound=Served)
