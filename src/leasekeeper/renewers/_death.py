"""``DeathWatch``: the renewer process learns that its worker died.

Three ways, whichever comes first (the socket's end of file is the third, seen by
``renewers._main``): the parent-death signal (Linux ``PR_SET_PDEATHSIG``, which
fires when the *thread* that started us exits, so it is only believed once
``getppid()`` changed too), and the worker's exit itself, seen by a watchdog thread
(it waits on a pidfd where Linux has them: an idle renewer never wakes; else it
checks ``getppid()`` every ``WATCH_INTERVAL``). Either ends as one ``WorkerGone``
raised in the renewer's main thread.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import threading

PARENT_DEATH_SIGNAL = signal.SIGUSR1
WATCH_INTERVAL = 0.2  # seconds between getppid() checks
_PR_SET_PDEATHSIG = 1


class WorkerGone(Exception):
    """The worker process died: release everything and exit."""


class DeathWatch:
    """Turns the worker's death into one WorkerGone in the main thread, however it
    shows (the parent-death signal, or the watchdog seeing ``getppid()`` change).

    It raises at most once, and never after ``settle()``: the main thread settles it
    as soon as it knows how it ends (closed, or the worker gone by end of file), so a
    late notice cannot cut short the release that follows. The flag is a plain
    attribute, not a lock or an Event: the handler runs in the main thread, between
    any two of its bytecodes, and must not wait for a lock that thread may hold.
    """

    def __init__(self, parent: int) -> None:
        self.parent = parent
        self.settled = False
        # While the backend is built, a notice is kept, not raised: an exception in
        # the middle of an SDK's import would leave it half imported.
        self.deferring = False
        self.noticed = False

    def start(self) -> None:
        signal.signal(PARENT_DEATH_SIGNAL, self.on_notice)
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(None, use_errno=True)
                libc.prctl(_PR_SET_PDEATHSIG, int(PARENT_DEATH_SIGNAL), 0, 0, 0)
        threading.Thread(
            target=self._watchdog, name="leasekeeper-renewer-watchdog", daemon=True
        ).start()
        if os.getppid() != self.parent:  # it died before we could watch it
            self.settled = True
            raise WorkerGone

    def settle(self) -> None:
        """No WorkerGone from here on."""
        self.settled = True

    def defer(self) -> None:
        """Keep a notice from here on instead of raising it (``resume`` tells)."""
        self.deferring = True

    def resume(self) -> bool:
        """Raise notices again; True (and settled) when the worker died meanwhile."""
        self.deferring = False
        if self.noticed or os.getppid() != self.parent:
            self.settled = True
            return True
        return False

    def on_notice(self, signum: int, frame: object) -> None:
        # Believed only once the parent really changed (PR_SET_PDEATHSIG fires when
        # the worker's *thread* that started us exits).
        if not self.settled and os.getppid() != self.parent:
            if self.deferring:
                self.noticed = True
                return
            self.settled = True
            raise WorkerGone

    def _watchdog(self) -> None:
        # Where the kernel can tell (a pidfd turns readable when its process exits),
        # wait for that, without waking 1/WATCH_INTERVAL times a second for nothing.
        with contextlib.suppress(OSError, AttributeError, ValueError):
            pidfd = os.pidfd_open(self.parent)
            try:
                if os.getppid() == self.parent:  # the pidfd is our parent's
                    exited = select.poll()
                    exited.register(pidfd, select.POLLIN)
                    exited.poll()
            finally:
                os.close(pidfd)
        pause = threading.Event()
        while os.getppid() == self.parent:
            pause.wait(WATCH_INTERVAL)
        os.kill(os.getpid(), PARENT_DEATH_SIGNAL)
