"""The renewal engine: registry, extend pipeline, outcome handling and retry policy.

``RenewalEngine`` keeps registered leases invisible. It owns the scheduling
state (``_schedule.Schedule``) under one lock, decides when and for how long to
extend, sends the extends through a ``Dispatcher`` (a scheduler thread and a
bounded pool of dispatch threads, or inline on a driven clock), applies every
outcome, and ends leases that are lost, capped or abandoned. The handler's own
operations (complete, release) are ``_handler_ops.HandlerOps``, which works through
the engine's named methods (``end``, ``reschedule``, ``drain``).

The engine talks to leases only through ``LeaseRecord``'s public fields and to its
owner only through ``on_lost``, so the same engine can run in another process with
records of its own (the out-of-process renewer).

Rules it relies on are numbered as in docs/design.md.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Executor

from leasekeeper._calls import Calls
from leasekeeper._dispatch import Dispatcher
from leasekeeper._extend import Extender
from leasekeeper._metrics import Metrics, Stats, log_lapses
from leasekeeper._record import LeaseRecord, LeaseState
from leasekeeper._schedule import Lane, Schedule
from leasekeeper.backends.base import Backend, Message
from leasekeeper.clock import Clock, now_function
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import LeaseTooShort, ManagerClosed
from leasekeeper.observers import Observer

log = logging.getLogger("leasekeeper.manager")


_ACTIVE = LeaseState.ACTIVE
_INFINITY = math.inf
_COMPLETED = LeaseState.COMPLETED
_ABANDONED = LeaseState.ABANDONED
_weakref = weakref.ref


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


class RenewalEngine:
    """Keeps registered leases invisible until they end. See the module docstring.

    ``on_lost(record, reason)`` is called, on a leasekeeper thread and outside every
    lock, for each lease that is lost or abandoned.
    """

    def __init__(
        self,
        config: LeaseConfig,
        clock: Clock,
        *,
        on_lost: Callable[[LeaseRecord, str], object] | None = None,
        rng: random.Random | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.config = config
        self.clock = clock
        self.metrics = Metrics()
        # The extend threshold in force; with extend_threshold="auto", adapted to the
        # measured send lag and extend latency (adapt_threshold).
        self.threshold = config.threshold
        self._adaptive = config.adaptive
        self._threshold_bounds = config.threshold_bounds
        self._next_adapt = -math.inf
        self.on_lost = on_lost
        self._now = now_function(clock)
        self._minimal_life = config.minimal_life
        self._max_lease = config.max_lease_duration
        # Guards the schedule, the lifecycle flags and the metrics' counters.
        self.registry_lock = threading.Lock()
        self.schedule = Schedule(fill_window=min(config.timer_interval, self.threshold / 2))
        self.dispatcher = Dispatcher(
            self,
            self.registry_lock,
            tick=config.timer_interval,
            workers=config.max_concurrency,
            executor=executor,
        )
        self.rng = rng if rng is not None else random.Random()
        self.calls = Calls(on_error=self._count_callback_error)
        # Ended leases the observers have not heard of yet (only while there are any).
        self._ended: deque[tuple[LeaseRecord, LeaseState, str]] = deque()
        self.extender = Extender(self)
        self._lanes = self.schedule.lanes  # the same dict, one lookup shorter
        # Leases that ended and whose handler/callback have not been told yet: told
        # outside every lock, because on_lost may call back into the manager.
        self.pending: deque[LeaseRecord] = deque()

    # ------------------------------------------------------------------ lifecycle

    @property
    def closed(self) -> bool:
        """Closed: it takes no new leases and renews none (set by the dispatcher)."""
        return self.dispatcher.closed

    @property
    def started(self) -> bool:
        return self.dispatcher.started

    def start(self) -> None:
        with self.registry_lock:
            if self.dispatcher.closed:
                raise ManagerClosed("this LeaseManager is closed")
            self.dispatcher.start_locked()

    # ------------------------------------------------------------------ registry

    def register(
        self, message: Message, make: Callable[[Message, float], LeaseRecord]
    ) -> LeaseRecord:
        """Start renewing ``message``: the record ``make(message, now)`` builds, or the
        lease this engine already holds on that message.

        Half of the register/complete hot path (see ``make bench``): one lock, no scan,
        and every name it needs bound in ``__init__``.
        """
        visible_until = message.visible_until
        if not -_INFINITY < visible_until < _INFINITY:  # no comparison holds for NaN
            raise ValueError(
                f"message {message.id!r} has no finite deadline ({visible_until!r}): "
                "give it a finite visibility_timeout"
            )
        now = self._now()
        superseded = False
        lock = self.registry_lock
        lock.acquire()  # not ``with``: half the cost in CPython 3.11, on the hot path
        try:
            dispatcher = self.dispatcher
            if dispatcher.closed:
                raise ManagerClosed("this LeaseManager is closed; it takes no new leases")
            lane = self._lanes.get(id(message.backend))
            if lane is None:
                lane = self._add_lane(message.backend)
            message_id = message.id
            existing = lane.leases.get(message_id)
            if existing is not None:
                if existing.message is message or existing.receipt == message.receipt:
                    return existing
                # The message was received again with a new receipt while we still
                # held a lease on it: that lease lapsed and is not ours any more.
                if visible_until - now >= self._minimal_life:
                    self.end_locked(
                        existing, LeaseState.LOST, "the message was received again elsewhere"
                    )
                    superseded = True
            if visible_until - now < self._minimal_life:
                raise LeaseTooShort(message_id, visible_until - now, self._minimal_life)
            record = make(message, now)
            due = visible_until - self.threshold
            if self._max_lease is not None and now + self._max_lease < due:
                due = now + self._max_lease
            self.schedule.add(lane, message_id, record, due)
            self.metrics.registered += 1
            if due < dispatcher.next_wake or not dispatcher.started:
                self._wake_locked()
        finally:
            lock.release()
        if superseded:
            self.drain()  # told outside the lock: on_lost may call back in
        return record

    def _add_lane(self, backend: Backend) -> Lane:
        check_backend(backend, self.config)
        return self.schedule.add_lane(backend)

    def _wake_locked(self) -> None:
        """Start the dispatcher, or wake it for a lease due before it planned to wake."""
        dispatcher = self.dispatcher
        if dispatcher.started:
            dispatcher.wake_locked()
        else:
            dispatcher.start_locked()

    def get(self, message: Message) -> LeaseRecord | None:
        with self.registry_lock:
            lane = self.schedule.lane(message.backend)
            return None if lane is None else lane.leases.get(message.id)

    def records(self) -> list[LeaseRecord]:
        with self.registry_lock:
            return list(self.schedule.records())

    def count(self) -> int:
        with self.registry_lock:
            return self.schedule.count()

    def stats(self) -> Stats:
        with self.registry_lock:
            return self.metrics.snapshot(self.schedule.count(), self.threshold)

    def adapt_threshold(self, now: float) -> None:
        """With ``extend_threshold="auto"``: at most once a second, set the threshold
        to ``timer_interval + 3 x p99(send lag + extend latency)`` within its bounds,
        once 10 extend calls have been measured. (Called after each extend call.)"""
        if not self._adaptive or now < self._next_adapt:
            return
        self._next_adapt = now + 1.0
        metrics = self.metrics
        if metrics.extend_latency.count < 10:
            return
        late = metrics.send_lag.percentile(0.99) + metrics.extend_latency.percentile(0.99)
        floor, cap = self._threshold_bounds
        wanted = self.config.timer_interval + 3.0 * late
        threshold = min(cap, max(floor, wanted))
        if abs(threshold - self.threshold) > 0.05 * self.threshold:
            log.info("extend_threshold adapted: %.3fs (p99 lateness %.3fs)", threshold, late)
        self.threshold = threshold

    def add_observer(self, observer: Observer) -> None:
        with self.registry_lock:
            self.calls.observers = (*self.calls.observers, observer)

    def remove_observer(self, observer: Observer) -> None:
        with self.registry_lock:
            self.calls.observers = tuple(o for o in self.calls.observers if o is not observer)

    def _count_callback_error(self) -> None:
        with self.registry_lock:
            self.metrics.callback_errors += 1

    def count_scheduler_error(self) -> None:
        with self.registry_lock:
            self.metrics.scheduler_errors += 1

    # ------------------------------------------------------------------ scheduling

    def natural_due(self, record: LeaseRecord) -> float:
        """When ``record`` is next due: ``extend_threshold`` before its deadline, or at
        ``max_lease_duration`` so that abandonment is reported on time."""
        due = record.visible_until - self.threshold
        limit = self.config.max_lease_duration
        if limit is not None:
            due = min(due, record.registered_at + limit)
        return due

    def reschedule(self, record: LeaseRecord, due: float | None = None) -> None:
        """Schedule an active lease again (at its natural due time by default)."""
        with self.registry_lock:
            if record.state is not _ACTIVE or self.dispatcher.closed:
                return
            lane = self.schedule.lane(record.message.backend)
            if lane is None:
                return
            at = self.natural_due(record) if due is None else due
            self.schedule.push(lane, record, at)
            if at < self.dispatcher.next_wake:
                self.dispatcher.wake_locked()

    def collect_locked(self, now: float) -> list[tuple[Lane, list[LeaseRecord]]]:
        """Pop what is due (under the registry lock); end leases whose deadline
        passed while their extend call was out."""
        due = self.schedule.collect(now)
        for _lane, record in due.expired:
            # Rule 5: the deadline passed and the extend has not come back (a hung or
            # starved call): another consumer may have the message now.
            self.end_locked(
                record,
                LeaseState.LOST,
                "the extend call had not returned by the deadline",
            )
        if due.worst_lag >= 0:
            self.metrics.scheduler_lag.append(due.worst_lag)
        return due.work

    def next_due_locked(self) -> float | None:
        return self.schedule.next_due()

    # ------------------------------------------------------------------ extending

    def extend_batch(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        """Extend one chunk of due leases (runs on a dispatch thread)."""
        self.extender.extend_batch(lane, records)

    def count_lapses(self, records: Sequence[LeaseRecord], now: float) -> None:
        """Count (and log, rate-limited) leases whose deadline passed unextended."""
        with self.registry_lock:
            shown, suppressed = self.metrics.count_lapses([r.message.id for r in records], now)
        late = {r.message.id: now - r.visible_until for r in records}
        log_lapses([(mid, late[mid]) for mid in shown], suppressed)
        if self.calls.observers:
            for record in records:
                self.calls.tell("on_lapse", record, now - record.visible_until)

    # ------------------------------------------------------------------ ending

    def end_completed(self, record: LeaseRecord) -> None:
        """``end(record, COMPLETED, "completed")``, on the register/complete hot path
        (the op lock held: nothing else can end it meanwhile but a register that
        supersedes it, or close(), both under the registry lock checked here)."""
        message = record.message
        lock = self.registry_lock
        lock.acquire()  # not ``with``: half the cost in CPython 3.11, on the hot path
        try:
            if record.state is not _ACTIVE and record.state is not _ABANDONED:
                return
            record.state = _COMPLETED
            record.reason = "completed"
            # register(message) of this very message returns this lease, not a second one.
            message.ended_lease = _weakref(record)
            self.schedule.remove(self._lanes[id(message.backend)], record)
            self.metrics.completed += 1
        finally:
            lock.release()
        if self.calls.observers:
            self.calls.tell("on_ended", record, _COMPLETED, "completed")
        if self.pending:
            self.drain()

    def end(
        self, record: LeaseRecord, state: LeaseState, reason: str, *, stop_handler: bool = False
    ) -> None:
        with self.registry_lock:
            self.end_locked(record, state, reason, stop_handler=stop_handler)

    def end_locked(
        self, record: LeaseRecord, state: LeaseState, reason: str, *, stop_handler: bool = False
    ) -> None:
        """End an active lease (under the registry lock). Lost and abandoned leases
        are always signalled and reported; a released one is signalled only when
        ``stop_handler`` says the release was not its handler's own doing."""
        current = record.state
        if current is not _ACTIVE and not (
            # An abandoned lease whose message is still invisible may yet be deleted.
            current is LeaseState.ABANDONED and state is _COMPLETED
        ):
            return
        record.state = state
        record.reason = reason
        message = record.message
        # register(message) of this very message returns this lease, not a second one.
        message.ended_lease = weakref.ref(record)
        lane = self.schedule.lanes.get(id(message.backend))
        if lane is not None:
            self.schedule.remove(lane, record)
        if self.calls.observers:
            self._ended.append((record, state, reason))
        metrics = self.metrics
        if state is _COMPLETED:
            metrics.completed += 1
            return
        if state is LeaseState.RELEASED:
            metrics.released += 1
            if stop_handler:
                self.pending.append(record)
            return
        if state is LeaseState.FORGOTTEN:
            metrics.forgotten += 1
            return
        if state is LeaseState.LOST:
            metrics.lost += 1
        else:
            metrics.abandoned += 1
            metrics.capped += reason.startswith("capped")
        self.pending.append(record)

    def drain(self) -> None:
        """Signal and report ended leases outside every lock (callbacks may re-enter)."""
        pending = self.pending
        while pending:  # checked first: the common case is nothing to report
            try:
                record = pending.popleft()
            except IndexError:  # another thread took the last one
                break
            self._notify(record)
        ended = self._ended
        while ended:
            try:
                event = ended.popleft()
            except IndexError:
                break
            self.calls.tell("on_ended", *event)

    def _notify(self, record: LeaseRecord) -> None:
        # The handler hears first (lease.lost), so it can stop as early as possible;
        # on_lost runs after, on this same leasekeeper thread.
        record.signal()
        if record.state is LeaseState.RELEASED:
            return
        log.warning(
            "lease on message %r %s: %s", record.message.id, record.state.value, record.reason
        )
        if self.on_lost is not None:
            try:
                self.on_lost(record, record.reason or record.state.value)
            except Exception:
                with self.registry_lock:
                    self.metrics.callback_errors += 1
                log.exception("on_lost callback raised for message %r", record.message.id)
