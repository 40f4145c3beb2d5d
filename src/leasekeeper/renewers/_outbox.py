"""Frames from the renewer process to its worker: ``Outbox`` and ``Forwarder``.

``Outbox`` sends the renewer's notices through one sender thread, batched when
they pile up, so the renewal threads that raise them never wait for a worker that
is not reading (stuck in C code); a request's reply goes from the thread that did
the request (``reply``). ``Forwarder`` is the observer of the renewer's manager
that turns what happens to the worker's leases into those notices: new receipts
and deadlines (``Extended``), endings (``Ended``), rollovers (``Rolling``) and,
when the worker has observers, their events (``Event``).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any, NamedTuple

from leasekeeper.lease import Lease
from leasekeeper.observers import CallEvent, Observer
from leasekeeper.record import LeaseRecord, LeaseState
from leasekeeper.renewers._channel import Channel
from leasekeeper.renewers._frames import Batch, Ended, Event, Extended, Rolling, send_frame


class _Flushed(NamedTuple):
    """Not a frame: the sender sets ``sent`` once what was queued before it went."""

    sent: threading.Event


class Outbox:
    """Frames to the worker: notices go through one sender thread, batched when they
    pile up, so the renewal threads that raise them never wait for the worker to
    read; a request's reply is sent by the thread that did the request (``reply``),
    one thread handoff less on the worker's round trip."""

    def __init__(self, conn: Channel) -> None:
        self._conn = conn
        self._send_lock = threading.Lock()  # guards the socket's sending side
        self._queue: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name="leasekeeper-renewer-sender", daemon=True
        )
        self._thread.start()

    def put(self, frame: tuple[Any, ...]) -> None:
        self._queue.put(frame)

    def reply(self, frame: tuple[Any, ...]) -> None:
        """Send ``frame`` now, from this thread (a request's answer)."""
        try:
            with self._send_lock:
                send_frame(self._conn, frame)
        except OSError:
            pass  # the worker is gone: nobody to answer

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, then stop."""
        self._queue.put(None)
        self._thread.join(timeout)

    def flush(self, timeout: float = 5.0) -> None:
        """Wait until what is queued now has been sent."""
        sent = threading.Event()
        self._queue.put(_Flushed(sent))
        sent.wait(timeout)

    def _run(self) -> None:
        while True:
            frame = self._queue.get()
            frames: list[tuple[Any, ...]] = []
            flushed: list[threading.Event] = []
            done = frame is None
            more: tuple[Any, ...] | None = frame
            while more is not None:
                if isinstance(more, _Flushed):
                    flushed.append(more.sent)
                else:
                    frames.append(more)
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    done = True
            try:
                with self._send_lock:
                    if len(frames) == 1:
                        send_frame(self._conn, frames[0])
                    elif frames:
                        send_frame(self._conn, Batch(frames))
            except OSError:
                return  # the worker is gone: nobody to tell
            finally:
                for event in flushed:
                    event.set()
            if done:
                return


class Forwarder(Observer):
    """Tells the worker what happened to its leases (and, when asked, every event),
    and forgets the keys of leases that ended."""

    def __init__(
        self,
        outbox: Outbox,
        leases: dict[int, Lease],
        keys: dict[int, int],
        queues: Sequence[object] = (),
    ) -> None:
        self._outbox = outbox
        # A multi-queue worker's queues, by id: a call event names its queue's index.
        self._queue_index = {id(queue): index for index, queue in enumerate(queues)}
        self._leases = leases  # the worker's key -> lease
        self._keys = keys  # id(lease) -> the worker's key
        self.events = False  # forward on_call/on_lapse too (the worker has observers)

    def on_extended(self, lease: LeaseRecord, headroom: float) -> None:
        key = self._keys.get(id(lease))
        if key is not None:
            self._outbox.put(Extended(key, lease.receipt, lease.visible_until, lease.extensions))
            if self.events:
                self._outbox.put(Event("on_extended", (key, headroom)))

    def on_ended(self, lease: LeaseRecord, state: LeaseState, reason: str) -> None:
        key = self._keys.pop(id(lease), None)
        if key is None:
            return
        self._leases.pop(key, None)
        if state is not LeaseState.COMPLETED:  # a completion is the reply's to tell
            lost = lease.lost_reason
            lost_reason = None if lost is None else lost.value
            self._outbox.put(Ended(key, state.value, lost_reason, reason, lease.signalled))

    def on_rolling(self, lease: LeaseRecord) -> None:
        key = self._keys.get(id(lease))
        if key is not None:
            self._outbox.put(Rolling(key))

    def on_call(self, event: CallEvent) -> None:
        if self.events:
            args: tuple[Any, ...] = (
                event.operation,
                event.entries,
                event.seconds,
                event.outcomes,
                event.error,
            )
            if len(self._queue_index) > 1:
                args += (self._queue_index.get(id(event.backend), 0),)
            self._outbox.put(Event("on_call", args))

    def on_lapse(self, lease: LeaseRecord, late: float) -> None:
        key = self._keys.get(id(lease))
        if self.events and key is not None:
            self._outbox.put(Event("on_lapse", (key, late)))
