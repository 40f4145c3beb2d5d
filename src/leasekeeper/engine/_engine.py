"""The renewal engine: the registry of leases, their schedule, and how each ends.

``RenewalEngine`` keeps registered leases invisible. It owns the scheduling state
(``_schedule.Schedule``), the counters (``_metrics``) and the busy flags of rule 4
(``_gate.OpGate``) under one lock - the registry lock - and runs its due work
through a ``Dispatcher`` (a scheduler thread and a bounded pool of dispatch
threads, or inline on a driven clock).

Its collaborators get named seams, never its internals: the ``Extender`` plans,
sends and applies extends, and the handler's operations (``_handler_ops``,
``_batch_ops``) complete, release and forget; each works on the engine as a
``Ledger`` (end, reschedule, count, drain) and makes its calls through the one
``Calls``. The engine talks to leases only through ``LeaseRecord``'s public
fields and to its owner only through ``on_lost``, so the same engine runs in the
renewer process with records of its own.

Rules it relies on are numbered as in docs/design.md.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.clock import Clock, now_function
from leasekeeper.config import LeaseConfig
from leasekeeper.engine._calls import Calls
from leasekeeper.engine._dispatch import Dispatcher, Work
from leasekeeper.engine._extend import Extender, hold_until, natural_due, rolling_at
from leasekeeper.engine._gate import OpGate
from leasekeeper.engine._lapse import lapsed
from leasekeeper.engine._ledger import Counter
from leasekeeper.engine._metrics import Metrics, log_lapses
from leasekeeper.engine._reporting import Reporter
from leasekeeper.engine._schedule import Lane, Schedule
from leasekeeper.engine._threshold import Threshold
from leasekeeper.engine._transitions import (
    COMPLETED,
    SUPERSEDED,
    OnLost,
    admit,
    closed_error,
    mark_ended,
    no_deadline,
    signals,
)
from leasekeeper.engine.stats import Stats
from leasekeeper.errors import ManagerClosed
from leasekeeper.observers import Observer
from leasekeeper.reasons import Ending, LostReason
from leasekeeper.record import LeaseRecord, LeaseState

log = logging.getLogger("leasekeeper.manager")

_ACTIVE = LeaseState.ACTIVE
_INFINITY = math.inf
_COMPLETED = LeaseState.COMPLETED

#: Builds a lease record of a message, registered at a time: ``Lease.maker(owner)``.
MakeRecord = Callable[[Message, float], LeaseRecord]


def check_backend(backend: object, config: LeaseConfig) -> None:
    """Raise TypeError/ConfigError unless ``backend`` can carry leases of ``config``."""
    if not isinstance(backend, Backend):
        raise TypeError(
            f"{type(backend).__qualname__} is not a leasekeeper backend "
            "(it needs receive, adopt, extend, delete, release, max_batch, "
            "max_visibility and rotates_receipts)"
        )
    batch, limit = backend.max_batch, backend.max_visibility
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise TypeError(f"{backend!r}.max_batch must be an integer >= 1, got {batch!r}")
    if (
        isinstance(limit, bool)
        or not isinstance(limit, (int, float))
        or not (math.isfinite(limit) and limit > 0)
    ):
        raise TypeError(f"{backend!r}.max_visibility must be seconds > 0, got {limit!r}")
    config.check_backend(backend, limit)


#: A held lease and until when its owner may hold it (``RenewalEngine.hold``).
Held = tuple[LeaseRecord, float]


class RenewalEngine:
    """Keeps registered leases invisible until they end. See the module docstring.

    ``on_lost(record, reason)`` is called, on a leasekeeper thread and outside every
    lock, for each lease that is lost or abandoned. ``calls`` is the one ``Calls``
    through which it and its collaborators reach backends.
    """

    def __init__(
        self,
        config: LeaseConfig,
        clock: Clock,
        calls: Calls,
        *,
        on_lost: OnLost | None = None,
        rng: random.Random | None = None,
        executor: Executor | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._now = now_function(clock)
        self._metrics = Metrics()
        # The extend threshold in force; with extend_threshold="auto", adapted to the
        # measured send lag and extend latency.
        self._threshold = Threshold(
            config,
            send_lag=self._metrics.send_lag,
            extend_latency=self._metrics.extend_latency,
        )
        self._minimal_life = config.minimal_life
        self._max_lease = config.max_lease_duration
        # on_cap="rollover": a lease is due early once, to tell its handler to roll over.
        self._rolls = config.on_cap == "rollover"
        self._limits_due = self._rolls or self._max_lease is not None
        # Guards the schedule, the lifecycle flags, the counters and the busy flags.
        self._lock = threading.Lock()
        # Its value, read on the register hot path (one attribute lookup, not two).
        self._threshold_now = self._threshold.value
        self._schedule = Schedule(fill_window=min(config.timer_interval, self._threshold.value / 2))
        self._lanes = self._schedule.lanes  # the same dict, one lookup shorter
        self._dispatcher = Dispatcher(
            self,
            self._lock,
            tick=config.timer_interval,
            workers=config.max_concurrency,
            executor=executor,
        )
        self._rng = rng if rng is not None else random.Random()
        self._calls = calls
        self.gate = OpGate(self._lock, self._now)
        self._extender = Extender(calls, self, self.gate, config=config, clock=clock, rng=self._rng)
        # Endings still to be told to handlers, on_lost and observers (outside the lock).
        self._reporter = Reporter(calls, on_lost, self.count_callback_error)
        self._pending = self._reporter.pending  # the same deque, one lookup shorter

    # ------------------------------------------------------------------ what it shares

    @property
    def config(self) -> LeaseConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def rng(self) -> random.Random:
        return self._rng

    @property
    def lock(self) -> threading.Lock:
        """The registry lock: the handler operations' hot path sets busy flags under it."""
        return self._lock

    # ------------------------------------------------------------------ lifecycle

    @property
    def closed(self) -> bool:
        """Closed: it takes no new leases and renews none (set by the dispatcher)."""
        return self._dispatcher.closed

    @property
    def started(self) -> bool:
        return self._dispatcher.started

    @property
    def running(self) -> bool:
        return self._dispatcher.running

    def start(self) -> None:
        with self._lock:
            if self._dispatcher.closed:
                raise ManagerClosed("this LeaseManager is closed")
            self._dispatcher.start_locked()

    def stop(self, deadline: float | None) -> bool:
        """Stop renewing and wait (until ``deadline``) for the calls in flight.
        False, doing nothing, when it was stopped already."""
        return self._dispatcher.stop(deadline)

    def shutdown(self, deadline: float | None) -> None:
        """Shut the dispatch pool down (after ``stop``)."""
        self._dispatcher.shutdown(deadline)

    def submit(self, fn: Callable[..., object], *args: Any) -> None:
        self._dispatcher.submit(fn, *args)

    def run_all(
        self, tasks: Sequence[tuple[Callable[..., object], tuple[Any, ...]]], deadline: float | None
    ) -> list[bool]:
        return self._dispatcher.run_all(tasks, deadline)

    # ------------------------------------------------------------------ registry

    def register(self, message: Message, make: MakeRecord) -> LeaseRecord:
        """Start renewing ``message``: the record ``make(message, now)`` builds, or the
        lease this engine already holds on that message.

        Half of the register/complete hot path (see ``make bench``): one lock, no scan,
        and every name it needs bound in ``__init__``.
        """
        visible_until = message.visible_until
        if not -_INFINITY < visible_until < _INFINITY:  # no comparison holds for NaN
            raise no_deadline(message)
        now = self._now()
        existing = None
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost in CPython 3.11, on the hot path
        try:
            dispatcher = self._dispatcher
            if dispatcher.closed:
                raise closed_error()
            lane = self._lanes.get(id(message.backend))
            if lane is None:
                lane = self._add_lane(message.backend)
            message_id = message.id
            existing = lane.leases.get(message_id)
            # admit() decides (the same lease, too short, superseded) whenever there
            # is anything to decide: not for the common new message with time left.
            if existing is not None or visible_until - now < self._minimal_life:
                same = admit(existing, message, now, self._minimal_life)
                if same is not None:
                    return same
            if existing is not None:
                # Received again with a new receipt while we still held a lease on
                # it: that lease lapsed and is not ours any more.
                self.end_locked(existing, LeaseState.LOST, SUPERSEDED)
            record = make(message, now)
            # A message that arrived with less left than the threshold is due at once
            # (the extender says so once, and counts no send lag for it).
            due = visible_until - self._threshold_now
            if self._limits_due:  # max_lease_duration or rollovers: one check when neither
                due = self._limited_due(message, now, due)
            self._schedule.add(lane, message_id, record, due)
            self._metrics.registered += 1
            if due < dispatcher.next_wake or not dispatcher.started:
                self._wake_locked()
        finally:
            lock.release()
        if existing is not None:
            self.drain()  # the superseded one, told outside the lock: on_lost may call back in
        return record

    def hold(self, message: Message, make: MakeRecord, late: bool = False) -> Held | None:
        """``make(message, now)``'s record, counted registered but not scheduled, and
        until when its owner may hold it back (``_extend.hold_until``). None: register
        it (a lease on its message is here, or that time passed and not ``late``)."""
        now = self._now()
        until = hold_until(message, self._config, self._threshold.value, self._limits_due)
        waits = now < until or (late and until > -math.inf)
        with self._lock:
            lane = self._lanes.get(id(message.backend))
            if not waits or self._dispatcher.closed or (lane and message.id in lane.leases):
                return None
            self._metrics.registered += 1
        return make(message, now), until

    def adopt(self, record: LeaseRecord) -> None:
        """Schedule ``record`` (from ``hold``), due as if registered then. A lease found
        on its message is older (adopted before any other is registered): superseded."""
        message = record.message
        with self._lock:
            if self._dispatcher.closed:
                raise closed_error()
            lane = self._lanes.get(id(message.backend)) or self._add_lane(message.backend)
            existing = lane.leases.get(message.id)
            if existing is not None:
                self.end_locked(existing, LeaseState.LOST, SUPERSEDED)
            due = self.natural_due(record)
            self._schedule.add(lane, message.id, record, due)
            if due < self._dispatcher.next_wake or not self._dispatcher.started:
                self._wake_locked()
        self.drain()

    def end_held(self, records: Sequence[LeaseRecord]) -> None:
        """End ``records`` (from ``hold``, never scheduled, deleted in time) completed."""
        with self._lock:
            self._metrics.completed += sum(mark_ended(r, _COMPLETED, COMPLETED) for r in records)
        for record in records if self._calls.observers else ():
            self._calls.tell("on_ended", record, _COMPLETED, "completed")

    def _limited_due(self, message: Message, now: float, due: float) -> float:
        """A new lease's first due time under ``max_lease_duration`` (abandonment on
        time) and ``on_cap="rollover"`` (the handler told early enough)."""
        if self._max_lease is not None and now + self._max_lease < due:
            due = now + self._max_lease
        if self._rolls and message.hard_deadline is not None:
            due = max(now, min(due, rolling_at(message.hard_deadline, self._threshold.value)))
        return due

    def _add_lane(self, backend: Backend) -> Lane:
        check_backend(backend, self._config)
        return self._schedule.add_lane(backend)

    def _wake_locked(self) -> None:
        """Start the dispatcher, or wake it for a lease due before it planned to wake."""
        dispatcher = self._dispatcher
        if dispatcher.started:
            dispatcher.wake_locked()
        else:
            dispatcher.start_locked()

    def get(self, message: Message) -> LeaseRecord | None:
        with self._lock:
            lane = self._schedule.lane(message.backend)
            return None if lane is None else lane.leases.get(message.id)

    def records(self) -> list[LeaseRecord]:
        with self._lock:
            return list(self._schedule.records())

    def count(self) -> int:
        with self._lock:
            return self._schedule.count()

    def stats(self) -> Stats:
        with self._lock:
            return self._metrics.snapshot(self._schedule.count(), self._threshold.value)

    def add_observer(self, observer: Observer) -> None:
        with self._lock:
            self._calls.observers = (*self._calls.observers, observer)

    def remove_observer(self, observer: Observer) -> None:
        with self._lock:
            self._calls.observers = tuple(o for o in self._calls.observers if o is not observer)

    def count_callback_error(self) -> None:
        with self._lock:
            self._metrics.callback_errors += 1

    # ------------------------------------------------------------------ the Ledger

    @property
    def threshold(self) -> float:
        return self._threshold.value

    def bump(self, counter: Counter, n: int = 1) -> None:
        with self._lock:
            setattr(self._metrics, counter, getattr(self._metrics, counter) + n)

    def timed(self, send_lag: float, latency: float) -> bool:
        if not self._threshold.sample(send_lag, latency):
            return False
        with self._lock:
            return self._metrics.margin_warning_due(self._now())

    def adapt_threshold(self, now: float) -> None:
        self._threshold.adapt(now)
        self._threshold_now = self._threshold.value

    def natural_due(self, record: LeaseRecord) -> float:  # (``_extend.natural_due``)
        return natural_due(record, self._threshold.value, self._max_lease, rolls=self._rolls)

    def reschedule(self, record: LeaseRecord, due: float | None = None) -> None:
        with self._lock:
            if record.state is not _ACTIVE or self._dispatcher.closed:
                return
            lane = self._schedule.lane(record.message.backend)
            if lane is None:
                return
            at = self.natural_due(record) if due is None else due
            self._schedule.push(lane, record, at)
            if at < self._dispatcher.next_wake:
                self._dispatcher.wake_locked()

    def watch_deadlines(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        with self._lock:
            for record in records:
                self._schedule.watch(lane, record)
            earliest = min(record.visible_until for record in records)
            if earliest < self._dispatcher.next_wake:
                self._dispatcher.wake_locked()

    def count_lapses(self, records: Sequence[LeaseRecord], now: float) -> None:
        with self._lock:
            shown, suppressed = self._metrics.count_lapses([r.message.id for r in records], now)
        late = {r.message.id: now - r.visible_until for r in records}
        log_lapses([(mid, late[mid]) for mid in shown], suppressed)
        if self._calls.observers:
            for record in records:
                self._calls.tell("on_lapse", record, now - record.visible_until)

    def end_completed(self, record: LeaseRecord) -> None:
        """``end(record, COMPLETED, ...)`` and give the lease back, on the
        register/complete hot path (the lease taken: nothing else can end it meanwhile
        but a register that supersedes it, or close(), both under the registry lock
        checked here)."""
        message = record.message
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost in CPython 3.11, on the hot path
        try:
            record.busy = False  # OpGate.give_locked, inline: the hot path
            if self.gate.waiting:
                self.gate.notify_locked()
            if not mark_ended(record, _COMPLETED, COMPLETED):
                return
            self._schedule.remove(self._lanes[id(message.backend)], record)
            self._metrics.completed += 1
        finally:
            lock.release()
        if self._calls.observers:
            self._calls.tell("on_ended", record, _COMPLETED, "completed")
        if self._pending:  # the reporter's queue: checked first, it is mostly empty
            self._reporter.drain()

    def end(
        self, record: LeaseRecord, state: LeaseState, ending: Ending, *, stop_handler: bool = False
    ) -> None:
        with self._lock:
            self.end_locked(record, state, ending, stop_handler=stop_handler)

    def end_locked(
        self, record: LeaseRecord, state: LeaseState, ending: Ending, *, stop_handler: bool = False
    ) -> None:
        """End an active lease (under the registry lock). Lost and abandoned leases
        are always signalled and reported; a released one is signalled only when
        ``stop_handler`` says the release was not its handler's own doing."""
        if not mark_ended(record, state, ending):
            return
        message = record.message
        lane = self._lanes.get(id(message.backend))
        if lane is not None:
            self._schedule.remove(lane, record)
        metrics = self._metrics
        if state is _COMPLETED:
            metrics.completed += 1
        elif state is LeaseState.RELEASED:
            metrics.released += 1
        elif state is LeaseState.FORGOTTEN:
            metrics.forgotten += 1
        else:
            if state is LeaseState.LOST:
                metrics.lost += 1
            else:
                metrics.abandoned += 1
                metrics.capped += ending.lost_reason is LostReason.CAPPED
            if ending.lost_reason is not None:
                reasons = metrics.lost_reasons
                reasons[ending.lost_reason.value] = reasons.get(ending.lost_reason.value, 0) + 1
        self._reporter.queue_locked(record, state, signal=signals(state, stop_handler))

    def drain(self) -> None:
        """Signal and report ended leases outside every lock (callbacks may re-enter)."""
        self._reporter.drain()

    # ------------------------------------------------------------------ for the dispatcher

    def has_pending(self) -> bool:
        return self._reporter.has_pending()

    def collect_locked(self, now: float) -> Work:
        """Pop what is due (under the registry lock); end leases whose deadline
        passed while their extend call was out (rule 5)."""
        due = self._schedule.collect(now)
        for _lane, record in due.expired:
            ending = lapsed(record, now, "extend", "call out")
            if ending is not None:
                self.end_locked(record, LeaseState.LOST, ending)
        if due.worst_lag >= 0:
            self._metrics.scheduler_lag.append(due.worst_lag)
        return due.work

    def next_due_locked(self) -> float | None:
        return self._schedule.next_due()

    def extend_batch(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        """Extend one chunk of due leases (runs on a dispatch thread)."""
        self._extender.extend_batch(lane, records)

    def count_scheduler_error(self) -> None:
        with self._lock:
            self._metrics.scheduler_errors += 1

    # Driven-clock protocol (leasekeeper.clock.ClockDriven), for tests that step it.
    def next_wakeup(self) -> float | None:
        return self._dispatcher.next_wakeup()

    def run_due(self) -> None:
        self._dispatcher.run_due()
