"""The worker's link to its renewer process: start it, talk to it, notice its death.

``RenewerLink`` starts ``python -m leasekeeper._renewer_main`` with one end of a
socket pair - a plain subprocess, not multiprocessing: spawn would re-run an
unguarded ``__main__`` of the user's script and fork would copy a threaded
process and its descriptors - sends it sys.path, this pid and the pickled
(spec, config), and waits for it to say it is ready (a spec that cannot build,
e.g. for missing credentials, fails here, at once). Then it sends frames
(``_wire``), waits for replies (``ask``), and hands every other frame to its
``on_frame`` callback from a reader thread. When the renewer dies its pending
requests are answered ``DIED`` and ``on_gone`` is called, on the reader thread.
"""

from __future__ import annotations

import _thread
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from leasekeeper._wire import recv_frame, send_frame
from leasekeeper.errors import ConfigError, LeaseLost

log = logging.getLogger("leasekeeper.renewer")

START_TIMEOUT = 30.0  # seconds for the renewer to build its backend and say ready
DIED = "the renewer process died"


class _Reply:
    """One request's answer, waited for on a plain lock (cheaper than an Event)."""

    __slots__ = ("latch", "payload")

    def __init__(self) -> None:
        self.latch = _thread.allocate_lock()
        self.latch.acquire()
        self.payload: Any = None

    def set(self, payload: Any) -> None:
        self.payload = payload
        self.latch.release()


class RenewerLink:
    """One renewer process and the socket to it (a new link per process)."""

    def __init__(
        self,
        payload: bytes,
        *,
        on_frame: Callable[[tuple[Any, ...]], None],
        on_gone: Callable[[RenewerLink], None],
    ) -> None:
        self._on_frame = on_frame
        self._on_gone = on_gone
        self.closing = False  # close() asked it to go: its end is no death
        # Guards the socket's sending side and _replies.
        self._send_lock = threading.Lock()
        self._replies: dict[int, _Reply] = {}
        self._requests = itertools.count(1)
        self.proc, self._conn = _start(payload)
        self._reader = threading.Thread(
            target=self._read, name="leasekeeper-renewer-reader", daemon=True
        )
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, frame: tuple[Any, ...]) -> None:
        """Send ``frame``; raise LeaseLost when the renewer is gone."""
        try:
            with self._send_lock:
                send_frame(self._conn, frame)
        except OSError:
            raise LeaseLost("-", DIED) from None

    def ask(self, make: Callable[[int], tuple[Any, ...]]) -> Any:
        """Send the request ``make(request id)``; wait for its reply's payload
        (``DIED`` if the renewer died first)."""
        reply = _Reply()
        with self._send_lock:
            request = next(self._requests)
            self._replies[request] = reply
            try:
                send_frame(self._conn, make(request))
            except OSError:
                del self._replies[request]
                return DIED
        reply.latch.acquire()  # released by the reader thread (or by _gone)
        return reply.payload

    def close(self, timeout: float | None) -> None:
        """After the renewer was asked to close: wait for it to exit (or kill it)."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log.warning("renewer process %d did not exit; killed", self.proc.pid)
            self.proc.kill()
        if self._reader is not threading.current_thread():
            self._reader.join(5.0)

    def drop(self) -> None:
        """In a forked child of the worker: let go of the socket (so the renewer still
        sees end of file when the worker dies) without a word to it."""
        self.closing = True
        with contextlib.suppress(OSError):
            os.close(self._conn.fileno())

    def _read(self) -> None:
        """The reader thread: replies to their waiters, the rest to ``on_frame``."""
        while True:
            try:
                frame = recv_frame(self._conn)
            except (EOFError, OSError):
                break
            try:
                self._dispatch(frame)
            except Exception:
                log.exception("renewer frame %r could not be applied", frame[0])
        self._gone()

    def _dispatch(self, frame: tuple[Any, ...]) -> None:
        tag = frame[0]
        if tag == "batch":
            for inner in frame[1]:
                self._dispatch(inner)
        elif tag == "done":
            with self._send_lock:
                reply = self._replies.pop(frame[1], None)
            if reply is not None:
                reply.set(frame[2])
        else:
            self._on_frame(frame)

    def _gone(self) -> None:
        with self._send_lock:
            replies = list(self._replies.values())
            self._replies.clear()
        for reply in replies:
            reply.set(DIED)
        self._conn.close()
        self.proc.wait()
        if not self.closing:
            log.error("renewer process %d died", self.proc.pid)
            self._on_gone(self)


def _start(payload: bytes) -> tuple[subprocess.Popen[bytes], Connection]:
    ours, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "leasekeeper._renewer_main", str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # the terminal's signals are not its business
        )
    finally:
        theirs.close()
    conn = Connection(ours.detach())
    send_frame(conn, (list(sys.path), os.getpid(), payload))
    answer: Any = ("failed", "no answer")
    if conn.poll(START_TIMEOUT):
        try:
            answer = recv_frame(conn)
        except (EOFError, OSError):
            answer = ("failed", "it exited while starting")
    if answer[0] != "ready":
        conn.close()
        proc.kill()
        proc.wait()
        raise ConfigError(f"the renewer process could not start: {answer[1]}")
    log.info("renewer process %d started", answer[1])
    return proc, conn
