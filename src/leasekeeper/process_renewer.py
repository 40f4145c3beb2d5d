"""``ProcessRenewer``: leases renewed by a process of their own (``renewer="process"``).

This is the worker's side of it.
``ProcessRenewer`` holds the handlers' leases and starts a renewer process through
a ``RenewerLink`` (``_renewer_link``), sending it the backend's spec and the config
(a backend whose credentials the renewer would lack fails the manager's
construction at once). The manager is constructed once the renewer runs; it builds
its backend meanwhile, and ``start()`` - which the workers and
``LeaseManager.receive`` call before they receive - waits until it renews (or
raises ConfigError with the reason it cannot). From then on:

- ``register`` keeps the lease here (the handler's ``Lease``) and sends it there;
  it waits for no reply.
- ``complete``/``release`` ask the renewer, which does the call with the newest
  receipt, one operation at a time per lease (rule 4), and wait for its answer.
- The renewer's notices - new receipts and deadlines, leases lost or abandoned -
  are read by a reader thread and applied to the leases here; ``on_lost`` runs on
  a separate notifier thread, never on the reader (a callback may call
  ``complete()``, which waits for the reader). A notice that arrives while this
  process is stuck in C code waits in the socket and is applied when it runs again.
- When the renewer dies, every lease it held is reported lost, pending requests
  fail with ``LeaseLost``, and a new renewer is started for new leases.

The worker's own death is the renewer's to notice (see ``_renewer_main``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import os
import pickle
import queue
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from leasekeeper._metrics import Stats
from leasekeeper._record import LeaseState
from leasekeeper._renewer_link import DIED, RenewerLink
from leasekeeper._wire import decode_error, progress_interval
from leasekeeper.backends.base import Backend, CloudBackend, Message
from leasekeeper.backends.spec import renewal_spec
from leasekeeper.clock import SYSTEM_CLOCK, Clock, SystemClock
from leasekeeper.config import LeaseConfig
from leasekeeper.errors import ConfigError, LeaseError, LeaseLost, LeaseTooShort, ManagerClosed
from leasekeeper.failures import Failures
from leasekeeper.lease import Lease, OnLost, WatchLease, not_a_message
from leasekeeper.observers import CallEvent, Observer
from leasekeeper.reasons import Ending, LostReason

log = logging.getLogger("leasekeeper.renewer")

_live: weakref.WeakSet[ProcessRenewer] = weakref.WeakSet()


class RemoteLease(Lease):
    """A lease whose renewals happen in the renewer process; ``key`` names it there.
    ``progress_told``: when its handler's progress was last sent there."""

    __slots__ = ("key", "progress_told")
    key: int
    progress_told: float


class RemoteWatchLease(RemoteLease, WatchLease):
    """A watch lease (``LeaseManager.watch``) renewed in the renewer process."""

    __slots__ = ()


class ProcessRenewer:
    """Leases renewed by a child process of this one (see the module docstring).

    ``ProcessRenewer(backend, config=None, *, clock=None, **config_fields)``: the
    renewer process builds its own backend from ``backend.spec()`` (credentials from
    the environment it inherits, or the ones the worker's client was given in code,
    sent over its socket: ``leasekeeper.backends.spec.renewal_spec``) and runs a
    ``ThreadRenewer`` there.
    """

    name = "process"

    def __init__(
        self,
        backend: Backend,
        config: LeaseConfig | None = None,
        *,
        clock: Clock | None = None,
        **config_fields: Any,
    ) -> None:
        config = LeaseConfig.from_fields(config, config_fields)
        clock = SYSTEM_CLOCK if clock is None else clock
        if not isinstance(clock, SystemClock):
            raise ConfigError("renewer='process' runs on the system clock; got another clock")
        spec = renewal_spec(backend)  # ConfigError for a backend that has none
        self.backend = backend
        self._config = config
        self._clock = clock
        # Guards _leases, _by_message, _closed, _link, _maker and _book.
        self._registry_lock = threading.Lock()
        self._leases: dict[int, RemoteLease] = {}
        self._by_message: dict[str, RemoteLease] = {}
        self._keys = itertools.count(1)
        self._closed = False
        self.observers: tuple[Observer, ...] = ()
        self._book = StatsBook()
        # The handlers' progress, to the renewer (only with stall_timeout).
        self._progress = ProgressRelay.of(config, self._send_quietly)
        self._notifier = Notifier()
        #: What a handler's failure does (``leasekeeper.failures``); the manager binds its own.
        self.failures = Failures(config, None)
        self._maker = LinkMaker(backend, pickle.dumps((spec, config)))
        self._link: RenewerLink | None = self._maker.start(self._apply, self._link_gone)
        _live.add(self)

    # ------------------------------------------------------------------ the child

    def _apply(self, frame: tuple[Any, ...]) -> None:
        """A notice from the renewer (on the link's reader thread)."""
        tag = frame[0]
        if tag == "extended":  # key, receipt, visible_until, extensions
            lease = self._leases.get(frame[1])
            if lease is not None:
                lease.receipt, lease.visible_until, lease.extensions = frame[2:]
        elif tag == "ended":
            _, key, state, lost, detail, signal = frame
            lease = self._leases.get(key)
            if lease is not None:
                ending = Ending(None if lost is None else LostReason(lost), detail)
                self._end(lease, LeaseState(state), ending, signal=signal)
        elif tag == "rolling":
            lease = self._leases.get(frame[1])
            if lease is not None:
                lease.signal_rolling()
        elif tag == "event":
            self._forward_event(frame[1], frame[2])

    def _link_gone(self, link: RenewerLink) -> None:
        """The renewer died: its leases are lost; a new one takes the new leases."""
        with self._registry_lock:
            held = list(self._leases.values())
            if self._link is link:
                self._link = None
            self._maker.ended(link)
            self._book.renewer_died(len(held))
        for lease in held:
            self._end(lease, LeaseState.LOST, RENEWER_DIED, signal=True)
        with self._registry_lock:
            if self._closed or self._link is not None or self._maker.unbuildable:
                return
            try:
                self._link = self._maker.start(self._apply, self._link_gone)
            except ConfigError as exc:
                log.error("%s; the next register tries again", exc)

    def _send(self, frame: tuple[Any, ...]) -> None:
        link = self._link
        if link is None:
            raise LeaseLost("-", DIED)
        link.send(frame)

    def _ask(self, make: Callable[[int], tuple[Any, ...]]) -> Any:
        link = self._link
        return DIED if link is None else link.ask(make)

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
        with self._registry_lock:
            if self._closed:
                raise ManagerClosed("this LeaseManager is closed")
            if self._link is None:
                self._link = self._maker.start(self._apply, self._link_gone)  # the last died
            link = self._link
        link.wait_serving()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def pid(self) -> int:
        link = self._link
        return 0 if link is None else link.pid

    @property
    def running(self) -> bool:
        link = self._link  # renewing: its process runs and has built its backend
        return not self._closed and link is not None and link.serving and link.alive

    def register(self, message: Message) -> Lease:
        return self._add(message, watch=False)

    def watch(self, message: Message) -> WatchLease:
        lease = self._add(message, watch=True)
        assert isinstance(lease, RemoteWatchLease)
        return lease

    def _add(self, message: Message, *, watch: bool) -> Lease:
        if not isinstance(message, Message):
            raise not_a_message(message)
        ended_ref = message.ended_lease
        if ended_ref is not None and not self._closed:
            ended = ended_ref()
            if isinstance(ended, RemoteLease) and ended.owner is self:
                return ended  # its lease ended: the same lease, not a second one
        if message.backend is not self.backend:
            raise ConfigError(
                f"a process renewer renews the messages of {self.backend!r} only, "
                f"not of {message.backend!r}"
            )
        visible_until = message.visible_until
        if not math.isfinite(visible_until):
            raise ValueError(
                f"message {message.id!r} has no finite deadline ({visible_until!r}): "
                "give it a finite visibility_timeout"
            )
        now = self._clock.now()
        superseded: RemoteLease | None = None
        with self._registry_lock:
            if self._closed:
                raise ManagerClosed("this LeaseManager is closed; it takes no new leases")
            existing = self._by_message.get(message.id)
            if existing is not None:
                if existing.message is message or existing.receipt == message.receipt:
                    return existing
                superseded = existing
            if visible_until - now < self._config.minimal_life:
                raise LeaseTooShort(message.id, visible_until - now, self._config.minimal_life)
            if self._link is None:
                self._link = self._maker.start(self._apply, self._link_gone)  # the last died
            lease = (RemoteWatchLease if watch else RemoteLease)(self, message, now)
            lease.key = key = next(self._keys)
            lease.progress_told = now
            self._leases[key] = lease
            self._by_message[message.id] = lease
        if superseded is not None:
            self._end(superseded, LeaseState.LOST, SUPERSEDED)
        self._send(
            (
                "add",
                key,
                message.id,
                message.receipt,
                message.received_at,
                message.visibility_timeout,
                message.deadline_hint,
                message.hard_deadline,
                message.receive_count,
                watch,
            )
        )
        return lease

    def complete(self, lease: Lease) -> None:
        (result,) = self.complete_many([lease])
        if result is not None:
            raise result

    def release(self, lease: Lease, delay: float | None = None) -> None:
        (result,) = self._release([lease], delay, stop=False)
        if result is not None:
            raise result

    def revoke(self, lease: Lease, delay: float = 0.0) -> None:
        (result,) = self._release([lease], delay, stop=True)
        if result is not None:
            raise result

    def abandon(self, lease: Lease, reason: str) -> None:
        remote = _as_remote(lease)
        self._end(
            remote, LeaseState.ABANDONED, Ending(LostReason.DELETE_FAILED, reason), signal=True
        )
        with contextlib.suppress(LeaseLost, OSError):  # gone: nothing renews it anyway
            self._send(("abandon", remote.key, reason))

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
        self._ask(lambda r: ("forget", r, remote.key))
        self._end(remote, LeaseState.FORGOTTEN, FORGOTTEN)

    def complete_many(self, leases: Sequence[Lease]) -> list[BaseException | None]:
        remotes = [_as_remote(lease) for lease in leases]
        results: list[BaseException | None] = [None] * len(remotes)
        asked: list[int] = []
        for i, lease in enumerate(remotes):
            try:
                if _check_completable(lease, self._clock.now()):
                    asked.append(i)
            except LeaseError as exc:
                results[i] = exc
        if not asked:
            return results
        payload = self._ask(lambda r: ("complete", r, [remotes[i].key for i in asked]))
        answers = _per_lease(payload, len(asked), dead=(_DIED_ERROR, None))
        for i, (encoded, extensions) in zip(asked, answers, strict=True):
            lease = remotes[i]
            error = decode_error(encoded)
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
        return self._release(leases, delay, stop=False)

    def _release(
        self, leases: Sequence[Lease], delay: float | None, *, stop: bool
    ) -> list[BaseException | None]:
        remotes = [_as_remote(lease) for lease in leases]
        results: list[BaseException | None] = [None] * len(remotes)
        asked: list[int] = []
        for i, lease in enumerate(remotes):
            if lease.state is LeaseState.COMPLETED:
                results[i] = LeaseError(
                    f"lease on message {lease.id!r} was completed; cannot release"
                )
            elif lease.state is LeaseState.ACTIVE:
                asked.append(i)
        if not asked:
            return results
        payload = self._ask(lambda r: ("release", r, [remotes[i].key for i in asked], delay, stop))
        for i, encoded in zip(asked, _per_lease(payload, len(asked)), strict=True):
            lease = remotes[i]
            error = decode_error(encoded)
            if error is None:
                detail = "released at shutdown" if stop else "released"
                self._end(lease, LeaseState.RELEASED, Ending(None, detail), signal=stop)
            elif isinstance(error, LeaseLost):
                self._end(lease, LeaseState.LOST, _ending_of(error), signal=True)
            results[i] = error
        return results

    def _end(
        self, lease: RemoteLease, state: LeaseState, ending: Ending, *, signal: bool = False
    ) -> None:
        """Apply an ending here (once): state, registry, the handler's signal, on_lost."""
        with self._registry_lock:
            if lease.state is not LeaseState.ACTIVE and not (
                lease.state is LeaseState.ABANDONED and state is LeaseState.COMPLETED
            ):
                return
            lease.state = state
            lease.ending = ending
            lease.message.ended_lease = weakref.ref(lease)
            if self._leases.get(lease.key) is lease:
                del self._leases[lease.key]
            if self._by_message.get(lease.id) is lease:
                del self._by_message[lease.id]
        if signal or state in (LeaseState.LOST, LeaseState.ABANDONED):
            lease.signal()
        if state in (LeaseState.LOST, LeaseState.ABANDONED):
            self._notifier.put(lease, ending.lost_reason or LostReason.LAPSED)
        for observer in self.observers:
            _tell(observer, "on_ended", lease, state, ending.detail)

    # ------------------------------------------------------------------ the rest

    def get(self, message: Message) -> RemoteLease | None:
        with self._registry_lock:
            lease = self._by_message.get(message.id)
            return lease if lease is not None and message.backend is self.backend else None

    def leases(self) -> list[Lease]:
        with self._registry_lock:
            return list(self._leases.values())

    def count(self) -> int:
        with self._registry_lock:
            return len(self._leases)

    def stats(self) -> Stats:
        payload = self._ask(lambda r: ("stats", r)) if not self._closed else None
        with self._registry_lock:
            return self._book.total(payload, in_flight=len(self._leases))

    def add_observer(self, observer: Observer) -> None:
        self.observers = (*self.observers, observer)
        self._send_quietly(("observe", True))

    def remove_observer(self, observer: Observer) -> None:
        self.observers = tuple(o for o in self.observers if o is not observer)
        if not self.observers:
            self._send_quietly(("observe", False))

    def _send_quietly(self, frame: tuple[Any, ...]) -> None:
        with contextlib.suppress(LeaseLost, OSError):
            self._send(frame)

    def _forward_event(self, callback: str, args: tuple[Any, ...]) -> None:
        if callback == "on_call":
            operation, entries, seconds, outcomes, error = args
            event = CallEvent(operation, self.backend, entries, seconds, outcomes, error)
            for observer in self.observers:
                _tell(observer, "on_call", event)
            return
        key, value = args
        lease = self._leases.get(key)
        if lease is not None:
            for observer in self.observers:
                _tell(observer, callback, lease, value)

    def close(self, release: bool = True, timeout: float | None = None) -> None:
        with self._registry_lock:
            if self._closed:
                return
            self._closed = True
            link = self._link
        if link is not None:
            link.closing = True
            final = self._ask(lambda r: ("close", r, release, timeout))
            if isinstance(final, Stats):
                with self._registry_lock:
                    self._book.last = final  # what it counted, to its close
            link.close(None if timeout is None else timeout + 5.0)
        if self._progress is not None:
            self._progress.close()
        self._notifier.close()
        _live.discard(self)

    def forget_after_fork(self) -> None:
        """In a forked child of the worker: the leases and the renewer are the
        parent's; let go of them."""
        self._closed = True
        link, self._link = self._link, None
        if link is not None:
            link.drop()


class LinkMaker:
    """Starts the renewer processes of one ``ProcessRenewer`` - and no more of them
    once one could not build its backend: another would fail the same way."""

    def __init__(self, backend: Backend, payload: bytes) -> None:
        self._backend = backend
        self._payload = payload  # the pickled (spec, config)
        self._unbuildable: str | None = None  # why one could not build its backend

    @property
    def unbuildable(self) -> bool:
        return self._unbuildable is not None

    def start(
        self,
        on_frame: Callable[[tuple[Any, ...]], None],
        on_gone: Callable[[RenewerLink], None],
    ) -> RenewerLink:
        if self._unbuildable is not None:
            raise ConfigError(f"the renewer process could not start: {self._unbuildable}")
        return RenewerLink(
            self._payload, on_frame=on_frame, on_gone=on_gone, precheck=self._credentials_problem
        )

    def ended(self, link: RenewerLink) -> None:
        """``link``'s renewer is gone; if it never served, it could not build."""
        if link.failure is not None:
            self._unbuildable = link.failure

    def _credentials_problem(self) -> str | None:
        """What the renewer's backend would lack, asked of this one (no request)."""
        backend = self._backend
        return backend.credentials_problem() if isinstance(backend, CloudBackend) else None


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
            self._send(("progress", [(lease.key, now)]))
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
            self._send(("progress", [(lease.key, at) for lease, at in pending.values()]))

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()


class StatsBook:
    """A process renewer's figures: what renewers that died had counted, the latest
    figures of the current one, and the rollovers counted here (they happen in the
    worker, which sends the continuation)."""

    def __init__(self) -> None:
        self.base = _zero_stats()  # what renewers that died had counted
        self.last = _zero_stats()  # the latest figures of the current one
        self.rolled_over = 0

    def renewer_died(self, held: int) -> None:
        """The current renewer died holding ``held`` leases: they count as lost."""
        base = _sum_stats(self.base, self.last)
        self.last = _zero_stats()
        died = dict(base.lost_reasons)
        died[LostReason.RENEWER_DIED.value] = died.get(LostReason.RENEWER_DIED.value, 0) + held
        self.base = dataclasses.replace(base, lost=base.lost + held, lost_reasons=died)

    def total(self, payload: object, *, in_flight: int) -> Stats:
        """The figures, with ``payload`` (a ``Stats``) as the current renewer's newest."""
        if isinstance(payload, Stats):
            self.last = payload
        total = _sum_stats(self.base, self.last)
        return dataclasses.replace(
            total, in_flight=in_flight, rolled_over=total.rolled_over + self.rolled_over
        )


class Notifier:
    """The notifier thread: ``on_lost`` and its log line, off the link's reader thread
    (a callback may call ``complete()``, which waits for the reader)."""

    def __init__(self) -> None:
        self.on_lost: OnLost | None = None
        self._notices: queue.SimpleQueue[tuple[RemoteLease, LostReason] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(
            target=self._run, name="leasekeeper-renewer-notify", daemon=True
        )
        self._thread.start()

    def put(self, lease: RemoteLease, reason: LostReason) -> None:
        self._notices.put((lease, reason))

    def close(self) -> None:
        self._notices.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(5.0)

    def _run(self) -> None:
        while True:
            notice = self._notices.get()
            if notice is None:
                return
            lease, reason = notice
            log.warning(
                "lease on message %r %s (%s): %s",
                lease.id,
                lease.state.value,
                reason.value,
                lease.reason,
            )
            callback = self.on_lost
            if callback is None:
                continue
            try:
                callback(lease, reason)
            except Exception:
                log.exception("on_lost callback raised for message %r", lease.id)


def _as_remote(lease: Lease) -> RemoteLease:
    if not isinstance(lease, RemoteLease):
        raise TypeError(f"not a lease of this manager: {lease!r}")
    return lease


def _check_completable(lease: RemoteLease, now: float) -> bool:
    """What ``complete()`` can tell without asking the renewer: False when it is
    completed already; raises when it cannot be completed."""
    state = lease.state
    if state is LeaseState.ACTIVE:
        return True
    if state is LeaseState.COMPLETED:
        return False
    if state is LeaseState.RELEASED:
        if lease.signalled:
            raise LeaseLost(lease.id, lease.reason or "released")
        raise LeaseError(f"lease on message {lease.id!r} was released; it cannot be completed")
    if state is LeaseState.FORGOTTEN:
        raise LeaseError(f"lease on message {lease.id!r} was forgotten; its owner ends it")
    if state is LeaseState.LOST or now >= lease.visible_until:
        raise LeaseLost(lease.id, lease.reason or str(state), lease.lost_reason)
    return True  # abandoned, and its message still hidden


def _ending_of(error: LeaseLost) -> Ending:
    return Ending(error.lost_reason or LostReason.LAPSED, error.reason)


COMPLETED = Ending(None, "completed")
FORGOTTEN = Ending(None, "forgotten: its owner took it back")
SUPERSEDED = Ending(LostReason.SUPERSEDED, "superseded: the message was received again")
RENEWER_DIED = Ending(LostReason.RENEWER_DIED, DIED)


_DIED_ERROR = ("LeaseLost", ("-", DIED, LostReason.RENEWER_DIED))  # encoded as _wire encodes errors


def _per_lease(payload: Any, count: int, dead: Any = _DIED_ERROR) -> list[Any]:
    """A reply's per-lease answers; ``dead`` for each when the renewer died first."""
    if payload == DIED or not isinstance(payload, list) or len(payload) != count:
        return [dead] * count
    return payload


def _tell(observer: Observer, callback: str, *args: Any) -> None:
    try:
        getattr(observer, callback)(*args)
    except Exception:
        log.exception("observer %r raised in %s", observer, callback)


def _zero_stats() -> Stats:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(Stats):
        values[f.name] = {} if f.name == "lost_reasons" else 0 if f.type in ("int", int) else 0.0
    return Stats(**values)


def _sum_stats(a: Stats, b: Stats) -> Stats:
    """Counters add up; percentiles are the newer renewer's."""
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(Stats):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, dict):
            fields[f.name] = {k: x.get(k, 0) + y.get(k, 0) for k in {*x, *y}}
        else:
            fields[f.name] = x + y if isinstance(x, int) else y
    return Stats(**fields)


def _forget_after_fork() -> None:
    for renewer in list(_live):
        renewer.forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_after_fork)
