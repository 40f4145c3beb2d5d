"""The worker's link to its renewer process: start it, talk to it, notice its death.

``RenewerLink`` starts ``python -m leasekeeper.renewers._main`` with one end of a
socket pair - a plain subprocess, not multiprocessing: spawn would re-run an
unguarded ``__main__`` of the user's script and fork would copy a threaded
process and its descriptors - with this process's sys.path as its
``PYTHONPATH`` (``renewer_environment``), sends it sys.path, this pid and the pickled
(spec, config), and waits for it to say it has started. Meanwhile this process
runs its own check (``precheck``: credentials the renewer would lack, found without
a request), so what would fail every renewal fails here, at once.

The renewer says it has started, then builds its backend (mostly the import of
its service's SDK: botocore alone is half a second) and says it serves, or why it
cannot. ``wait_serving`` waits for that: ``ProcessRenewer`` does before its
constructor returns and before it registers on a new renewer, so nothing is
received or registered before its renewals can be sent. A backend that cannot be
built there after all is reported by ``wait_serving`` (ConfigError, with its
reason).

Then it sends frames (``_frames``, one write each: ``renewers._sender``), waits
for replies (``ask``: the waiting thread reads them itself when no other does,
``renewers._replies``), and hands every other frame to its ``on_frame`` callback -
on the thread that read it: a waiting thread, or the reader thread, which reads
what comes while no thread waits. When the renewer dies its pending requests are
answered ``DIED`` at once and ``on_gone`` is called, on the reader thread
(``renewers._succession`` has another renewer take its leases over).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from leasekeeper.backends.cloud import CloudBackend
from leasekeeper.backends.contract import Backend
from leasekeeper.errors import ConfigError, LeaseLost
from leasekeeper.renewers._channel import Channel
from leasekeeper.renewers._frames import (
    Batch,
    Done,
    Failed,
    FrameReader,
    Hello,
    Serving,
    Started,
    recv_frame,
    send_frame,
)
from leasekeeper.renewers._replies import Replies
from leasekeeper.renewers._sender import FrameSender

log = logging.getLogger("leasekeeper.renewer")

START_TIMEOUT = 30.0  # seconds for the renewer to start, and again to build its backend
DIED = "the renewer process died"


class RenewerLink:
    """One renewer process and the socket to it (a new link per process)."""

    def __init__(
        self,
        payload: bytes,
        *,
        on_frame: Callable[[tuple[Any, ...]], None],
        on_gone: Callable[[RenewerLink], None],
        precheck: Callable[[], str | None] | None = None,
    ) -> None:
        self._on_frame = on_frame
        self._on_gone = on_gone
        self.closing = False  # close() asked it to go: its end is no death
        self.ended = False  # its end of file was read (set before on_gone is called)
        # Set once the renewer serves, or once it cannot (failure: its reason).
        self._settled = threading.Event()
        self._died = False  # gone before it served
        self.failure: str | None = None  # why it could not build its backend
        # What the reader does with each frame: these here, every other to on_frame.
        self._handlers: dict[type, Callable[[Any], None]] = {
            Batch: self._batch,
            Done: self._done,
            Serving: self._serving,
            Failed: self._failed,
        }
        self.proc, self._conn, self._bell = _start(payload, precheck)
        self._sender = FrameSender(self._conn, threading.Lock(), self._bell)
        self._replies = Replies(
            self._conn.fileno(), FrameReader(self._conn), self._apply, dead=DIED
        )
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

    @property
    def serving(self) -> bool:
        """The renewer has built its backend and renews."""
        return self._settled.is_set() and self.failure is None and not self._died

    def wait_serving(self, timeout: float = START_TIMEOUT) -> None:
        """Return once the renewer renews; ConfigError when it cannot (its backend
        could not be built there, it died first, or it took over ``timeout``)."""
        if not self._settled.wait(timeout):
            raise ConfigError(
                f"the renewer process could not start: its backend was not built in {timeout:g}s"
            )
        if self.failure is not None:
            raise ConfigError(f"the renewer process could not start: {self.failure}")
        if self._died:
            raise ConfigError("the renewer process could not start: it died while starting")

    def send(self, frame: tuple[Any, ...], *, urgent: bool = True) -> None:
        """Send ``frame`` (``FrameSender``; ``urgent``: ring the renewer's bell, as
        every request does); LeaseLost when the renewer is gone."""
        try:
            self._sender.send(frame, urgent=urgent)
        except OSError:
            raise LeaseLost("-", DIED) from None

    def ask(self, make: Callable[[int], tuple[Any, ...]]) -> Any:
        """Send the request ``make(request id)``; wait for its reply's payload
        (``DIED`` if the renewer died first)."""
        opened = self._replies.open()
        if opened is None:
            return DIED
        request, waiter = opened
        try:
            self._sender.send(make(request))
        except OSError:
            self._replies.cancel(request, waiter)
            return DIED
        except BaseException:  # (KeyboardInterrupt): not left holding the reading
            self._replies.cancel(request, waiter)
            raise
        return self._replies.wait(waiter)

    def kill(self) -> None:
        """Stop a renewer that cannot serve (it held nothing) and wait for it."""
        with contextlib.suppress(OSError):
            self.proc.kill()
        self.proc.wait()

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
        with contextlib.suppress(OSError):
            os.close(self._bell)
        self._replies.close()  # (this process's copy: the parent's set is its own)

    def _read(self) -> None:
        """The reader thread: what arrives while no thread waits for a reply; then the end."""
        self._replies.serve()
        self._gone()

    def _apply(self, frames: list[tuple[Any, ...]]) -> None:
        """Frames read (by a waiting thread or the reader thread): replies to their
        waiters, the rest to ``on_frame``."""
        for frame in frames:
            try:
                self._dispatch(frame)
            except Exception:
                log.exception("renewer frame %s could not be applied", type(frame).__name__)

    def _dispatch(self, frame: tuple[Any, ...]) -> None:
        handler = self._handlers.get(type(frame))
        if handler is None:
            self._on_frame(frame)
        else:
            handler(frame)

    def _batch(self, frame: Batch) -> None:
        for inner in frame.frames:
            self._dispatch(inner)

    def _done(self, frame: Done) -> None:
        self._replies.answer(frame.request, frame.payload)

    def _serving(self, frame: Serving) -> None:
        self._settled.set()

    def _failed(self, frame: Failed) -> None:  # then it exits: _gone follows
        self.failure = frame.reason
        log.error("the renewer process could not build its backend: %s", self.failure)
        self._settled.set()

    def _close_socket(self) -> None:
        self._conn.close()
        os.close(self._bell)

    def _gone(self) -> None:
        self.ended = True
        if not self._settled.is_set():
            self._died = True
        self._settled.set()
        self._replies.end()  # (answered already when a waiting thread read the end)
        self._sender.close(self._close_socket)  # once no write is under way
        self._replies.close()
        self.proc.wait()
        if self.closing:
            return
        if self.failure is None:  # a failure was logged when it was told
            log.error("renewer process %d died", self.proc.pid)
        self._on_gone(self)


class LinkMaker:
    """Starts the renewer processes of one ``ProcessRenewer`` - and no more of them
    once one could not build its backend: another would fail the same way."""

    def __init__(self, backends: Sequence[Backend], payload: bytes) -> None:
        self._backends = backends
        self._payload = payload  # the pickled (spec, config[, more specs])
        self._unbuildable: str | None = None  # why one could not build its backend

    @property
    def unbuildable(self) -> bool:
        return self._unbuildable is not None

    def start(
        self,
        on_frame: Callable[[tuple[Any, ...]], None],
        on_gone: Callable[[RenewerLink], None],
    ) -> RenewerLink:
        if self._unbuildable is not None:
            raise ConfigError(f"the renewer process could not start: {self._unbuildable}")
        return RenewerLink(
            self._payload, on_frame=on_frame, on_gone=on_gone, precheck=self._credentials_problem
        )

    def ended(self, link: RenewerLink) -> None:
        """``link``'s renewer is gone; if it never served, it could not build."""
        if link.failure is not None:
            self._unbuildable = link.failure

    def _credentials_problem(self) -> str | None:
        """What the renewer's backends would lack, asked of these (no request)."""
        for backend in self._backends:
            if isinstance(backend, CloudBackend):
                problem = backend.credentials_problem()
                if problem is not None:
                    return problem
        return None


def renewer_environment() -> dict[str, str]:
    """The renewer process's environment: this one, with this process's sys.path in
    front of its own (``PYTHONPATH``), so that it imports leasekeeper - and all it
    imports after - from where this process did. Without it a leasekeeper this
    process found on a path added in code (a vendored copy, a script's
    ``sys.path.insert``) was not found there at all, and the renewer process could
    not start where the thread renewer works; and an installed copy of another
    version would have been the one imported. (An entry holding the path separator
    cannot be passed this way; it is left out.)"""
    path = [entry for entry in sys.path if isinstance(entry, str) and os.pathsep not in entry]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path)}


def _start(
    payload: bytes, precheck: Callable[[], str | None] | None
) -> tuple[subprocess.Popen[bytes], Channel, int]:
    """The renewer process, the socket to it, and the write end of its bell's pipe."""
    ours, theirs = socket.socketpair()
    bell_theirs, bell = os.pipe()
    os.set_blocking(bell, False)  # a ring never waits: a full pipe has rung already
    try:
        fds = [theirs.fileno(), bell_theirs]
        proc = subprocess.Popen(
            [sys.executable, "-m", "leasekeeper.renewers._main", *map(str, fds)],
            pass_fds=fds,
            stdin=subprocess.DEVNULL,
            env=renewer_environment(),
            start_new_session=True,  # the terminal's signals are not its business
        )
    except BaseException:
        os.close(bell)
        raise
    finally:
        theirs.close()
        os.close(bell_theirs)
    conn = Channel(ours.detach())
    answer: Any = Failed("no answer")
    try:
        try:
            send_frame(conn, Hello(list(sys.path), os.getpid(), payload))
            # While the renewer starts: what this process can tell without it.
            problem = precheck() if precheck is not None else None
            if problem is not None:
                answer = Failed(problem)
            elif conn.poll(START_TIMEOUT):
                answer = recv_frame(conn)
        except (EOFError, OSError):
            answer = Failed("it exited while starting")
        if not isinstance(answer, Started):
            reason = answer.reason if isinstance(answer, Failed) else repr(answer)
            raise ConfigError(f"the renewer process could not start: {reason}")
    except BaseException:
        conn.close()
        os.close(bell)
        proc.kill()
        proc.wait()
        raise
    log.info("renewer process %d started", answer.pid)
    return proc, conn, bell
