"""The renewer's replies to this process's requests, and which thread reads them.

A thread that asks the renewer something (``RenewerLink.ask``) while no other
request is out reads the socket itself until its reply comes (and applies what
else it reads meanwhile: notices, other threads' replies), then gives the reading
back to the reader thread. So a lone request's reply crosses no thread: the thread
that waits is the one the kernel wakes (the reader thread that woke it cost a
thread switch and a lock a reply). A ``Worker``'s flusher, a lone handler and
``stats()`` ask that way.

While other requests are out (several handler threads completing at once) a new
one waits for the reader thread to bring its reply, as before: the reader thread
reads on while any request is out, and one read brings the replies of several
threads. (A waiting thread that read for the others and handed the reading to
the next one cost a thread switch more per reply than the reader thread did.)

The reader thread reads what arrives while no thread waits (a lease lost, new
receipts): it waits in ``epoll`` for the socket to be readable. A thread that takes
over the reading takes the socket out of that ``epoll`` set first, without a word to
the reader thread (which sleeps on), and puts it back when it is done. So a notice
is applied at once whether or not a thread waits, and no thread reads once its own
reply has come: none is kept from its handler. Where there is no ``epoll`` the
reader thread reads everything.

A read that finds end of file (the renewer is gone) answers every waiting request
``dead`` at once; the reader thread sees the end too, and ``serve`` returns.
"""

from __future__ import annotations

import itertools
import select
import threading
from collections.abc import Callable
from typing import Any

from leasekeeper.renewers._frames import FrameReader

_READER = object()  # the reading role's holder while the reader thread reads


class Waiter:
    """One request's reply, waited for on a plain lock (cheaper than an Event)."""

    __slots__ = ("answered", "latch", "payload")

    def __init__(self) -> None:
        self.latch = threading.Lock()
        self.latch.acquire()
        self.payload: Any = None
        self.answered = False


class Replies:
    """The requests waiting for a reply, and who reads the socket: a waiting thread or
    the reader thread (see the module docstring). ``apply`` is given every frame read;
    ``answer`` is how it gives a reply to its waiter."""

    def __init__(
        self, fd: int, reader: FrameReader, apply: Callable[[list[Any]], None], dead: Any
    ) -> None:
        self._fd = fd
        self._reader = reader
        self._apply = apply  # the frames read, applied (replies through ``answer``)
        self._dead = dead  # the payload of a request whose renewer is gone
        self._lock = threading.Lock()  # guards everything below
        self._waiting: dict[int, Waiter] = {}
        self._requests = itertools.count(1)
        self._ended = False  # the renewer is gone: no reply will come
        self._poll = select.epoll() if hasattr(select, "epoll") else None
        # Who reads: None (the reader thread, once the socket is readable), a Waiter
        # (its thread), or _READER (the reader thread, reading now; always without epoll).
        self._role: object | None = None if self._poll is not None else _READER
        self._watched = False  # the socket is in the reader thread's epoll set
        self._watch()

    def open(self) -> tuple[int, Waiter] | None:
        """A new request's id and its waiter; None once the renewer is gone. When no
        other request is out and no thread reads, this one will: it takes the socket
        from the reader thread now, before its request is sent (a quicker reply would
        wake the reader thread for nothing)."""
        with self._lock:
            if self._ended:
                return None
            request = next(self._requests)
            waiter = Waiter()
            if self._role is None and not self._waiting:
                self._role = waiter
                self._unwatch()
            self._waiting[request] = waiter
            return request, waiter

    def cancel(self, request: int, waiter: Waiter) -> None:
        """The request was never sent: nobody waits for its reply (nor reads for it)."""
        with self._lock:
            self._waiting.pop(request, None)
            self._give_back(waiter)

    def wait(self, waiter: Waiter) -> Any:
        """The reply's payload (``dead`` if the renewer went first): read by this thread
        if ``open`` made it the reader, else brought by the reader thread."""
        if self._role is waiter:
            self._lead(waiter)
        else:
            try:
                waiter.latch.acquire()  # let go once its reply came
            except BaseException:  # (KeyboardInterrupt): nobody waits for it now
                with self._lock:
                    self._waiting = {r: w for r, w in self._waiting.items() if w is not waiter}
                raise
        return waiter.payload

    def answer(self, request: int, payload: Any) -> None:
        """Request ``request``'s reply came: to its waiter."""
        with self._lock:
            waiter = self._waiting.pop(request, None)
        if waiter is not None:
            waiter.payload = payload
            waiter.answered = True
            if self._role is not waiter:  # (it reads: it is awake)
                waiter.latch.release()

    def serve(self) -> None:
        """The reader thread: read what arrives while no waiting thread reads, and on
        while any request is out; return once the renewer is gone (every waiting
        request answered ``dead``)."""
        poll = self._poll
        while True:
            if poll is not None and self._role is not _READER:
                try:
                    poll.poll()  # the socket is readable, and no waiting thread reads it
                except OSError:  # (closed: this link is done with)
                    self._end()
                    return
                with self._lock:
                    if self._role is not None:
                        continue  # a waiting thread took it as it became readable
                    self._role = _READER
            try:
                # (Should a waiting thread have read it all meanwhile, this waits for
                # the next frame: the reader thread reads on, as without epoll.)
                frames = self._reader.read()
            except (EOFError, OSError):
                self._end()
                return
            self._apply(frames)
            if poll is not None:
                with self._lock:
                    if not self._waiting:
                        self._role = None  # (the socket is in the epoll set still)

    def end(self) -> None:
        """The renewer is gone: every waiting request is answered ``dead``."""
        self._end()

    def close(self) -> None:
        if self._poll is not None:
            self._poll.close()

    def _lead(self, waiter: Waiter) -> None:
        """Read and apply frames until ``waiter``'s reply is among them; then give the
        reading back to the reader thread."""
        try:
            while not waiter.answered:
                try:
                    frames = self._reader.read()
                except (EOFError, OSError):
                    self._end()  # the reader thread sees the end too, and reports it
                    return
                self._apply(frames)
        finally:
            with self._lock:
                if not waiter.answered:  # (KeyboardInterrupt): nobody waits for it now
                    self._waiting = {r: w for r, w in self._waiting.items() if w is not waiter}
                self._give_back(waiter)

    def _give_back(self, holder: Waiter) -> None:
        """``holder``'s thread reads no more: the reader thread reads once the socket
        is readable (the lock held)."""
        if self._role is holder:
            self._role = None
            self._watch()

    def _end(self) -> None:
        with self._lock:
            self._ended = True
            waiting = list(self._waiting.values())
            self._waiting.clear()
            for waiter in waiting:
                waiter.payload = self._dead
                waiter.answered = True
                if self._role is not waiter:
                    waiter.latch.release()

    def _watch(self) -> None:
        """The reader thread's epoll set gets the socket (the lock held)."""
        if self._poll is not None and not self._watched:
            self._poll.register(self._fd, select.EPOLLIN)
            self._watched = True

    def _unwatch(self) -> None:
        """The socket out of the reader thread's epoll set, without waking it (the lock
        held). Removed, not just masked: a hang-up is reported even to an empty mask."""
        if self._poll is not None and self._watched:
            self._poll.unregister(self._fd)
            self._watched = False
