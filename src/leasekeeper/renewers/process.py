"""``ProcessRenewer``: leases renewed by a process of their own (``renewer="process"``).

This is the worker's side of it.
``ProcessRenewer(backend, config=None, *, clock=None, queues=(), **config_fields)``:
the renewer process builds its own backend from ``backend.spec()`` (and ``queues``'
too: ``RenewedQueues``) and runs a ``ThreadRenewer`` there. Its credentials come
from the environment it inherits, or are the ones the worker's client was given
in code, sent over its socket (``leasekeeper.backends.spec.renewal_spec``).
``ProcessRenewer`` holds the handlers' leases and starts a renewer process through
a ``RenewerLink`` (``renewers._link``), sending it the backend's spec and the config
(a backend whose credentials the renewer would lack fails the manager's
construction at once). The constructor returns once the renewer has built its
backend and renews, or raises ConfigError with the reason it cannot - so no lease
is ever held for a renewer that cannot renew it. A renewer started after one died
is waited for the same way by the next ``register`` (or ``start()``). Then:

- ``register`` keeps the lease here (the handler's ``Lease``) and sends it there;
  it waits for no reply (the lease's deadline is known here). A frame is one
  write, on the socket when its send returns (``renewers._sender``).
- ``complete`` of a lease the renewer still holds back (most jobs end before their
  first renewal) deletes the message here, with no round trip (``renewers._own``).
- Other completes, and releases, ask the renewer, which does the call with the newest
  receipt, one operation at a time per lease (rule 4), and wait for its answer;
  the requests that arrive together there are done in one call and answered in
  one write.
- The renewer's notices - new receipts and deadlines, leases lost or abandoned -
  are read by the link's reader thread (or by a thread waiting for a reply, which
  reads the socket itself when it is alone: ``renewers._replies``) and applied to
  the leases here; ``on_lost`` runs on a separate notifier thread, never on a
  reading thread (a callback may call ``complete()``, which needs the socket read).
  A notice that arrives while this process is stuck in C code waits in the socket
  and is applied when it runs again.
- When the renewer dies, a new one is started at once and takes over every lease
  still held, before any lapses (``renewers._succession``); requests the dead one
  never answered are asked of the new one. Only a lease whose deadline passed
  meanwhile is lost.

The worker's own death is the renewer's to notice (see ``renewers._main``).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import math
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from leasekeeper.backends.contract import Backend, Message
from leasekeeper.clock import SYSTEM_CLOCK, Clock, SystemClock, now_function
from leasekeeper.config import LeaseConfig
from leasekeeper.engine import (
    COMPLETED,
    FORGOTTEN,
    SUPERSEDED,
    Calls,
    admit,
    closed_error,
    completable,
    ended_lease,
    lost_error,
    mark_ended,
    no_deadline,
    not_a_message,
    one_by_one,
    overrides,
    register_each,
    releasable,
    released,
    signals,
    singles,
    tell_lost,
)
from leasekeeper.engine.stats import Stats
from leasekeeper.errors import ConfigError, LeaseError, LeaseLost
from leasekeeper.failures import Failures
from leasekeeper.lease import Lease, OnLost, WatchLease
from leasekeeper.observers import Observer
from leasekeeper.reasons import Ending, LostReason
from leasekeeper.record import LeaseState
from leasekeeper.renewers._bell import rings_for
from leasekeeper.renewers._frames import (
    Abandon,
    Add,
    Adds,
    AskStats,
    Close,
    Complete,
    Forget,
    Observe,
    Progress,
    Release,
    decode_error,
    progress_interval,
)
from leasekeeper.renewers._link import DIED, LinkMaker
from leasekeeper.renewers._notices import Notices
from leasekeeper.renewers._own import OwnDeletes
from leasekeeper.renewers._queues import RenewedQueues
from leasekeeper.renewers._remote_lease import RemoteLease, RemoteWatchLease
from leasekeeper.renewers._stats import StatsBook
from leasekeeper.renewers._succession import Succession, handed_on

log = logging.getLogger("leasekeeper.renewer")

_live: weakref.WeakSet[ProcessRenewer] = weakref.WeakSet()

__all__ = ["ProcessRenewer", "RemoteLease", "RemoteWatchLease"]


class ProcessRenewer:
    """Leases renewed by a child process of this one (see the module docstring)."""

    name = "process"

    def __init__(
        self,
        backend: Backend,
        config: LeaseConfig | None = None,
        *,
        clock: Clock | None = None,
        queues: Sequence[Backend] = (),
        **config_fields: Any,
    ) -> None:
        config = LeaseConfig.from_fields(config, config_fields)
        clock = SYSTEM_CLOCK if clock is None else clock
        if not isinstance(clock, SystemClock):
            raise ConfigError("renewer='process' runs on the system clock; got another clock")
        self._queues = RenewedQueues(backend, queues)  # every queue it renews
        payload = self._queues.payload(config)  # ConfigError for a backend with no spec
        self.backend = backend
        self._config = config
        self._clock = clock
        # Guards _leases, _by_message, _closed, _book and the renewer's link (_renewers).
        self._registry_lock = threading.Lock()
        self._leases: dict[int, RemoteLease] = {}
        self._by_message: dict[tuple[int, str], RemoteLease] = {}
        self._keys = itertools.count(1)
        self._closed = False
        self._book = StatsBook()
        # The observers, told as the thread renewer tells them (one that raises counted).
        self._calls = Calls(on_error=self._book.count_callback_error)
        # The handlers' progress, to the renewer (only with stall_timeout).
        self._progress = ProgressRelay.of(config, self._send_quietly)
        self._notifier = Notifier(self._book.count_callback_error)
        # The renewer processes, one after another: one that dies is replaced, and its
        # leases taken over (``renewers._succession``).
        self._renewers = Succession(
            LinkMaker(self._queues.all, payload),
            self._registry_lock,
            apply=Notices(self._leases, self._end, self._calls, self._queues.all).apply,
            hand_over=self._hand_over,
            lost=self._lost_in_takeover,
            is_closed=lambda: self._closed,
            now=self._clock.now,
            after=self._after_takeover,
        )
        # Jobs done while the renewer holds their leases back: deleted here (no bell rung).
        drops = functools.partial(self._send, urgent=False)
        self._own = OwnDeletes(
            config,
            self._calls,
            now_function(clock),
            drops,
            lock=self._registry_lock,
            current=lambda: self._renewers.link,
        )
        #: What a handler's failure does (``leasekeeper.failures``); the manager binds its own.
        self.failures = Failures(config, None)
        # A subclass's own complete/release sees every lease of the batch forms.
        self._completes_one_by_one, self._releases_one_by_one = singles(self, ProcessRenewer)
        self._registers_one_by_one = overrides(self, ProcessRenewer, "register")
        try:
            # Constructed once it renews: nothing is registered before it can be.
            self._renewers.serving()
        except BaseException:
            with self._registry_lock:  # no other renewer is started after this one
                self._closed = True
            self._renewers.abandon()
            self._notifier.close()
            raise
        _live.add(self)

    # ------------------------------------------------------------------ the child

    def _hand_over(self, now: float) -> tuple[list[tuple[Any, ...]], list[RemoteLease]]:
        """Under the registry lock, as a renewer that died is replaced: what its
        successor takes over, and what lapsed by ``now`` (``_succession.handed_on``)."""
        handed, lapsed = handed_on(self._leases.values(), self._queues.index, now)
        self._book.renewer_died(len(lapsed))
        return handed, lapsed

    def _lost_in_takeover(self, leases: list[RemoteLease], detail: str) -> None:
        ending = Ending(LostReason.RENEWER_DIED, detail)
        for lease in leases:
            self._end(lease, LeaseState.LOST, ending, signal=True)

    def _after_takeover(self) -> None:
        """A renewer took over from one that died: it forwards observer events too."""
        if self._calls.observers:
            self._send_quietly(Observe(True))

    def _send(self, frame: tuple[Any, ...], urgent: bool = True) -> object:
        """Send ``frame`` to the renewer (``Succession.send``); the link it went to."""
        return self._renewers.send(frame, urgent)

    def _ask(self, make: Callable[[int], tuple[Any, ...]]) -> Any:
        return self._renewers.ask(make)

    # ------------------------------------------------------------------ leases

    @property
    def config(self) -> LeaseConfig:
        return self._config

    @property
    def clock(self) -> Clock:
        return self._clock

    def bind(self, on_lost: OnLost | None, failures: Failures | None = None) -> None:
        self._notifier.on_lost = on_lost
        if failures is not None:
            self.failures = failures

    def start(self) -> None:
        """Return once the renewer process renews; ConfigError when it cannot."""
        self._renewers.serving()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pid(self) -> int:
        link = self._renewers.link
        return 0 if link is None else link.pid

    @property
    def running(self) -> bool:
        link = self._renewers.link  # renewing: its process runs and has built its backend
        return not self._closed and link is not None and link.serving and link.alive

    @property
    def replacing(self) -> bool:
        """A renewer process died and another is taking (or is about to take) its
        leases over: not ``running`` for that while (most of a second), nothing lost."""
        return self._renewers.taking_over

    @property
    def replaced(self) -> int:
        """How many renewer processes took over from one that died."""
        return self._renewers.replaced

    def register(self, message: Message) -> Lease:
        return self._add(message, watch=False)

    def watch(self, message: Message) -> WatchLease:
        lease = self._add(message, watch=True)
        assert isinstance(lease, RemoteWatchLease)
        return lease

    def register_many(self, messages: Sequence[Message]) -> list[Lease | Exception]:
        """``register`` each (a receive's): its lease or its LeaseTooShort/ManagerClosed;
        their frames in one write, on the socket before this returns (as each's is)."""
        if self._registers_one_by_one:
            return register_each(self.register, messages)
        leases: list[RemoteLease] = []
        frames: list[Add] = []

        def admitted(message: Message) -> Lease:
            lease, frame = self._admit(message, watch=False)
            if frame is not None:
                leases.append(lease)
                frames.append(frame)
            return lease

        try:
            results = register_each(admitted, messages)
        finally:  # what was admitted is sent, even when a later message raised
            if frames:
                self._send(*_adds(leases, frames, self._clock.now()))
        return results

    def _add(self, message: Message, *, watch: bool) -> Lease:
        lease, frame = self._admit(message, watch=watch)
        if frame is not None:
            self._send(*_adds([lease], [frame], self._clock.now()))
        return lease

    def _admit(self, message: Message, *, watch: bool) -> tuple[RemoteLease, Add | None]:
        """The lease of ``message``: a new one and the frame that has the renewer
        renew it, or the one it has already (no frame)."""
        if not isinstance(message, Message):
            raise not_a_message(message)
        if message.ended_lease is not None and not self._closed:
            ended = ended_lease(message, self)
            if isinstance(ended, RemoteLease):
                return ended, None  # its lease ended: the same lease, not a second one
        index = self._queues.require(message.backend)
        if not math.isfinite(message.visible_until):
            raise no_deadline(message)
        link = self._renewers.link
        if link is None or not link.serving:
            # Refused here (ConfigError with the reason) if it cannot renew, not
            # held to be reported lost when it goes.
            self._renewers.serving()
        now = self._clock.now()
        with self._registry_lock:
            if self._closed:
                raise closed_error()
            superseded = self._by_message.get((index, message.id))
            same = admit(superseded, message, now, self._config.minimal_life)
            if same is not None:
                return same, None
            self._renewers.start_locked()  # the last died since (a takeover hands this on)
            lease = (RemoteWatchLease if watch else RemoteLease)(self, message, now)
            lease.key = key = next(self._keys)
            lease.progress_told = now
            lease.own_until = self._own.until(message, now, watch or superseded is not None)
            lease.deleting = lease.dropped = False
            self._leases[key] = lease
            self._by_message[index, message.id] = lease
        if superseded is not None:
            self._end(superseded, LeaseState.LOST, SUPERSEDED)
        return lease, _add_frame(key, message, watch, index, lease.own_until > now)

    def complete(self, lease: Lease) -> None:
        if self._own.complete_one(lease):  # deleted here (the renewer held it back)
            self._end(lease, LeaseState.COMPLETED, COMPLETED)
            return
        _raise_any(self._complete_all([lease]))

    def release(self, lease: Lease, delay: float | None = None) -> None:
        _raise_any(self._release([lease], delay, stop=False))

    def revoke(self, lease: Lease, delay: float = 0.0) -> None:
        _raise_any(self._release([lease], delay, stop=True))

    def abandon(self, lease: Lease, reason: str) -> None:
        remote = _as_remote(lease)
        self._end(
            remote, LeaseState.ABANDONED, Ending(LostReason.DELETE_FAILED, reason), signal=True
        )
        with contextlib.suppress(LeaseLost, OSError):  # gone: nothing renews it anyway
            self._send(Abandon(remote.key, reason))

    def fail(self, lease: Lease, error: BaseException | None, delay: float | None = None) -> None:
        """The handler failed: ``Failures`` releases the message or dead-letters it
        (the copy is sent from this process, which holds the body)."""
        self.failures.fail(lease, error, delay)

    def progress(self, lease: Lease) -> None:
        now = self._clock.now()
        lease.progressed_at = now
        relay = self._progress
        if relay is not None and isinstance(lease, RemoteLease):
            relay.progress(lease, now)

    def rolled_over(self, lease: Lease) -> None:
        with self._registry_lock:
            self._book.rolled_over += 1

    def forget(self, lease: Lease) -> None:
        remote = _as_remote(lease)
        if remote.state is not LeaseState.ACTIVE:
            return
        # The renewer answers once no extend of it is in flight there.
        self._ask(lambda r: Forget(r, remote.key))
        self._end(remote, LeaseState.FORGOTTEN, FORGOTTEN)

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        if self._completes_one_by_one:
            return one_by_one(self.complete, leases)
        return self._complete_all(leases)

    def _complete_all(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        now = self._clock.now
        remotes, results, asked = _checked(leases, lambda lease: completable(lease, now()))
        if not asked:
            return results
        done = {id(lease) for lease in self._own.complete([remotes[i] for i in asked])}
        for i in [i for i in asked if id(remotes[i]) in done]:  # deleted here
            self._end(remotes[i], LeaseState.COMPLETED, COMPLETED)
        asked = [i for i in asked if id(remotes[i]) not in done]
        if not asked:
            return results
        again = _adds_again([remotes[i] for i in asked], self._queues)
        payload = self._ask(lambda r: Complete(r, [remotes[i].key for i in asked], again))
        answers = _per_lease(payload, len(asked), dead=(_DIED_ERROR, None))
        for i, (encoded, extensions) in zip(asked, answers, strict=True):
            lease = remotes[i]
            error = _answered(lease, decode_error(encoded))
            if extensions is not None and extensions > lease.extensions:
                lease.extensions = extensions
            if error is None:
                self._end(lease, LeaseState.COMPLETED, COMPLETED)
            elif isinstance(error, LeaseLost):
                self._end(lease, LeaseState.LOST, _ending_of(error), signal=True)
            results[i] = error
        return results

    def release_many(
        self, leases: Sequence[Lease], delay: float | None = None
    ) -> list[BaseException | None]:
        if self._releases_one_by_one:
            return one_by_one(lambda lease: self.release(lease, delay), leases)
        return self._release(leases, delay, stop=False)

    def _release(
        self, leases: Sequence[Lease], delay: float | None, *, stop: bool
    ) -> list[BaseException | None]:
        remotes, results, asked = _checked(leases, releasable)
        if not asked:
            return results
        payload = self._ask(lambda r: Release(r, [remotes[i].key for i in asked], delay, stop))
        for i, encoded in zip(asked, _per_lease(payload, len(asked)), strict=True):
            lease = remotes[i]
            error = _answered(lease, decode_error(encoded))
            if error is None:
                self._end(lease, LeaseState.RELEASED, released(delay, stop), signal=stop)
            elif isinstance(error, LeaseLost):
                self._end(lease, LeaseState.LOST, _ending_of(error), signal=True)
            results[i] = error
        return results

    def _end(
        self, lease: RemoteLease, state: LeaseState, ending: Ending, *, signal: bool = False
    ) -> None:
        """Apply an ending here (once): state, registry, the handler's signal, on_lost."""
        with self._registry_lock:
            if not mark_ended(lease, state, ending):
                return
            self._book.completed += lease.deleting  # deleted here: the renewer counted none
            if self._leases.get(lease.key) is lease:
                del self._leases[lease.key]
            known = (self._queues.index(lease.message.backend) or 0, lease.id)
            if self._by_message.get(known) is lease:
                del self._by_message[known]
        if signals(state, signal):
            lease.signal()
            if state is LeaseState.LOST or state is LeaseState.ABANDONED:
                self._notifier.put(lease)
        if self._calls.observers:
            self._calls.tell("on_ended", lease, state, ending.detail)

    # ------------------------------------------------------------------ the rest

    def get(self, message: Message) -> RemoteLease | None:
        with self._registry_lock:
            index = self._queues.index(message.backend)
            return None if index is None else self._by_message.get((index, message.id))

    def leases(self) -> list[Lease]:
        with self._registry_lock:
            return list(self._leases.values())

    def count(self) -> int:
        with self._registry_lock:
            return len(self._leases)

    def stats(self) -> Stats:
        payload = self._ask(AskStats) if not self._closed else None
        with self._registry_lock:
            return self._book.total(payload, in_flight=len(self._leases))

    def add_observer(self, observer: Observer) -> None:
        self._calls.observers = (*self._calls.observers, observer)
        self._send_quietly(Observe(True))

    def remove_observer(self, observer: Observer) -> None:
        self._calls.observers = tuple(o for o in self._calls.observers if o is not observer)
        if not self._calls.observers:
            self._send_quietly(Observe(False))

    def _send_quietly(self, frame: tuple[Any, ...]) -> None:
        with contextlib.suppress(LeaseLost, OSError):
            self._send(frame)

    def forget_after_fork(self) -> None:
        """In a forked child of the worker: the leases and the renewer are the
        parent's; let go of them."""
        self._closed = True
        self._renewers.drop()

    def close(self, release: bool = True, timeout: float | None = None) -> None:
        with self._registry_lock:
            if self._closed:
                return
            self._closed = True
        link = self._renewers.stop()  # once a takeover under way is done
        if link is not None:
            link.closing = True
            final = link.ask(lambda r: Close(r, release, timeout))
            if isinstance(final, Stats):
                with self._registry_lock:
                    self._book.last = final  # what it counted, to its close
            link.close(None if timeout is None else timeout + 5.0)
        if self._progress is not None:
            self._progress.close()
        self._notifier.close()
        _live.discard(self)


class ProgressRelay:
    """The handlers' progress (``stall_timeout``) to the renewer process, coalesced: a
    lease's first progress in each ``interval`` goes at once, and the latest of the
    ones after it at the end of that interval, with every other lease's in one frame.
    So a handler calling ``progress()`` in a tight loop sends a frame an interval,
    and the renewer's view of a lease's last progress is never more than an interval
    behind - it calls a lease stalled only when it was."""

    def __init__(self, send: Callable[[tuple[Any, ...]], None], interval: float) -> None:
        self._send = send
        self.interval = interval
        self._lock = threading.Condition()  # guards _pending, _closed and _thread
        self._pending: dict[int, tuple[RemoteLease, float]] = {}
        self._closed = False
        self._thread: threading.Thread | None = None

    @classmethod
    def of(
        cls, config: LeaseConfig, send: Callable[[tuple[Any, ...]], None]
    ) -> ProgressRelay | None:
        """The relay ``config`` needs: one with ``stall_timeout``, else none."""
        stall = config.stall_timeout
        return None if stall is None else cls(send, progress_interval(stall))

    def progress(self, lease: RemoteLease, now: float) -> None:
        if now - lease.progress_told >= self.interval:
            lease.progress_told = now
            self._send(Progress([(lease.key, now)]))
            return
        with self._lock:
            self._pending[lease.key] = (lease, now)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._run, name="leasekeeper-progress", daemon=True
                )
                self._thread.start()
            self._lock.notify()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
            time.sleep(self.interval)  # what else comes in this interval goes along
            with self._lock:
                pending, self._pending = self._pending, {}
            for lease, at in pending.values():
                lease.progress_told = at
            self._send(Progress([(lease.key, at) for lease, at in pending.values()]))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()


class Notifier:
    """The notifier thread: ``on_lost`` and its log line (``_transitions.tell_lost``),
    off the threads that read the renewer's socket (a callback may call ``complete()``,
    which needs the socket read)."""

    def __init__(self, count_error: Callable[[], None]) -> None:
        self.on_lost: OnLost | None = None
        self._count_error = count_error
        self._notices: queue.SimpleQueue[RemoteLease | None] = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=self._run, name="leasekeeper-renewer-notify", daemon=True
        )
        self._thread.start()

    def put(self, lease: RemoteLease) -> None:
        self._notices.put(lease)

    def close(self) -> None:
        self._notices.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            lease = self._notices.get()
            if lease is None:
                return
            tell_lost(lease, self.on_lost, self._count_error)


def _add_frame(key: int, message: Message, watch: bool, queue: int, own: bool) -> Add:
    """The frame that has the renewer renew ``message``'s lease ``key`` (``own``:
    the worker may delete it itself while it is held: ``renewers._own``)."""
    return Add(
        key,
        message.id,
        message.receipt,
        message.received_at,
        message.visibility_timeout,
        message.deadline_hint,
        message.hard_deadline,
        message.receive_count,
        watch,
        queue,
        own,
    )


def _adds(
    leases: Sequence[RemoteLease], frames: Sequence[Add], now: float
) -> tuple[tuple[Any, ...], bool]:
    """The frame of a receive's registers, and whether it rings the renewer's bell:
    only if one of its leases must be held there soon (``renewers._bell``)."""
    frame = frames[0] if len(frames) == 1 else Adds([tuple(f) for f in frames])
    return frame, any(rings_for(lease.own_until, now) for lease in leases)


def _adds_again(leases: list[RemoteLease], queues: RenewedQueues) -> list[tuple[Any, ...]]:
    """The fields (an ``Add``'s) of the leases among ``leases`` the renewer was told
    the worker deletes (``renewers._own``): a ``Complete`` brings them back to it."""
    return [
        tuple(_add_frame(r.key, r.message, False, queues.index(r.message.backend) or 0, True))
        for r in leases
        if r.dropped
    ]


def _checked(
    leases: Sequence[Lease], check: Callable[[Lease], bool]
) -> tuple[list[RemoteLease], list[BaseException | None], list[int]]:
    """``leases`` as this renewer's, each one's result so far (the LeaseError ``check``
    raised, else None), and the indexes of those ``check`` passes: the ones to ask for."""
    remotes = [_as_remote(lease) for lease in leases]
    results: list[BaseException | None] = [None] * len(remotes)
    asked: list[int] = []
    for i, lease in enumerate(remotes):
        try:
            if check(lease):
                asked.append(i)
        except LeaseError as exc:
            results[i] = exc
    return remotes, results, asked


def _raise_any(results: list[BaseException | None]) -> None:
    """A single operation's outcome: raise the one result's error, if any."""
    (error,) = results
    if error is not None:
        raise error


def _as_remote(lease: Lease) -> RemoteLease:
    if not isinstance(lease, RemoteLease):
        raise TypeError(f"not a lease of this manager: {lease!r}")
    return lease


def _answered(lease: RemoteLease, error: Exception | None) -> Exception | None:
    """A request's answer for ``lease``: as the renewer gave it, but ``LeaseLost`` for
    one that ended lost here while the request waited (its deadline passed while a
    renewer that died was replaced: its successor never held it)."""
    if error is not None and not isinstance(error, LeaseLost) and lease.state is LeaseState.LOST:
        return lost_error(lease, DIED)
    return error


def _ending_of(error: LeaseLost) -> Ending:
    return Ending(error.lost_reason or LostReason.LAPSED, error.reason)


_DIED_ERROR = ("LeaseLost", ("-", DIED, LostReason.RENEWER_DIED))  # as _frames encodes errors


def _per_lease(payload: Any, count: int, dead: Any = _DIED_ERROR) -> list[Any]:
    """A reply's per-lease answers; ``dead`` for each when the renewer died first."""
    if payload == DIED or not isinstance(payload, list) or len(payload) != count:
        return [dead] * count
    return payload


def _forget_after_fork() -> None:
    for renewer in list(_live):
        renewer.forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
