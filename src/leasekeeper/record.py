"""LeaseState and LeaseRecord: what the renewal engine knows of one lease.

A ``LeaseRecord`` is plain data with public attribute names, so the scheduling
state (``_schedule``), the renewal engine (``_engine``) and the user-facing
``Lease`` (a subclass) share one object per lease without reaching into each
other's private names. Users hold ``Lease``; the attributes defined here beyond
those ``Lease`` documents are leasekeeper's bookkeeping, not API.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar

from leasekeeper.backends.contract import Handle, Message
from leasekeeper.reasons import Ending, LostReason

_new_tuple = tuple.__new__
_new_object = object.__new__
R = TypeVar("R", bound="LeaseRecord")

# Creating a threading.Event costs more memory than the rest of a lease (a Condition,
# a Lock and a deque), and most leases never have theirs read. So the event is
# created on first use; this lock makes "create it, and set it if the lease already
# ended" atomic with respect to the engine signalling it.
_EVENT_LOCK = threading.Lock()


class LeaseState(str, enum.Enum):
    ACTIVE = "active"  # being renewed
    COMPLETED = "completed"  # deleted: the handler succeeded
    RELEASED = "released"  # made visible again (handler failed, or close())
    LOST = "lost"  # the service says the receipt is dead, or the deadline passed
    ABANDONED = "abandoned"  # renewing stopped: max_lease_duration or the service's cap
    FORGOTTEN = "forgotten"  # renewing stopped at the owner's word (lease.forget()): untouched

    def __str__(self) -> str:
        return self.value


class LeaseRecord:
    """One lease's renewal state. Fields (times on the engine's monotonic clock):

    message        the Message, as received
    receipt        its newest receipt (a secret: never logged)
    visible_until  the local deadline (rule 1: counted from just before the send)
    registered_at  when it was registered (for max_lease_duration)
    state          where it is in its life
    ending         why it ended (an ``Ending``: a ``LostReason`` and the detail)
    extensions     successful extends
    gen            generation of its live heap entry; 0 = not scheduled
    due            when its live heap entry is due
    watch          generation of its deadline watch while an extend is out; 0 = none
    retries        transient failures since the last successful extend
    last_error     the detail of the latest of those
    busy           an operation (extend, delete, release, forget) runs on it now:
                   rule 4's flag, guarded by the engine's registry lock (``_gate``)
    signalled      the handler has been told to stop (``Lease.lost`` is set)
    event          that ``threading.Event``, created on first use
    owner          the renewer that registered it: where the lease's own
                   complete/release/... go (a ``LeaseOwner``)
    progressed_at  the handler's latest progress (``Lease.progress()``), for
                   ``stall_timeout``: unset until it reports any (read it with
                   ``last_progress()``; left unset, it costs the hot path nothing)
    roll           the rollover's state (a ``RollState``), created on first use:
                   most leases never come near the service's cap
    """

    __slots__ = (
        "busy",
        "due",
        "ending",
        "event",
        "extensions",
        "gen",
        "last_error",
        "message",
        "owner",
        "progressed_at",
        "receipt",
        "registered_at",
        "retries",
        "roll",
        "signalled",
        "state",
        "visible_until",
        "watch",
    )

    #: Can its handler stall (``stall_timeout``)? A watch lease has no handler of ours.
    stalls: ClassVar[bool] = True
    progressed_at: float  # a slot left unset until the first progress() (see above)

    def __init__(self, owner: Any, message: Message, registered_at: float) -> None:
        self.owner = owner
        self.message = message
        self.receipt = message.receipt
        self.visible_until = message.visible_until
        self.registered_at = registered_at
        self.state = LeaseState.ACTIVE
        self.ending: Ending | None = None
        self.extensions = 0
        self.gen = 0
        self.due = 0.0
        self.watch = 0
        self.retries = 0
        self.last_error = ""
        self.busy = False
        self.signalled = False
        self.event: threading.Event | None = None
        self.roll: RollState | None = None

    @classmethod
    def maker(cls: type[R], owner: Any) -> Callable[[Message, float], R]:
        """``cls(owner, message, registered_at)`` as a function of the last two.

        For the register hot path: it sets the same fields as ``__init__`` (a test
        checks), without ``type.__call__`` dispatching to ``__init__``, which costs
        as much again as the fields themselves. Only for classes that add no fields
        of their own (a subclass's ``__init__`` would be skipped).
        """
        own = [
            name
            for klass in cls.__mro__
            if klass is not LeaseRecord
            for name in getattr(klass, "__slots__", ())
            if name != "__weakref__"
        ]
        if own or cls.__init__ is not LeaseRecord.__init__:
            raise TypeError(f"{cls.__qualname__} adds fields; build it with {cls.__qualname__}()")
        new, active = _new_object, LeaseState.ACTIVE

        # The fields are written out again here rather than by calling __init__ on
        # the new object: __init__ is shared by every record class, so CPython's
        # specialising interpreter cannot keep its slot stores specialised, and that
        # call measured as slow as cls(...) itself (0.27 µs more per register).
        def make(message: Message, registered_at: float) -> R:
            record = new(cls)
            record.owner = owner
            record.message = message
            record.receipt = message.receipt
            record.visible_until = message.visible_until
            record.registered_at = registered_at
            record.state = active
            record.ending = None
            record.extensions = 0
            record.gen = 0
            record.due = 0.0
            record.watch = 0
            record.retries = 0
            record.last_error = ""
            record.busy = False
            record.signalled = False
            record.event = None
            record.roll = None
            return record

        return make

    def last_progress(self) -> float:
        """When the handler last made progress: its latest ``progress()``, else when
        the lease was registered."""
        at: float = getattr(self, "progressed_at", self.registered_at)
        return at

    @property
    def reason(self) -> str | None:
        """Why it ended, in words (None while active)."""
        ending = self.ending
        return None if ending is None else ending.detail

    @property
    def lost_reason(self) -> LostReason | None:
        """Why it was lost or abandoned (None while active, or when it was completed,
        released or forgotten)."""
        ending = self.ending
        return None if ending is None else ending.lost_reason

    def handle(self) -> Handle:
        """The message id and newest receipt, for a backend call."""
        # tuple.__new__ skips NamedTuple's Python-level __new__: this is on the
        # register/complete hot path.
        return _new_tuple(Handle, (self.message.id, self.receipt))

    def stop_event(self) -> threading.Event:
        """The event set when the handler must stop (created on first use)."""
        with _EVENT_LOCK:
            if self.event is None:
                self.event = threading.Event()
                if self.signalled:
                    self.event.set()
            return self.event

    def signal(self) -> None:
        """Tell the handler to stop: mark the record and wake anyone waiting."""
        with _EVENT_LOCK:
            self.signalled = True
            event = self.event
        if event is not None:
            event.set()

    def roll_state(self) -> RollState:
        """The rollover's state (created on first use)."""
        roll = self.roll
        if roll is None:
            with _EVENT_LOCK:
                roll = self.roll
                if roll is None:
                    roll = self.roll = RollState()
        return roll

    @property
    def is_rolling(self) -> bool:
        """Has the handler been told to roll over (``Lease.rolling`` is set)?"""
        roll = self.roll
        return roll is not None and roll.signalled

    def signal_rolling(self) -> bool:
        """Tell the handler to roll over: the service's cap is near. False when it
        was told already."""
        roll = self.roll_state()
        with _EVENT_LOCK:
            if roll.signalled:
                return False
            roll.signalled = True
            event = roll.event
        if event is not None:
            event.set()
        return True

    def rolling_event(self) -> threading.Event:
        """The event set when the handler must roll over (created on first use)."""
        roll = self.roll_state()
        with _EVENT_LOCK:
            if roll.event is None:
                roll.event = threading.Event()
                if roll.signalled:
                    roll.event.set()
            return roll.event


class RollState:
    """What a lease near the service's cap carries, apart from the hot-path fields.

    signalled   the handler has been told to roll over (``Lease.rolling`` is set)
    event       that ``threading.Event``, created on first use
    checkpoint  the handler's latest ``Lease.checkpoint(state)``, as JSON text
                (None: none saved in this hop)
    capped      why the lease cannot be extended any more, once the service or
                the plan said so: with ``on_cap="rollover"`` it stays the
                handler's until its deadline, for the rollover to finish
    """

    __slots__ = ("capped", "checkpoint", "event", "signalled")

    def __init__(self) -> None:
        self.signalled = False
        self.event: threading.Event | None = None
        self.checkpoint: str | None = None
        self.capped: str | None = None
