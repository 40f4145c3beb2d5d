"""LeaseManager: the registry of leases, one scheduler thread, and a bounded dispatch pool.

How renewal works
-----------------
Each backend the manager has seen gets a *lane*: its leases by message id and a
min-heap of (due time, generation, message id). A lease is due when less than
``extend_threshold`` of its invisibility remains (or when ``max_lease_duration``
runs out, so abandonment is reported on time). One scheduler thread sleeps until
the earliest due time of all lanes (never longer than ``timer_interval``), pops
only the due leases - O(k log n), never a scan of all n - fills a partial batch
with leases due within the next tick (a batch call costs the same for 1 entry or
10), chunks them by the backend's ``max_batch`` and hands the chunks to a thread
pool of ``max_concurrency`` threads, because MNS and Azure have no batch extend.

Heap entries are never removed in place: a lease that completes or is
rescheduled bumps its generation and its old entry is skipped when popped. An
entry names the message id, not the lease, so a completed lease (and its
message body) is freed at once rather than when its stale entry surfaces. The
heap is rebuilt when stale entries outnumber live ones, so memory stays
proportional to the leases in flight.

On a driven clock (``leasekeeper.testing.ManualClock``) there is no scheduler
thread: ``clock.advance()`` calls ``run_due`` at each due time in order and the
batches run inline, so tests are deterministic and fast.
"""

from __future__ import annotations

import heapq
import logging
import math
import random
import threading
import weakref
from array import array
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from leasekeeper.backends.base import Backend, Message, Outcome, chunked
from leasekeeper.clock import SYSTEM_CLOCK, Clock, DrivenClock
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import BackendError, LeaseError, LeaseLost, LeaseTooShort, ManagerClosed
from leasekeeper.lease import Lease, LeaseState

if TYPE_CHECKING:
    from types import TracebackType

log = logging.getLogger("leasekeeper.manager")

P = ParamSpec("P")
R = TypeVar("R")

OnLost = Callable[[Lease, str], object]

# Retry of a failed extend: exponential from 50 ms to 5 s, jittered, and never later
# than half the time the lease has left (so several attempts fit before it lapses).
_RETRY_BASE = 0.05
_RETRY_CAP = 5.0
# A handler's delete/release is retried this many times on transient errors before
# the error reaches the handler.
_OP_ATTEMPTS = 4
_SAMPLES = 2048  # lag / latency samples kept for percentiles
_WARN_EVERY = 60.0  # seconds between repeated "margin too thin" warnings
_LAPSE_LINES = 10  # lapse warnings logged one by one per _WARN_EVERY window


@dataclass(frozen=True)
class Stats:
    """A snapshot of a manager's counters. Times are seconds."""

    in_flight: int
    registered: int
    extended: int  # leases successfully extended (one per lease per extension)
    extend_calls: int  # backend extend calls (a batch is one call)
    extend_errors: int  # entries that came back retry/fatal, or calls that raised
    retries: int
    lost: int
    completed: int
    released: int
    abandoned: int
    capped: int  # abandoned because the service's total-visibility cap was reached
    lapses: int  # extends sent after the lease's own deadline had passed
    callback_errors: int
    scheduler_errors: int
    margin_warnings: int  # times lag + call latency ate into the extend threshold
    scheduler_lag_p50: float  # how late the scheduler woke for the earliest due lease
    scheduler_lag_p99: float
    send_lag_p50: float  # due -> extend sent: wake lag plus waiting for a dispatch thread
    send_lag_p99: float
    extend_latency_p50: float
    extend_latency_p99: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


class _SampleRing:
    """The last ``size`` timing samples, in storage allocated once.

    A ``deque(maxlen=...)`` of floats grows (one float object per sample) until it
    is full, which over a long run looks exactly like a leak; this ring holds raw
    doubles in a preallocated array, so the manager's footprint is the same in its
    first minute and its hundredth. Appends come from several threads without a
    lock: a race can at worst overwrite one sample, which percentiles shrug off.
    """

    __slots__ = ("_count", "_data", "_next")

    def __init__(self, size: int) -> None:
        self._data = array("d", bytes(8 * size))
        self._next = 0
        self._count = 0

    def append(self, value: float) -> None:
        i = self._next
        self._data[i] = value
        self._next = (i + 1) % len(self._data)
        if self._count < len(self._data):
            self._count += 1

    def snapshot(self) -> list[float]:
        return self._data[: self._count].tolist()


def _percentile(samples: Iterable[float], q: float) -> float:
    ordered = sorted(samples)
    if not ordered:
        return 0.0
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return ordered[index]


def _valid_delay(delay: object) -> bool:
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        return False
    try:
        return math.isfinite(delay) and delay >= 0
    except OverflowError:  # an int beyond float range
        return False


_KINDS = frozenset(("ok", "lost", "retry", "capped", "fatal"))


def _well_formed(outcomes: object, expected: int) -> bool:
    """One Outcome per handle, each of a known kind, receipts None or a non-empty str."""
    if not isinstance(outcomes, list) or len(outcomes) != expected:
        return False
    for outcome in outcomes:
        if not isinstance(outcome, Outcome) or outcome.kind not in _KINDS:
            return False
        receipt = outcome.receipt
        if receipt is not None and (type(receipt) is not str or not receipt):
            return False
    return True


class _Lane:
    """One backend's leases and renewal heap."""

    __slots__ = ("backend", "heap", "leases", "stale", "watch")

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.leases: dict[str, Lease] = {}
        self.heap: list[tuple[float, int, str]] = []  # (due, generation, message id)
        self.stale = 0  # heap entries whose lease has moved on
        # (deadline, watch generation, message id) of leases whose extend call is out:
        # if one has not returned by the deadline, the lease is lost there and then.
        self.watch: list[tuple[float, int, str]] = []

    def live(self, gen: int, message_id: str) -> Lease | None:
        """The lease a heap entry stands for, or None if the entry is stale."""
        lease = self.leases.get(message_id)
        return lease if lease is not None and lease._gen == gen else None

    def head_due(self) -> float | None:
        """The earliest live due time, dropping stale entries off the top."""
        heap = self.heap
        while heap:
            due, gen, message_id = heap[0]
            if self.live(gen, message_id) is not None:
                return due
            heapq.heappop(heap)
            self.stale -= 1
        return None

    def head_watch(self) -> float | None:
        """The earliest deadline still being watched. Entries whose extend call has
        come back are dropped off the top, so they wake nobody."""
        watch = self.watch
        while watch:
            deadline, gen, message_id = watch[0]
            lease = self.leases.get(message_id)
            if lease is not None and lease._watch == gen:
                return deadline
            heapq.heappop(watch)
        return None


class LeaseScope:
    """``with manager.lease(msg) as lease:``: complete on success, release on error.

    On normal exit the message is deleted; if the lease was lost meanwhile,
    ``LeaseLost`` is raised instead and nothing is deleted. On an exception the
    message is released (after ``release_delay``) and the exception propagates.
    """

    __slots__ = ("_delay", "_lease", "_manager", "_message")

    def __init__(self, manager: LeaseManager, message: Message, release_delay: float | None):
        self._manager = manager
        self._message = message
        self._delay = release_delay
        self._lease: Lease | None = None

    def __enter__(self) -> Lease:
        self._lease = self._manager.register(self._message)
        return self._lease

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lease = self._lease
        assert lease is not None, "LeaseScope exited without entering"
        if exc_type is None:
            try:
                lease.complete()
            except BackendError:
                # The handler succeeded but the delete keeps failing: stop renewing so
                # the message comes back and is done again, rather than hide it for ever.
                lease._manager._abandon(lease, "delete failed: left to lapse")
                raise
            return
        try:
            lease.release(self._delay)
        except Exception:
            # The handler's own exception matters more; the lease is left to
            # lapse, so the message still comes back.
            log.exception("release of message %r after a handler error failed", lease.id)


class LeaseManager:
    """Keeps registered messages invisible until they are completed or released.

    ``LeaseManager(backend=None, config=None, *, on_lost=None, clock=None, **fields)``:
    keyword ``fields`` are a shortcut for ``config=LeaseConfig(**fields)``.
    ``backend`` is optional: a manager renews messages of any backend; naming one
    checks the config against its limits up front. ``on_lost(lease, reason)`` is
    called (from a leasekeeper thread) for every lease that is lost or abandoned.
    """

    def __init__(
        self,
        backend: Backend | None = None,
        config: LeaseConfig | None = None,
        *,
        on_lost: OnLost | None = None,
        clock: Clock | None = None,
        **config_fields: Any,
    ) -> None:
        self.config = LeaseConfig.from_fields(config, config_fields)
        self.backend = backend
        self.clock: Clock = clock if clock is not None else SYSTEM_CLOCK
        self._on_lost = on_lost
        self._threshold = self.config.threshold
        self._fill_window = min(self.config.timer_interval, self._threshold / 2)

        # Guards the lanes (registries and heaps), the lifecycle flags and the counters.
        self._registry_lock = threading.Lock()
        # The scheduler sleeps on this; register() wakes it for a lease due earlier.
        self._wakeup = threading.Condition(self._registry_lock)
        self._lanes: dict[int, _Lane] = {}
        self._gen = 0
        self._next_wake = -math.inf  # when the scheduler will wake; -inf while awake
        self._started = False
        self._closed = False
        self._driven = isinstance(self.clock, DrivenClock)
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._inflight: set[Future[None]] = set()
        self._rng = random.Random()
        self._closing_thread: threading.Thread | None = None
        self._last_margin_warning = -math.inf

        self._registered = self._extended = self._extend_calls = self._extend_errors = 0
        self._retries = self._lost = self._completed = self._released = 0
        self._abandoned = self._capped = self._lapses = 0
        self._callback_errors = self._scheduler_errors = self._margin_warnings = 0
        self._lag = _SampleRing(_SAMPLES)
        self._send_lag = _SampleRing(_SAMPLES)
        self._latency = _SampleRing(_SAMPLES)
        # Lapse warnings: a few lines per window, then one line saying how many more.
        self._lapse_window = -math.inf
        self._lapse_lines = 0
        self._lapses_unlogged = 0
        # Leases that ended and whose handler/callback have not been told yet: told
        # outside every lock, because on_lost may call back into the manager.
        self._pending: deque[Lease] = deque()

        if backend is not None:
            self._check_backend(backend)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> LeaseManager:
        """Start the scheduler. Implicit on the first register; returns self."""
        with self._registry_lock:
            if self._closed:
                raise ManagerClosed("this LeaseManager is closed")
            self._start_locked()
        return self

    def _start_locked(self) -> None:
        if self._started:
            return
        self._started = True
        if self._driven:
            self.clock.attach(self)  # type: ignore[attr-defined]
            return
        workers = self.config.max_concurrency
        self._pool = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix="leasekeeper-dispatch"
        )
        # ThreadPoolExecutor starts a thread inside submit() when none is idle, and a
        # thread start waits for the new thread to run: under GIL pressure that blocks
        # the scheduler for tens of milliseconds per thread. Start them all now: each
        # task waits at the barrier, so every submit finds no idle thread.
        gate = threading.Barrier(workers)
        for _ in range(workers):
            self._pool.submit(gate.wait, 10.0)
        self._thread = threading.Thread(target=self._run, name="leasekeeper-scheduler", daemon=True)
        self._thread.start()

    def __enter__(self) -> LeaseManager:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, release: bool = True, timeout: float | None = None) -> None:
        """Stop renewing. With ``release=True`` (the default) every lease still active
        is released at once so other workers get its message without waiting out
        the timeout, and its handler sees ``lease.lost`` set. With ``release=False``
        active leases are left as they are, unrenewed: they may still be completed
        until they lapse. ``timeout`` bounds the wait for in-flight backend calls.
        Closing twice does nothing.
        """
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not (timeout >= 0 and math.isfinite(timeout))
        ):
            # Checked before anything changes: a half-closed manager releases nothing.
            raise ValueError(f"close() timeout must be None or seconds >= 0, got {timeout!r}")
        with self._wakeup:
            if self._closed:
                return
            self._closed = True
            self._wakeup.notify_all()
        deadline = None if timeout is None else self.clock.now() + timeout
        # Called from on_lost, on one of our own dispatch threads: waiting for our own
        # task (or joining our own thread) would never end.
        self._closing_thread = threading.current_thread()
        own = self._closing_thread in self._pool_threads()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._inflight and not own:
            remaining = None if deadline is None else max(0.0, deadline - self.clock.now())
            wait_futures(list(self._inflight), timeout=remaining)
        if self._driven and self._started:
            self.clock.detach(self)  # type: ignore[attr-defined]
        if release:
            self._release_all(deadline)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            # Leave no leasekeeper thread behind: join the pool's threads, within the
            # timeout (a backend call that hangs keeps its thread, and we say so).
            for thread in self._pool_threads():
                if thread is self._closing_thread:
                    continue
                remaining = None if deadline is None else max(0.0, deadline - self.clock.now())
                thread.join(remaining)
                if thread.is_alive():
                    log.warning("close(): %s is still in a backend call", thread.name)

    def _pool_threads(self) -> list[threading.Thread]:
        return list(getattr(self._pool, "_threads", ()))

    def _release_all(self, deadline: float | None) -> None:
        """Release every active lease, in batches, on the dispatch pool: a backend
        without batch calls (MNS, Azure) would otherwise take one round trip per
        lease, one after another, while a shutdown waits."""
        with self._registry_lock:
            lanes = [(lane, list(lane.leases.values())) for lane in self._lanes.values()]
        chunks: list[tuple[Backend, Sequence[Lease]]] = []
        for lane, leases in lanes:
            locked: list[Lease] = []
            for lease in leases:
                wait = -1.0 if deadline is None else max(0.0, deadline - self.clock.now())
                # A handler may be mid-delete: wait for it rather than race it.
                if lease._op_lock.acquire(timeout=wait):
                    if lease._state is LeaseState.ACTIVE:
                        locked.append(lease)
                    else:
                        lease._op_lock.release()
            chunks += [(lane.backend, c) for c in chunked(locked, lane.backend.max_batch)]
        on_pool = self._closing_thread in self._pool_threads()
        if self._pool is None or len(chunks) < 2 or on_pool:
            for backend, chunk in chunks:
                self._release_chunk(backend, chunk)
        else:
            futures = [(self._pool.submit(self._release_chunk, b, c), c) for b, c in chunks]
            remaining = None if deadline is None else max(0.0, deadline - self.clock.now())
            wait_futures([f for f, _ in futures], timeout=remaining)
            for future, chunk in futures:
                if future.cancel():  # still queued at the timeout: never sent
                    for lease in chunk:
                        self._end(
                            lease,
                            LeaseState.RELEASED,
                            "close() timed out before releasing it: it lapses",
                            stop_handler=True,
                        )
                        lease._op_lock.release()
        self._drain_notifications()

    def _release_chunk(self, backend: Backend, chunk: Sequence[Lease]) -> None:
        """Release one batch of leases whose op locks the caller took; unlock them."""
        try:
            outcomes = self._call(backend, "release", chunk, 0.0)
            for lease, outcome in zip(chunk, outcomes, strict=True):
                if outcome.kind not in ("ok", "lost"):
                    log.warning(
                        "close(): release of message %r failed (%s: %s); "
                        "it reappears when its invisibility runs out",
                        lease.id,
                        outcome.kind,
                        outcome.detail,
                    )
                self._end(lease, LeaseState.RELEASED, "released by close()", stop_handler=True)
        finally:
            for lease in chunk:
                lease._op_lock.release()
            self._drain_notifications()  # close() may have returned already

    # ------------------------------------------------------------------ registering

    def register(self, message: Message) -> Lease:
        """Start renewing ``message`` and return its lease.

        Raises ``LeaseTooShort`` if it has less than ``minimal_life`` of invisibility
        left and ``ManagerClosed`` after ``close()``. Registering a message that is
        already leased returns the same lease.
        """
        if not isinstance(message, Message):
            raise TypeError(
                "register() takes a leasekeeper Message (from backend.receive() or "
                f"backend.adopt(raw)), got {type(message).__module__}."
                f"{type(message).__qualname__}"
            )
        visible_until = message.visible_until
        if not math.isfinite(visible_until):
            raise ValueError(
                f"message {message.id!r} has no finite deadline ({visible_until!r}): "
                "give it a finite visibility_timeout"
            )
        now = self.clock.now()
        backend = message.backend
        superseded: Lease | None = None
        with self._registry_lock:  # the lock under self._wakeup, minus a wrapper call
            if self._closed:
                raise ManagerClosed("this LeaseManager is closed; it takes no new leases")
            lane = self._lanes.get(id(backend))
            if lane is None:
                self._check_backend(backend)
                lane = self._lanes[id(backend)] = _Lane(backend)
            finished: Lease | None = (
                message._lease_ref() if message._lease_ref is not None else None
            )
            if finished is not None and finished._manager is self:
                return finished  # its lease ended: the same lease, not a second one
            existing = lane.leases.get(message.id)
            if existing is not None:
                if existing.message is message or existing.message.receipt == message.receipt:
                    return existing
                # The message was received again with a new receipt while we still
                # held a lease on it: that lease lapsed and is not ours any more.
                superseded = existing
            remaining = visible_until - now
            if remaining < self.config.minimal_life:
                raise LeaseTooShort(message.id, remaining, self.config.minimal_life)
            if superseded is not None:
                self._end_locked(
                    superseded, LeaseState.LOST, "the message was received again elsewhere"
                )
            lease = Lease(message, self, now)
            lane.leases[message.id] = lease
            self._registered += 1
            self._schedule_locked(lane, lease, self._natural_due(lease))
            if not self._started:
                self._start_locked()
        if superseded is not None:
            self._drain_notifications()
        return lease

    def lease(self, message: Message, *, release_delay: float | None = None) -> LeaseScope:
        """``with manager.lease(msg) as lease:`` - see ``LeaseScope``."""
        return LeaseScope(self, message, release_delay)

    def leased(
        self, func: Callable[P, R] | None = None, *, release_delay: float | None = None
    ) -> Any:
        """Decorator: ``@manager.leased`` or ``@manager.leased(release_delay=5)``."""
        from leasekeeper.decorator import leased

        return leased(func, manager=self, release_delay=release_delay)

    def _check_backend(self, backend: Backend) -> None:
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
        self.config.check_backend(backend, limit)

    def get(self, message: Message) -> Lease | None:
        """The active lease on ``message``, if any."""
        with self._registry_lock:
            lane = self._lanes.get(id(message.backend))
            return None if lane is None else lane.leases.get(message.id)

    def leases(self) -> list[Lease]:
        """A snapshot list of the active leases."""
        with self._registry_lock:
            return [lease for lane in self._lanes.values() for lease in lane.leases.values()]

    # ------------------------------------------------------------------ scheduling

    def _natural_due(self, lease: Lease) -> float:
        due = lease.visible_until - self._threshold
        limit = self.config.max_lease_duration
        if limit is not None:
            due = min(due, lease.registered_at + limit)
        return due

    def _schedule_locked(self, lane: _Lane, lease: Lease, due: float) -> None:
        if lease._gen:
            lane.stale += 1  # its previous entry is now dead weight
        self._gen += 1
        lease._gen = self._gen
        lease._due = due
        heapq.heappush(lane.heap, (due, self._gen, lease.message.id))
        if lane.stale > 64 and lane.stale * 2 > len(lane.heap):
            lane.heap = [e for e in lane.heap if lane.live(e[1], e[2]) is not None]
            heapq.heapify(lane.heap)
            lane.stale = 0
        if due < self._next_wake:
            self._wakeup.notify()

    def _reschedule(self, lease: Lease, due: float | None = None) -> None:
        with self._registry_lock:
            if lease._state is not LeaseState.ACTIVE or self._closed:
                return
            lane = self._lanes[id(lease.message.backend)]
            self._schedule_locked(lane, lease, self._natural_due(lease) if due is None else due)

    def _collect_due(self, now: float) -> list[tuple[_Lane, list[Lease]]]:
        """Pop every due lease, plus early ones that fill a partial batch."""
        work: list[tuple[_Lane, list[Lease]]] = []
        worst_lag = -1.0
        for lane in self._lanes.values():
            watch = lane.watch
            while watch and watch[0][0] <= now:
                _, gen, message_id = heapq.heappop(watch)
                lease = lane.leases.get(message_id)
                if lease is not None and lease._watch == gen:
                    # Rule 5: the deadline passed and the extend has not come back (a
                    # hung call): another consumer may have the message now.
                    self._end_locked(
                        lease, LeaseState.LOST, "the extend call had not returned by the deadline"
                    )
            heap = lane.heap
            due_leases: list[Lease] = []
            batch = lane.backend.max_batch
            horizon = now
            while heap:
                due, gen, message_id = heap[0]
                lease = lane.live(gen, message_id)
                if lease is None:
                    heapq.heappop(heap)
                    lane.stale -= 1
                    continue
                if due > horizon:
                    if batch > 1 and due_leases and len(due_leases) % batch:
                        horizon = now + self._fill_window  # top up the last batch
                        if due <= horizon:
                            continue
                    break
                heapq.heappop(heap)
                lease._gen = 0
                if due <= now:
                    worst_lag = max(worst_lag, now - due)
                due_leases.append(lease)
                if horizon > now and len(due_leases) % batch == 0:
                    break
            if due_leases:
                work.append((lane, due_leases))
        if worst_lag >= 0:
            self._lag.append(worst_lag)
        return work

    def _next_due_locked(self) -> float | None:
        best: float | None = None
        for lane in self._lanes.values():
            due = lane.head_due()
            watched = lane.head_watch()
            if watched is not None and (due is None or watched < due):
                due = watched
            if due is not None and (best is None or due < best):
                best = due
        return best

    def _run(self) -> None:
        """The scheduler thread: sleep until the earliest due lease, dispatch, repeat."""
        tick = self.config.timer_interval
        while True:
            try:
                with self._wakeup:
                    if self._closed:
                        return
                    now = self.clock.now()
                    work = self._collect_due(now)
                    if not work and not self._pending:
                        next_due = self._next_due_locked()
                        wait = tick if next_due is None else min(max(0.0, next_due - now), tick)
                        self._next_wake = now + wait
                        self.clock.wait(self._wakeup, wait)
                        self._next_wake = -math.inf
                        continue
                self._drain_notifications()  # leases a watch ended, told outside the lock
                self._dispatch(work)
            except Exception:
                # Rule 6: the scheduler never dies. Count, log, carry on after a tick.
                self._scheduler_errors += 1
                log.exception("leasekeeper scheduler error (continuing)")
                with self._wakeup:
                    if not self._closed:
                        self.clock.wait(self._wakeup, tick)

    def _dispatch(self, work: list[tuple[_Lane, list[Lease]]]) -> None:
        pool = self._pool
        for lane, leases in work:
            for chunk in chunked(leases, lane.backend.max_batch):
                if pool is None:
                    self._extend_batch(lane, chunk)
                    continue
                try:
                    future = pool.submit(self._extend_batch, lane, chunk)
                except RuntimeError:  # the pool shut down under us: close() is running
                    return
                self._inflight.add(future)
                future.add_done_callback(self._inflight.discard)

    # Driven-clock protocol (leasekeeper.clock.ClockDriven)
    def next_wakeup(self) -> float | None:
        with self._registry_lock:
            return None if self._closed else self._next_due_locked()

    def run_due(self) -> None:
        with self._registry_lock:
            if self._closed:
                return
            work = self._collect_due(self.clock.now())
        self._drain_notifications()
        self._dispatch(work)

    # ------------------------------------------------------------------ extending

    def _extend_batch(self, lane: _Lane, leases: Sequence[Lease]) -> None:
        """Extend one chunk of due leases (runs on a dispatch thread)."""
        try:
            self._extend_batch_unguarded(lane, leases)
        except BaseException as exc:
            # Rule 6: whatever escaped (a bug, or a CancelledError from an SDK bridged
            # onto asyncio), no popped lease is left unscheduled.
            with self._registry_lock:
                self._scheduler_errors += 1
            for lease in leases:
                if lease._state is LeaseState.ACTIVE and lease._gen == 0:
                    self._reschedule(lease, self.clock.now() + _RETRY_BASE)
            if not isinstance(exc, Exception):
                raise
            log.error("leasekeeper dispatch error (%s); leases rescheduled", type(exc).__name__)
        self._drain_notifications()

    def _extend_batch_unguarded(self, lane: _Lane, leases: Sequence[Lease]) -> None:
        backend = lane.backend
        locked: list[Lease] = []
        for lease in leases:
            # A handler holding the op lock is completing or releasing the lease;
            # that operation reschedules it if it fails, so skip it here.
            if lease._op_lock.acquire(blocking=False):
                locked.append(lease)
        try:
            now = self.clock.now()
            groups: dict[float, list[Lease]] = {}
            for lease in locked:
                if lease._state is not LeaseState.ACTIVE:
                    continue
                asked = self._plan_extend(backend, lease, now)
                if asked is not None:
                    groups.setdefault(asked, []).append(lease)
            for asked, group in groups.items():
                sent_at = self.clock.now()
                # Measured at the send, so it includes any wait for a dispatch thread.
                send_lag = max(0.0, sent_at - min(lease._due for lease in group))
                self._send_lag.append(send_lag)
                late = [lease for lease in group if sent_at >= lease.visible_until]
                if late:
                    self._count_lapses(late, sent_at)
                self._watch(lane, group)
                try:
                    outcomes = self._call(backend, "extend", group, asked)
                finally:
                    for lease in group:
                        lease._watch = 0  # back in time (or not): the watch is moot
                latency = self.clock.now() - sent_at
                self._latency.append(latency)
                with self._registry_lock:
                    self._extend_calls += 1
                for lease, outcome in zip(group, outcomes, strict=True):
                    self._apply_extend(lane, lease, outcome, sent_at, asked)
                self._check_margin(send_lag, latency)
        finally:
            for lease in locked:
                lease._op_lock.release()

    def _watch(self, lane: _Lane, group: Sequence[Lease]) -> None:
        """Watch each lease's deadline while its extend call is out."""
        with self._registry_lock:
            earliest = math.inf
            for lease in group:
                self._gen += 1
                lease._watch = self._gen
                heapq.heappush(lane.watch, (lease.visible_until, self._gen, lease.message.id))
                earliest = min(earliest, lease.visible_until)
            if earliest < self._next_wake:
                self._wakeup.notify()

    def _plan_extend(self, backend: Backend, lease: Lease, now: float) -> float | None:
        """How long to ask for, or None after ending the lease (abandoned/capped)."""
        if lease._retries and now >= lease.visible_until:
            self._end(
                lease,
                LeaseState.LOST,
                f"no successful extend before its deadline (last error: {lease._last_error})",
            )
            return None
        limit = self.config.max_lease_duration
        if limit is not None and now >= lease.registered_at + limit:
            self._end(lease, LeaseState.ABANDONED, f"max_lease_duration ({limit:g}s) reached")
            return None
        asked = min(self.config.visibility_timeout, backend.max_visibility)
        hard = lease.message.hard_deadline
        if hard is not None and now + asked > hard:
            asked = hard - now
            if now + asked <= lease.visible_until + 1e-3:
                self._end(
                    lease,
                    LeaseState.ABANDONED,
                    "capped: the service's limit on total invisibility is reached",
                )
                return None
        return asked

    def _count_lapses(self, late: list[Lease], sent_at: float) -> None:
        # An overloaded manager can lapse thousands of leases a minute: log the first
        # few of each minute one by one and then only how many more there were.
        with self._registry_lock:
            self._lapses += len(late)
            suppressed = 0
            if sent_at - self._lapse_window >= _WARN_EVERY:
                suppressed, self._lapses_unlogged = self._lapses_unlogged, 0
                self._lapse_window, self._lapse_lines = sent_at, 0
            shown = late[: max(0, _LAPSE_LINES - self._lapse_lines)]
            self._lapse_lines += len(shown)
            self._lapses_unlogged += len(late) - len(shown)
        if suppressed:
            log.warning(
                "%d more lapse(s) in the previous minute (not logged one by one)", suppressed
            )
        for lease in shown:
            log.warning(
                "lapse: extend of message %r sent %.3fs after its invisibility ran out; "
                "another consumer may have received it (scheduler lag or slow calls)",
                lease.id,
                sent_at - lease.visible_until,
            )

    def _apply_extend(
        self, lane: _Lane, lease: Lease, outcome: Outcome, sent_at: float, asked: float
    ) -> None:
        if lease._state is not LeaseState.ACTIVE:
            return  # ended while the call was out (its deadline watch fired): too late
        kind = outcome.kind
        if kind == "ok":
            if outcome.receipt is not None:
                lease._receipt = outcome.receipt
            # Rule 1: the deadline counts from just before the request was sent.
            lease.visible_until = sent_at + asked
            lease.extensions += 1
            lease._retries = 0
            with self._registry_lock:
                self._extended += 1
                if lease._state is LeaseState.ACTIVE and not self._closed:
                    self._schedule_locked(lane, lease, self._natural_due(lease))
            return
        with self._registry_lock:
            self._extend_errors += kind != "lost"
        if kind == "lost":
            self._end(lease, LeaseState.LOST, f"lost: {outcome.detail or 'receipt rejected'}")
        elif kind == "capped":
            self._end(lease, LeaseState.ABANDONED, f"capped: {outcome.detail}")
        elif kind == "fatal":
            log.error("extend of message %r failed fatally: %s", lease.id, outcome.detail)
            self._end(lease, LeaseState.LOST, f"fatal: {outcome.detail}")
        else:
            self._retry(lease, outcome.detail)

    def _retry(self, lease: Lease, detail: str) -> None:
        now = self.clock.now()
        remaining = lease.visible_until - now
        if remaining <= 0:
            self._end(
                lease,
                LeaseState.LOST,
                f"no successful extend before its deadline (last error: {detail})",
            )
            return
        lease._retries += 1
        lease._last_error = detail
        backoff = min(_RETRY_CAP, _RETRY_BASE * 2 ** (lease._retries - 1))
        delay = min(backoff * self._rng.uniform(0.5, 1.5), remaining / 2)
        with self._registry_lock:
            self._retries += 1
        log.info(
            "extend of message %r failed (%s); retry %d in %.3fs, %.3fs left",
            lease.id,
            detail,
            lease._retries,
            delay,
            remaining,
        )
        # Scheduled at most `remaining / 2` ahead, the final retry is due at the
        # deadline itself, where the check above turns it into "lost".
        self._reschedule(lease, now + max(delay, min(remaining, 1e-3)))

    def _check_margin(self, lag: float, latency: float) -> None:
        """Rule 3: warn when lateness (the scheduler's own, and waiting for a dispatch
        thread) plus call latency eat into the extend threshold."""
        if lag + latency <= self._threshold / 2:
            return
        now = self.clock.now()
        with self._registry_lock:
            self._margin_warnings += 1
            if now - self._last_margin_warning < _WARN_EVERY:
                return
            self._last_margin_warning = now
        log.warning(
            "send lag (%.3fs) + extend latency (%.3fs) exceed half of extend_threshold "
            "(%.3fs): leases risk lapsing; raise extend_threshold or max_concurrency",
            lag,
            latency,
            self._threshold,
        )

    # ------------------------------------------------------------------ calls

    def _call(
        self, backend: Backend, operation: str, leases: Sequence[Lease], arg: float
    ) -> list[Outcome]:
        """Call ``backend.<operation>`` and always return one Outcome per lease.

        An exception, or an answer of the wrong length, becomes "retry" for every
        entry: the backend's fault must not take the scheduler down (rule 6).
        """
        handles = [lease._handle() for lease in leases]
        try:
            if operation == "extend":
                outcomes = backend.extend(handles, arg)
            elif operation == "release":
                outcomes = backend.release(handles, arg)
            else:
                outcomes = backend.delete(handles)
        except Exception as exc:
            # Type only: an SDK's exception text can quote the receipt it rejected.
            log.warning(
                "%s call for %d message(s) raised %s.%s; treated as transient",
                operation,
                len(handles),
                type(exc).__module__,
                type(exc).__qualname__,
            )
            return [Outcome("retry", detail=f"{type(exc).__name__}")] * len(handles)
        if not _well_formed(outcomes, len(handles)):
            log.error(
                "%r.%s returned a malformed answer for %d handle(s); treated as transient",
                backend,
                operation,
                len(handles),
            )
            return [Outcome("retry", detail="malformed backend answer")] * len(handles)
        return outcomes

    def _single(self, lease: Lease, operation: str, arg: float) -> Outcome:
        """Run a handler's delete/release, retrying transient errors a few times."""
        backend = lease.message.backend
        outcome = self._call(backend, operation, [lease], arg)[0]
        for attempt in range(1, _OP_ATTEMPTS):
            if outcome.kind != "retry":
                return outcome
            if self.clock.now() >= lease.visible_until:
                break
            self._sleep(_RETRY_BASE * 2 ** (attempt - 1) * self._rng.uniform(0.5, 1.5))
            outcome = self._call(backend, operation, [lease], arg)[0]
        return outcome

    def _sleep(self, seconds: float) -> None:
        gate = threading.Condition()
        with gate:
            self.clock.wait(gate, seconds)

    # ------------------------------------------------------------------ handler ops

    def _complete(self, lease: Lease) -> None:
        with lease._op_lock:
            state = lease._state
            if state is LeaseState.COMPLETED:
                return
            if state is LeaseState.RELEASED and lease._signalled:
                raise LeaseLost(lease.id, lease.reason or "released")
            if state is LeaseState.RELEASED:
                raise LeaseError(
                    f"lease on message {lease.id!r} was released ({lease.reason}); "
                    "it cannot be completed"
                )
            if state is LeaseState.LOST or (
                state is LeaseState.ABANDONED and self.clock.now() >= lease.visible_until
            ):
                raise LeaseLost(lease.id, lease.reason or str(state))
            outcome = self._single(lease, "delete", 0.0)
            if outcome.kind == "ok":  # the common case, kept short: nothing to reschedule
                self._end(lease, LeaseState.COMPLETED, "completed")
                if self._pending:
                    self._drain_notifications()
                return
            try:
                if outcome.kind == "lost":
                    # Rule 4: "not found" after we lost it is a loss, not a success.
                    self._end(lease, LeaseState.LOST, f"lost: {outcome.detail}")
                    raise LeaseLost(lease.id, f"delete rejected: {outcome.detail}")
                if outcome.kind == "fatal":
                    self._end(lease, LeaseState.LOST, f"fatal: {outcome.detail}")
                raise BackendError("delete", lease.id, outcome.kind, outcome.detail)
            finally:
                self._after_op(lease)

    def _release(self, lease: Lease, delay: float | None, *, stop_handler: bool = False) -> None:
        """Release ``lease``. ``stop_handler``: the release is not the handler's own
        doing (a shutdown), so set ``lease.lost`` to tell it to stop."""
        if delay is None:
            cfg = self.config
            count = max(1, lease.message.receive_count)
            try:
                delay = cfg.release_delay * cfg.release_backoff ** (count - 1)
            except OverflowError:  # a poison message received a thousand times
                delay = math.inf
        elif not _valid_delay(delay):
            raise ValueError(f"release delay must be a finite number >= 0, got {delay!r}")
        delay = min(float(delay), lease.message.backend.max_visibility)
        with lease._op_lock:
            state = lease._state
            if state is LeaseState.COMPLETED:
                raise LeaseError(f"lease on message {lease.id!r} was completed; cannot release")
            if state is not LeaseState.ACTIVE:
                return  # released already, or not ours to release
            try:
                outcome = self._single(lease, "release", delay)
                if outcome.kind == "lost":
                    self._end(lease, LeaseState.LOST, f"lost: {outcome.detail}")
                elif outcome.kind == "ok":
                    self._end(
                        lease,
                        LeaseState.RELEASED,
                        "released at shutdown" if stop_handler else f"released (delay {delay:g}s)",
                        stop_handler=stop_handler,
                    )
                else:
                    # Could not release: stop renewing so it lapses and comes back anyway.
                    log.warning(
                        "release of message %r failed (%s: %s); it will reappear when its "
                        "invisibility runs out",
                        lease.id,
                        outcome.kind,
                        outcome.detail,
                    )
                    self._end(
                        lease,
                        LeaseState.RELEASED,
                        f"release failed: {outcome.detail}",
                        stop_handler=stop_handler,
                    )
            finally:
                self._after_op(lease)

    def _abandon(self, lease: Lease, reason: str) -> None:
        """Stop renewing ``lease`` and report it (as max_lease_duration would)."""
        self._end(lease, LeaseState.ABANDONED, reason)
        self._drain_notifications()

    def _after_op(self, lease: Lease) -> None:
        """After a handler's op: renew again if it is still ours, then report."""
        if lease._state is LeaseState.ACTIVE and lease._gen == 0:
            self._reschedule(lease)
        self._drain_notifications()

    # ------------------------------------------------------------------ ending

    def _end(
        self, lease: Lease, state: LeaseState, reason: str, *, stop_handler: bool = False
    ) -> None:
        with self._registry_lock:
            self._end_locked(lease, state, reason, stop_handler=stop_handler)

    def _end_locked(
        self, lease: Lease, state: LeaseState, reason: str, *, stop_handler: bool = False
    ) -> None:
        """End an active lease. Lost and abandoned leases are always signalled and
        reported; a released one is signalled only when ``stop_handler`` says the
        release was not its handler's own doing."""
        if lease._state is not LeaseState.ACTIVE and not (
            # An abandoned lease whose message is still invisible may yet be deleted.
            lease._state is LeaseState.ABANDONED and state is LeaseState.COMPLETED
        ):
            return
        lease._state = state
        lease.reason = reason
        # register(message) of this very message returns this lease, not a second one.
        lease.message._lease_ref = weakref.ref(lease)
        lane = self._lanes[id(lease.message.backend)]
        if lease._gen:
            lane.stale += 1
            lease._gen = 0
        if lane.leases.get(lease.id) is lease:
            del lane.leases[lease.id]
        if state is LeaseState.COMPLETED:
            self._completed += 1
            return
        if state is LeaseState.RELEASED:
            self._released += 1
            if stop_handler:
                self._pending.append(lease)
            return
        if state is LeaseState.LOST:
            self._lost += 1
        else:
            self._abandoned += 1
            self._capped += reason.startswith("capped")
        self._pending.append(lease)

    def _drain_notifications(self) -> list[Lease]:
        """Signal and report ended leases outside every lock (callbacks may re-enter)."""
        done: list[Lease] = []
        pending = self._pending
        while pending:  # checked first: the common case is nothing to report
            try:
                lease = pending.popleft()
            except IndexError:  # another thread took the last one
                break
            self._notify(lease)
            done.append(lease)
        return done

    def _notify(self, lease: Lease) -> None:
        # The handler hears first (lease.lost), so it can stop as early as possible;
        # on_lost runs after, on this same leasekeeper thread.
        lease._signal()
        if lease._state is LeaseState.RELEASED:
            return
        log.warning("lease on message %r %s: %s", lease.id, lease._state.value, lease.reason)
        if self._on_lost is not None:
            try:
                self._on_lost(lease, lease.reason or lease._state.value)
            except Exception:
                self._callback_errors += 1
                log.exception("on_lost callback raised for message %r", lease.id)

    # ------------------------------------------------------------------ stats

    def stats(self) -> Stats:
        """A snapshot of the counters, scheduler lag and extend latency."""
        lag = self._lag.snapshot()
        send_lag = self._send_lag.snapshot()
        latency = self._latency.snapshot()
        with self._registry_lock:
            in_flight = sum(len(lane.leases) for lane in self._lanes.values())
            return Stats(
                in_flight=in_flight,
                registered=self._registered,
                extended=self._extended,
                extend_calls=self._extend_calls,
                extend_errors=self._extend_errors,
                retries=self._retries,
                lost=self._lost,
                completed=self._completed,
                released=self._released,
                abandoned=self._abandoned,
                capped=self._capped,
                lapses=self._lapses,
                callback_errors=self._callback_errors,
                scheduler_errors=self._scheduler_errors,
                margin_warnings=self._margin_warnings,
                scheduler_lag_p50=_percentile(lag, 0.50),
                scheduler_lag_p99=_percentile(lag, 0.99),
                send_lag_p50=_percentile(send_lag, 0.50),
                send_lag_p99=_percentile(send_lag, 0.99),
                extend_latency_p50=_percentile(latency, 0.50),
                extend_latency_p99=_percentile(latency, 0.99),
            )

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("running" if self._started else "idle")
        with self._registry_lock:
            n = sum(len(lane.leases) for lane in self._lanes.values())
        vis = self.config.visibility_timeout
        return f"<LeaseManager {state} leases={n} visibility_timeout={vis:g}s>"
