"""What a process renewer's notices do to the worker's leases.

The renewer process tells the worker what happened to its leases - new receipts
and deadlines (``Extended``), endings (``Ended``), rollovers (``Rolling``) and, when
the worker has observers, their events (``Event``). ``Notices`` applies them to
``renewers.process.ProcessRenewer``'s leases, on the thread that read them (the
link's reader thread, or a thread waiting for a reply: ``renewers._replies``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from leasekeeper.backends.contract import Backend
from leasekeeper.engine import Calls
from leasekeeper.observers import CallEvent
from leasekeeper.reasons import Ending, LostReason
from leasekeeper.record import LeaseState
from leasekeeper.renewers._frames import Ended, Event, Extended, Rolling


class Notices:
    """What the renewer's notices do to the leases here (on the thread that read them):
    new receipts and deadlines, endings, rollovers, observer events."""

    def __init__(
        self,
        leases: dict[int, Any],
        end: Callable[..., None],
        calls: Calls,
        queues: Sequence[Backend],
    ) -> None:
        self._leases = leases  # the renewer's leases (``RemoteLease``), by key
        self._end = end  # ProcessRenewer._end
        self._calls = calls
        self._queues = queues
        self._handlers: dict[type, Callable[[Any], None]] = {
            Extended: self._extended,
            Ended: self._ended,
            Rolling: self._rolling,
            Event: self._event,
        }

    def apply(self, frame: tuple[Any, ...]) -> None:
        handler = self._handlers.get(type(frame))
        if handler is not None:
            handler(frame)

    def _extended(self, frame: Extended) -> None:
        lease = self._leases.get(frame.key)
        if lease is not None:
            lease.receipt, lease.visible_until = frame.receipt, frame.visible_until
            lease.extensions = frame.extensions

    def _ended(self, frame: Ended) -> None:
        lease = self._leases.get(frame.key)
        if lease is not None:
            lost = None if frame.lost_reason is None else LostReason(frame.lost_reason)
            ending = Ending(lost, frame.detail)
            self._end(lease, LeaseState(frame.state), ending, signal=frame.stop_handler)

    def _rolling(self, frame: Rolling) -> None:
        lease = self._leases.get(frame.key)
        if lease is not None:
            lease.signal_rolling()

    def _event(self, frame: Event) -> None:
        _tell_event(self._calls, frame, self._queues, self._leases)


def _tell_event(
    calls: Calls, frame: Event, queues: Sequence[Backend], leases: dict[int, Any]
) -> None:
    """An observer event the renewer forwarded, told to this process's observers."""
    callback, args = frame
    if callback == "on_call":
        operation, entries, seconds, outcomes, error, *queue = args
        backend = queues[queue[0] if queue else 0]
        calls.tell("on_call", CallEvent(operation, backend, entries, seconds, outcomes, error))
        return
    key, value = args
    lease = leases.get(key)
    if lease is not None:
        calls.tell(callback, lease, value)
