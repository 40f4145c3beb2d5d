"""The bell: the worker wakes its renewer process for what cannot wait, and only then.

Most of what a worker writes to its renewer can wait: a receive's registers of
leases the renewer holds back for seconds (``renewers._held``), and the drops of
those leases once their jobs are done (``renewers._own``). Read as each frame
arrives, they cost the renewer a wake-up each, and a register read before its drop
is a lease built, held and forgotten; read together, a register whose drop came
with it costs nothing but its unpickling (``_main.ChildRenewer``).

So the worker writes every frame to the socket at once, in order (``_sender``), and
rings a bell - one byte down a pipe of its own - after those that cannot wait: a
request (its thread waits for the reply), a register the renewer must hold soon,
progress, an abandon. The renewer's reading thread waits for the bell
(``Doorbell.wait``); frames that came without it are read ``QUIET_FOR`` seconds
after the first of them at the latest, together with whatever came meanwhile.

Why nothing is late:

- A held lease's time to be adopted is at least twice ``QUIET_FOR`` away when its
  register goes unrung (``rings_for``), and the renewer reads every frame already
  written before it adopts a lease (``HeldLeases``' sync): a drop is never missed.
- A worker that rings nothing (a handler holding the GIL for minutes) does not
  stop the renewer reading: ``QUIET_FOR`` is a timeout on the renewer's side.
- The worker's death is end of file on the socket, which the waiting thread sees
  at once, bell or not.
- The socket's buffer never fills: the worker rings at least every
  ``QUIET_FRAMES`` frames (each small frame takes a kernel buffer of about a
  kilobyte; the socket holds about two hundred).
"""

from __future__ import annotations

import contextlib
import os
import select

QUIET_FOR = 1.0  # seconds a frame that came without a ring may wait to be read
QUIET_FRAMES = 32  # a ring at least this often, so the socket's buffer never fills


def rings_for(own_until: float, now: float) -> bool:
    """Whether a register whose lease is held back until ``own_until`` must ring:
    when its time to be adopted comes in under twice ``QUIET_FOR``, or it is not held
    back at all (minus infinity: the renewer renews it as soon as it reads it)."""
    return own_until - now < 2 * QUIET_FOR


def ring(bell: int) -> None:
    """Ring the bell (the pipe's write end, non-blocking). A full pipe has rung
    already; a closed one has nobody left to wake."""
    with contextlib.suppress(BlockingIOError, BrokenPipeError):
        os.write(bell, b"\x01")


class Doorbell:
    """The renewer's side: wait until there is something to read now. One waiting
    thread at a time (the serving threads' leader)."""

    def __init__(self, socket_fd: int, bell: int, quiet_for: float = QUIET_FOR) -> None:
        os.set_blocking(bell, False)
        self._socket_fd = socket_fd
        self._bell = bell
        self._quiet_ms = quiet_for * 1000.0
        self._rang = True  # the bell works (its write end is open)
        # Either: a frame came, rung or not, or the worker's end.
        self._anything = select.poll()
        self._anything.register(socket_fd, select.POLLIN)
        self._anything.register(bell, select.POLLIN)
        # Only a ring, or the worker's end (POLLHUP is told unasked).
        self._ringing = select.poll()
        self._ringing.register(bell, select.POLLIN)
        self._ringing.register(socket_fd, 0)

    def wait(self) -> None:
        """Return when what has arrived should be read: at a ring, at the worker's
        end, or ``quiet_for`` after frames that came without one."""
        if not self._rang:  # no bell any more: every frame is read as it comes
            self._anything.poll()
            return
        ready = dict(self._anything.poll())
        if self._bell not in ready and not ready.get(self._socket_fd, 0) & select.POLLHUP:
            self._ringing.poll(self._quiet_ms)  # let the quiet frames have company
        self._hush()

    def _hush(self) -> None:
        """Empty the pipe of its rings; at its end (the worker closed its side),
        stop waiting for rings."""
        while True:
            try:
                rung = os.read(self._bell, 4096)
            except BlockingIOError:
                return
            if not rung:
                self._rang = False
                self._anything.unregister(self._bell)
                return
