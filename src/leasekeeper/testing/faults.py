"""FaultyBackend: a Backend wrapper that injects the faults real queue services produce.

Wrap any backend (``MemoryQueue`` usually) and give each operation its fault rates::

    from leasekeeper.testing import FaultyBackend, Faults, ManualClock

    clock = ManualClock()
    queue = MemoryQueue(30, clock=clock, rotate_receipts=True)
    faulty = FaultyBackend(queue, seed=7, extend=Faults(retry=0.1, lost=0.01, stale=0.01))
    manager = LeaseManager(faulty, clock=clock)
    for message in faulty.receive(max_messages=10):   # receive through the wrapper
        manager.register(message)
    clock.advance(3600)
    assert manager.stats().lost == faulty.injected("lost") + faulty.injected("stale")

It is a ``ForwardingBackend``: messages received through the wrapper carry it as
their ``backend``, so the manager's extend/delete/release calls pass through it.
What each kind does:

==========  ====================================================================
retry       per entry: ``Outcome("retry", detail="InternalError")`` (a 5xx)
throttle    per call: every entry ``Outcome("retry", detail="Throttling")``
lost        per entry: ``Outcome("lost")`` without reaching the queue. On
            ``receive``: the queue hands out the message but the answer is lost,
            so it stays hidden until its visibility runs out ("dropped")
fatal       per entry: ``Outcome("fatal", detail="QueueNotExist ...")``
capped      per entry, extend only: ``Outcome("capped")``
exception   per call: the call raises an exception of an unexpected type
            (``ConnectionResetError``, ``TimeoutError``, ``RuntimeError``,
            ``ValueError``, ``KeyError``, ``OSError`` - or ``exceptions=``)
hang        per call: the call blocks until ``release_hangs()`` (then it goes on
            to the queue: a late answer), ``close()`` or ``hang_limit`` (then it
            raises ``TimeoutError``, as a socket timeout would)
malformed   per call: an answer of the wrong shape - too short, too long, empty,
            ``None``, a tuple, strings, dicts, or Outcomes of an unknown kind
            (``malformed_forms=``; "bad_receipt", an ``ok`` whose receipt is not
            a str, is opt-in and extend-only)
stale       per entry: the receipt goes stale behind the caller's back. On extend
            the queue applies the extend, then the receipt is rotated, so the
            *next* call with it is rejected by the queue itself as lost. On
            delete/release the receipt is rotated just before the call. A
            receipt already made stale is not made stale twice: the queue
            rejects it once, so it counts once.
latency     every call takes ``latency`` seconds longer
spike       with probability ``spike``, a call takes ``spike_latency`` longer
==========  ====================================================================

On receive, retry/throttle/fatal raise ``InjectedError``, a ``ReceiveError`` as
every backend's receive raises (``retryable`` for retry and throttle, not for
fatal), and exception raises an exception of another type, as a custom backend
might; capped, stale and malformed do not apply.

Latency and the clock: on a ``ManualClock`` nothing sleeps - the clock *jumps*
forward by the latency before the call reaches the queue, without running what
falls due meanwhile; that work runs, late, when the call returns, as it would
behind a slow call on one busy thread (a ManualClock manager dispatches inline).
So lapses and margin warnings caused by slow calls show up in fast tests. On any
other driven clock latency is only recorded; on a real clock the call sleeps (a
sleep that ``close()`` cuts short).

Hangs always block in real time, so on a ManualClock they block the thread that
called ``advance()``: use them with real threads (or advance from another thread).

Stale receipts need a way to rotate a receipt: the inner backend's own
``rotate_receipt(message_id)`` if it has one (``MemoryQueue`` has), or,
for another backend that ``rotates_receipts``, the new receipt an extend returns
is swallowed (as if the answer was lost after the service applied it).

Scripted faults take precedence over rates: ``script("extend", "lost", "pass",
Outcome("retry"), TimeoutError())`` makes the next four extend calls answer lost
for every entry, pass through untouched, answer that Outcome for every entry, and
raise. Decisions are drawn from one ``random.Random(seed)``: with a seed and calls
arriving in a fixed order (a ManualClock), a run is reproducible.

Counters: ``injected(kind, operation)`` counts fault events (entries for
per-entry kinds, calls for per-call kinds and latency), ``affected(...)`` counts
the entries each fault touched, ``answers`` counts what the inner backend
answered per operation and kind, ``events`` keeps the latest fault events with
their message ids and clock time. Receipts appear in none of them, nor in logs
(logger ``leasekeeper.testing.faults``) or ``repr``.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal, NamedTuple, cast, get_args

from leasekeeper.backends.contract import Backend, Handle, Message, Outcome
from leasekeeper.backends.contract import Operation as BatchOperation
from leasekeeper.backends.forwarding import ForwardingBackend
from leasekeeper.clock import SYSTEM_CLOCK, Clock, DrivenClock
from leasekeeper.errors import ReceiveError
from leasekeeper.testing.clock import ManualClock

__all__ = [
    "DEFAULT_MALFORMED_FORMS",
    "FaultEvent",
    "FaultKind",
    "FaultyBackend",
    "Faults",
    "InjectedError",
    "MalformedForm",
    "Operation",
]

log = logging.getLogger("leasekeeper.testing.faults")

Operation = Literal["receive", "extend", "delete", "release"]
FaultKind = Literal[
    "retry",
    "throttle",
    "lost",
    "fatal",
    "capped",
    "exception",
    "hang",
    "malformed",
    "stale",
    "latency",
    "spike",
]
MalformedForm = Literal[
    "short", "long", "empty", "none", "tuple", "strings", "dicts", "bad_kind", "bad_receipt"
]

OPERATIONS: tuple[Operation, ...] = get_args(Operation)
FAULT_KINDS: tuple[FaultKind, ...] = get_args(FaultKind)
#: The malformed answers drawn by default: wrong shapes and types the manager must
#: reject. "bad_receipt" (an ``ok`` whose receipt is not a str) is opt-in.
DEFAULT_MALFORMED_FORMS: tuple[MalformedForm, ...] = (
    "short",
    "long",
    "empty",
    "none",
    "tuple",
    "strings",
    "dicts",
    "bad_kind",
)

_ENTRY_KINDS: tuple[FaultKind, ...] = ("retry", "lost", "fatal", "capped", "stale")
_CALL_KINDS: tuple[FaultKind, ...] = ("throttle", "exception", "hang", "malformed")
_RECEIVE_CALL_KINDS: tuple[FaultKind, ...] = ("retry", "throttle", "fatal", "exception", "hang")
_DETAILS = {
    "retry": "InternalError",
    "throttle": "Throttling",
    "lost": "MessageNotExist (injected)",
    "fatal": "QueueNotExist (injected)",
    "capped": "beyond the limit (injected)",
}

ExceptionFactory = Callable[[str, Sequence[Handle]], BaseException]


def _default_exceptions() -> tuple[ExceptionFactory, ...]:
    def make(kind: type[BaseException], text: str) -> ExceptionFactory:
        def factory(operation: str, handles: Sequence[Handle]) -> BaseException:
            return kind(f"injected: {text} during {operation} of {len(handles)} entries")

        return factory

    return (
        make(ConnectionResetError, "connection reset by peer"),
        make(TimeoutError, "read timed out"),
        make(RuntimeError, "SDK internal error"),
        make(ValueError, "could not parse the response"),
        make(KeyError, "missing field in the response"),
        make(OSError, "network unreachable"),
    )


class InjectedError(ReceiveError, RuntimeError):
    """What an injected retry/throttle/fatal on ``receive`` raises: the
    ``ReceiveError`` a backend raises, "fatal" for an injected fatal and "retry"
    otherwise. ``fault`` is the injected kind ("retry", "throttle", "fatal")."""

    def __init__(self, operation: str, kind: str, detail: str) -> None:
        super().__init__(
            "fatal" if kind == "fatal" else "retry",
            detail,
            operation=operation,
            service="injected",
        )
        self.fault = kind


def _check_rate(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Faults.{name} must be a number, got {type(value).__name__}")
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"Faults.{name} must be a probability in [0, 1], got {value!r}")
    return float(value)


def _check_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"Faults.{name} must be a number of seconds, got {type(value).__name__}")
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError(f"Faults.{name} must be finite seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Faults:
    """Fault rates for one operation: probabilities in [0, 1], latencies in seconds.

    Per-entry kinds (retry, lost, fatal, capped, stale) are drawn once per entry and
    may add up to at most 1; per-call kinds (throttle, exception, hang, malformed)
    are drawn once per call and may add up to at most 1.
    """

    retry: float = 0.0
    throttle: float = 0.0
    lost: float = 0.0
    fatal: float = 0.0
    capped: float = 0.0
    exception: float = 0.0
    hang: float = 0.0
    malformed: float = 0.0
    stale: float = 0.0
    latency: float = 0.0  # seconds added to every call
    spike: float = 0.0  # probability of a latency spike per call
    spike_latency: float = 0.0  # seconds a spike adds

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in ("latency", "spike_latency"):
                set_(self, f.name, _check_seconds(f.name, value))
            else:
                set_(self, f.name, _check_rate(f.name, value))
        for group in (_ENTRY_KINDS, _CALL_KINDS):
            total = sum(getattr(self, kind) for kind in group)
            if total > 1.0 + 1e-9:
                raise ValueError(
                    f"Faults: {' + '.join(group)} add up to {total:g}; they exclude each "
                    "other and must add up to at most 1"
                )
        if self.spike > 0 and self.spike_latency == 0:
            raise ValueError("Faults: spike is set but spike_latency is 0")

    def rate(self, kind: FaultKind) -> float:
        return float(getattr(self, kind)) if kind not in ("latency", "spike_latency") else 0.0

    @property
    def active(self) -> bool:
        return any(getattr(self, f.name) for f in fields(self))


NO_FAULTS = Faults()


class FaultEvent(NamedTuple):
    """One injected fault (or, with ``injected=False``, a non-ok answer of the inner
    backend): which operation, which kind, the message ids it touched, and when
    (on the wrapper's clock, when the caller got the answer)."""

    operation: str
    kind: str
    message_ids: tuple[str, ...]
    at: float
    injected: bool = True


Plan = str | Outcome | BaseException


def _malformed_answer(form: MalformedForm, n: int) -> Any:
    ok = Outcome("ok")
    answers: dict[str, Callable[[], Any]] = {
        "short": lambda: [ok] * (n - 1),
        "long": lambda: [ok] * (n + 1),
        "empty": list,
        "none": lambda: None,
        "tuple": lambda: tuple([ok] * n),
        "strings": lambda: ["ok"] * n,
        "dicts": lambda: [{"kind": "ok", "receipt": None}] * n,
        "bad_kind": lambda: [Outcome(cast(Any, "maybe"), detail="unknown outcome kind")] * n,
        # Looks like success, but the "receipt" is not a str.
        "bad_receipt": lambda: [Outcome("ok", receipt=cast(Any, 1234567))] * n,
    }
    return answers[form]()


class FaultyBackend(ForwardingBackend):
    """A Backend that passes calls to ``inner`` and injects faults on the way.

    ``FaultyBackend(inner, *, seed=None, clock=None, receive=None, extend=None,
    delete=None, release=None, exceptions=None, malformed_forms=..., hang_limit=None,
    max_events=100_000)``: each operation's ``Faults`` (or a mapping of its fields),
    ``clock`` for latency and event times (default: the inner backend's ``clock``
    attribute, else the system clock). See the module docstring for each fault.
    ``max_batch``, ``max_visibility``, ``rotates_receipts`` (and ``max_receive``,
    ``max_wait_seconds`` where it has them) are copied from ``inner`` at
    construction, as ``ForwardingBackend`` does.
    """

    def __init__(
        self,
        inner: Backend,
        *,
        seed: int | None = None,
        clock: Clock | None = None,
        receive: Faults | Mapping[str, float] | None = None,
        extend: Faults | Mapping[str, float] | None = None,
        delete: Faults | Mapping[str, float] | None = None,
        release: Faults | Mapping[str, float] | None = None,
        exceptions: Sequence[ExceptionFactory] | None = None,
        malformed_forms: Sequence[MalformedForm] = DEFAULT_MALFORMED_FORMS,
        hang_limit: float | None = None,
        max_events: int = 100_000,
    ) -> None:
        super().__init__(inner)
        if clock is None:
            inner_clock = getattr(inner, "clock", None)
            clock = inner_clock if isinstance(inner_clock, Clock) else SYSTEM_CLOCK
        self.clock: Clock = clock
        self.seed = seed
        self._rng = random.Random(seed)
        self._exceptions = tuple(exceptions) if exceptions else _default_exceptions()
        forms = tuple(malformed_forms)
        unknown = [f for f in forms if f not in get_args(MalformedForm)]
        if not forms or unknown:
            raise ValueError(f"malformed_forms must be some of {get_args(MalformedForm)}")
        self._malformed_forms = forms
        if hang_limit is not None:
            hang_limit = _check_seconds("hang_limit", hang_limit)
        self.hang_limit = hang_limit
        self._faults: dict[str, Faults] = {}
        self._scripts: dict[str, deque[Plan]] = {op: deque() for op in OPERATIONS}
        self._targets: dict[str, dict[str, deque[Plan]]] = {op: {} for op in OPERATIONS}
        self._rotator = self._find_rotator(inner)

        # Guards the rng, the counters, the scripts and the hang bookkeeping.
        self._lock = threading.Condition()
        self._closed = threading.Event()
        self._hang_generation = 0
        self._hanging = 0
        self.enabled = True
        self.calls: Counter[str] = Counter()
        self.answers: Counter[str] = Counter()  # "extend.ok", "delete.lost", ...: the inner's
        self._injected: Counter[tuple[str, str]] = Counter()
        self._affected: Counter[tuple[str, str]] = Counter()
        self.added_latency: dict[str, float] = dict.fromkeys(OPERATIONS, 0.0)  # seconds
        self.events: deque[FaultEvent] = deque(maxlen=max_events)
        # Receipts this injector made stale: a later "stale" draw on one of them
        # changes nothing (it is stale already), so it is neither applied nor counted.
        self._made_stale: set[str] = set()
        for operation, given in (
            ("receive", receive),
            ("extend", extend),
            ("delete", delete),
            ("release", release),
        ):
            self.set_faults(cast(Operation, operation), given)

    # ------------------------------------------------------------------ configuring

    def set_faults(self, operation: Operation, faults: Faults | Mapping[str, float] | None) -> None:
        """Replace ``operation``'s fault rates (``None``: no faults)."""
        self._check_operation(operation)
        if faults is None:
            resolved = NO_FAULTS
        elif isinstance(faults, Faults):
            resolved = faults
        elif isinstance(faults, Mapping):
            resolved = Faults(**faults)
        else:
            raise TypeError(f"{operation} faults must be a Faults, got {type(faults).__name__}")
        self._check_applicable(operation, [k for k in FAULT_KINDS if resolved.rate(k) > 0])
        with self._lock:
            self._faults[operation] = resolved

    def faults(self, operation: Operation) -> Faults:
        self._check_operation(operation)
        return self._faults[operation]

    def script(self, operation: Operation, *plans: Plan, message_id: str | None = None) -> None:
        """Queue what the next calls of ``operation`` do, one plan per call.

        A plan is a fault kind ("lost", "hang", ...; per-entry kinds hit every
        entry), "pass" (let the call through untouched), an ``Outcome`` (every
        entry answered it, without reaching the queue) or an exception (raised).

        With ``message_id`` the plans wait for calls that include that message and
        hit only its entry (a per-call fault - exception, hang, malformed,
        throttle - still fails the whole call it lands in).
        """
        self._check_operation(operation)
        if message_id is not None and operation == "receive":
            raise ValueError("receive faults cannot target a message id")
        kinds: list[str] = []
        for plan in plans:
            if isinstance(plan, str):
                if plan != "pass" and plan not in FAULT_KINDS:
                    raise ValueError(
                        f"unknown fault {plan!r}; known: pass, {', '.join(FAULT_KINDS)}"
                    )
                if plan in ("latency", "spike"):
                    raise ValueError("latency is set with Faults(latency=...), not scripted")
                kinds.append(plan)
            elif isinstance(plan, Outcome):
                if operation == "receive":
                    raise ValueError("receive answers messages, not Outcomes")
            elif not isinstance(plan, BaseException):
                raise TypeError(f"a plan is a fault kind, an Outcome or an exception, got {plan!r}")
        self._check_applicable(operation, kinds)
        with self._lock:
            if message_id is None:
                self._scripts[operation].extend(plans)
            else:
                self._targets[operation].setdefault(message_id, deque()).extend(plans)

    def pending(self, operation: Operation) -> int:
        """Scripted plans not used yet (targeted ones included)."""
        with self._lock:
            targeted = sum(len(q) for q in self._targets[operation].values())
            return len(self._scripts[operation]) + targeted

    def clear_script(self, operation: Operation | None = None) -> int:
        """Drop the plans not used yet (of one operation, or all); returns how many."""
        with self._lock:
            ops = [operation] if operation else list(OPERATIONS)
            dropped = 0
            for op in ops:
                dropped += len(self._scripts[op]) + sum(len(q) for q in self._targets[op].values())
                self._scripts[op].clear()
                self._targets[op].clear()
            return dropped

    def _check_operation(self, operation: str) -> None:
        if operation not in OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; known: {', '.join(OPERATIONS)}")

    def _check_applicable(self, operation: str, kinds: Iterable[str]) -> None:
        for kind in kinds:
            if operation == "receive" and kind in ("capped", "stale", "malformed"):
                raise ValueError(f"{kind!r} faults do not apply to receive")
            if kind == "capped" and operation != "extend":
                raise ValueError("'capped' faults apply to extend only")
            if kind == "stale" and self._rotator is None:
                raise ValueError(
                    f"stale receipts need a way to rotate the receipt of {self.inner!r}: "
                    "a MemoryQueue, a backend with rotate_receipt(message_id), or one that "
                    "rotates_receipts (extend only)"
                )
            if kind == "stale" and self._rotator == "swallow" and operation != "extend":
                raise ValueError(
                    f"stale {operation} needs a backend that can rotate a receipt on demand"
                )

    def _find_rotator(self, inner: Backend) -> Callable[[str], bool] | str | None:
        hook = getattr(inner, "rotate_receipt", None)
        if callable(hook):

            def rotate(message_id: str) -> bool:
                return bool(hook(message_id))

            return rotate
        if inner.rotates_receipts:
            return "swallow"
        return None

    def rotate_receipt(self, message_id: str) -> bool:
        """Make the message's current receipt stale now (False when impossible)."""
        rotator = self._rotator
        return rotator(message_id) if callable(rotator) else False

    # ------------------------------------------------------------------ counters

    def injected(self, kind: str | None = None, operation: str | None = None) -> int:
        """Fault events injected: entries for per-entry kinds, calls for the rest."""
        return self._sum(self._injected, kind, operation)

    def affected(self, kind: str | None = None, operation: str | None = None) -> int:
        """Entries touched by injected faults (a throttled batch of 10 is 10)."""
        return self._sum(self._affected, kind, operation)

    def _sum(self, counter: Counter[tuple[str, str]], kind: str | None, op: str | None) -> int:
        with self._lock:
            return sum(
                n
                for (o, k), n in counter.items()
                if (kind is None or k == kind) and (op is None or o == op)
            )

    @property
    def counts(self) -> dict[str, int]:
        """Injected fault events by ``"operation.kind"``."""
        with self._lock:
            return {f"{o}.{k}": n for (o, k), n in sorted(self._injected.items())}

    @property
    def hanging(self) -> int:
        """Calls blocked in an injected hang right now."""
        with self._lock:
            return self._hanging

    def wait_for_hangs(self, count: int = 1, timeout: float | None = None) -> bool:
        """Block (real time) until at least ``count`` calls hang; False on timeout."""
        with self._lock:
            return self._lock.wait_for(lambda: self._hanging >= count, timeout)

    def release_hangs(self) -> None:
        """Let every call hanging now go on to the inner backend."""
        with self._lock:
            self._hang_generation += 1
            self._lock.notify_all()

    def close(self) -> None:
        """End hangs (they raise TimeoutError) and latency sleeps; no new hangs start."""
        self._closed.set()
        with self._lock:
            self._lock.notify_all()

    def __enter__(self) -> FaultyBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ deciding

    def _record(
        self,
        operation: str,
        kind: str,
        message_ids: Sequence[str],
        *,
        per_call: bool = False,
        at: float | None = None,
    ) -> None:
        """Count one fault: a per-call fault is one event touching every entry, a
        per-entry fault one event per entry."""
        ids = tuple(message_ids)
        with self._lock:
            self._injected[(operation, kind)] += 1 if per_call else len(ids)
            self._affected[(operation, kind)] += len(ids)
            self.events.append(
                FaultEvent(operation, kind, ids, self.clock.now() if at is None else at)
            )
        if log.isEnabledFor(logging.DEBUG):
            log.debug("injected %s into %s of message(s) %s", kind, operation, ", ".join(ids))

    def _plan(
        self, operation: str, ids: Sequence[str]
    ) -> tuple[Plan | None, list[str | Outcome | None], float]:
        """Decide the call's fault, each entry's fault and the added latency."""
        n = len(ids)
        with self._lock:
            self.calls[operation] += 1
            script = self._scripts[operation]
            plan: Plan | None = script.popleft() if script else None
            entry_faults: list[str | Outcome | None] = [None] * n
            targets = self._targets[operation]
            for i, message_id in enumerate(ids):
                queued = targets.get(message_id)
                if not queued:
                    continue
                target = queued.popleft()
                if not queued:
                    del targets[message_id]
                if isinstance(target, Outcome) or target in _ENTRY_KINDS:
                    entry_faults[i] = cast("str | Outcome", target)
                elif target != "pass" and plan is None:
                    plan = target  # a whole-call fault: the call fails for every entry
            faults = self._faults[operation] if self.enabled else NO_FAULTS
            rng = self._rng
            latency = faults.latency
            if faults.spike and rng.random() < faults.spike:
                latency += faults.spike_latency
                self._injected[(operation, "spike")] += 1
                self._affected[(operation, "spike")] += n
            if faults.latency:
                self._injected[(operation, "latency")] += 1
                self._affected[(operation, "latency")] += n
            self.added_latency[operation] += latency
            if plan is not None:
                if isinstance(plan, str) and plan in _ENTRY_KINDS and operation != "receive":
                    entry_faults = [f if f is not None else plan for f in entry_faults]
                    plan = None
                return plan, entry_faults, latency
            if any(f is not None for f in entry_faults):
                return None, entry_faults, latency
            call_kinds = _RECEIVE_CALL_KINDS if operation == "receive" else _CALL_KINDS
            draw = rng.random()
            for kind in call_kinds:
                rate = faults.rate(kind)
                if draw < rate:
                    return kind, entry_faults, latency
                draw -= rate
            entry_kinds = ("lost",) if operation == "receive" else _ENTRY_KINDS
            if any(faults.rate(kind) for kind in entry_kinds):
                for i in range(n):
                    draw = rng.random()
                    for kind in entry_kinds:
                        rate = faults.rate(kind)
                        if draw < rate:
                            entry_faults[i] = kind
                            break
                        draw -= rate
            return None, entry_faults, latency

    def _pause(self, operation: str, seconds: float) -> None:
        if seconds <= 0:
            return
        clock = self.clock
        if isinstance(clock, ManualClock):
            # Time passes during the call; what falls due meanwhile runs late.
            clock.skip(seconds)
        elif isinstance(clock, DrivenClock):
            return  # recorded only: this clock moves when its owner says so
        else:
            end = clock.now() + seconds
            gate = threading.Condition()
            with gate:
                while not self._closed.is_set():
                    left = end - clock.now()
                    if left <= 0:
                        break
                    clock.wait(gate, min(left, 0.05))

    def _hang(self, operation: str, ids: Sequence[str]) -> None:
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s of message(s) %s hangs", operation, ", ".join(ids))
        limit = self.hang_limit
        with self._lock:
            generation = self._hang_generation
            self._hanging += 1
            self._lock.notify_all()
            try:
                waited = self._lock.wait_for(
                    lambda: self._hang_generation != generation or self._closed.is_set(),
                    limit,
                )
            finally:
                self._hanging -= 1
        if self._closed.is_set():
            raise TimeoutError(f"injected hang of {operation} ended by close()")
        if not waited:
            raise TimeoutError(f"injected hang of {operation} timed out after {limit:g}s")

    def _raise_for(self, operation: str, plan: Plan, handles: Sequence[Handle]) -> BaseException:
        if isinstance(plan, BaseException):
            return plan
        if plan == "exception":
            with self._lock:
                factory = self._rng.choice(self._exceptions)
            return factory(operation, handles)
        kind = str(plan)
        return InjectedError(operation, kind, _DETAILS.get(kind, kind))

    # ------------------------------------------------------------------ Backend API

    def receive(
        self,
        max_messages: int = 1,
        wait_seconds: float = 0.0,
        visibility_timeout: float | None = None,
    ) -> list[Message]:
        plan, _, latency = self._plan("receive", ())
        self._pause("receive", latency)
        if plan == "hang":
            self._record("receive", "hang", (), per_call=True)
            self._hang("receive", ())
        elif plan is not None and plan not in ("pass", "lost"):
            error = self._raise_for("receive", plan, ())
            self._record(
                "receive", plan if isinstance(plan, str) else "exception", (), per_call=True
            )
            raise error
        messages = self.inner.receive(max_messages, wait_seconds, visibility_timeout)
        kept: list[Message] = []
        with self._lock:
            faults = self._faults["receive"] if self.enabled else NO_FAULTS
            drops = [
                plan == "lost" or (faults.lost > 0 and self._rng.random() < faults.lost)
                for _ in messages
            ]
        for message, drop in zip(messages, drops, strict=True):
            if drop:
                self._record("receive", "lost", (message.id,))
                continue
            kept.append(self.wrap(message))
        return kept

    def extend(self, handles: Sequence[Handle], timeout: float) -> list[Outcome]:
        return self._operate("extend", handles, timeout)

    def delete(self, handles: Sequence[Handle]) -> list[Outcome]:
        return self._operate("delete", handles, 0.0)

    def release(self, handles: Sequence[Handle], delay: float) -> list[Outcome]:
        return self._operate("release", handles, delay)

    def _operate(self, operation: str, handles: Sequence[Handle], arg: float) -> list[Outcome]:
        ids = [h.message_id for h in handles]
        plan, entry_faults, latency = self._plan(operation, ids)
        self._pause(operation, latency)
        if plan == "hang":
            self._record(operation, "hang", ids, per_call=True)
            self._hang(operation, ids)
            plan = None
        if plan == "pass":
            plan = None
        if isinstance(plan, BaseException) or plan == "exception":
            error = self._raise_for(operation, plan, handles)
            self._record(operation, "exception", ids, per_call=True)
            raise error
        if plan == "malformed":
            with self._lock:
                forms = self._malformed_forms
                if operation != "extend":
                    forms = tuple(f for f in forms if f != "bad_receipt") or ("bad_kind",)
                form = self._rng.choice(forms)
            self._record(operation, "malformed", ids, per_call=True)
            if log.isEnabledFor(logging.DEBUG):
                log.debug("malformed answer to %s: %s", operation, form)
            return cast(list[Outcome], _malformed_answer(form, len(handles)))
        if isinstance(plan, Outcome):
            self._record(operation, plan.kind, ids)  # per entry: each entry got this answer
            return [plan] * len(handles)
        if plan == "throttle":
            self._record(operation, "throttle", ids, per_call=True)
            return [Outcome("retry", detail=_DETAILS["throttle"])] * len(handles)
        if isinstance(plan, str):  # retry/fatal scripted for receive only; cannot happen here
            raise AssertionError(f"unexpected plan {plan!r}")

        out: list[Outcome | None] = [None] * len(handles)
        passing: list[int] = []
        stale_after: list[int] = []
        for i, kind in enumerate(entry_faults):
            if kind is None:
                passing.append(i)
            elif isinstance(kind, Outcome):
                out[i] = kind
            elif kind == "stale":
                passing.append(i)
                if operation == "extend":
                    stale_after.append(i)
                elif handles[i].receipt not in self._made_stale and self.rotate_receipt(ids[i]):
                    self._made_stale.add(handles[i].receipt)
                    self._record(operation, "stale", (ids[i],))
            else:
                out[i] = Outcome(cast(Any, kind), detail=_DETAILS[kind])
        if passing:
            answered = self.forward(
                cast(BatchOperation, operation), [handles[i] for i in passing], arg
            )
            if not isinstance(answered, list) or len(answered) != len(passing):
                return answered  # the inner backend's own malformed answer, untouched
            for i, outcome in zip(passing, answered, strict=True):
                out[i] = outcome
                kind = getattr(outcome, "kind", "?")
                with self._lock:
                    self.answers[f"{operation}.{kind}"] += 1
                if kind != "ok":
                    with self._lock:
                        self.events.append(
                            FaultEvent(operation, str(kind), (ids[i],), self.clock.now(), False)
                        )
        for i in stale_after:
            answered_i = out[i]
            if answered_i is None or answered_i.kind != "ok":
                continue  # nothing to make stale
            if self._rotator == "swallow":
                out[i] = Outcome("ok")  # the new receipt never reaches the caller
                self._record(operation, "stale", (ids[i],))
            elif self.rotate_receipt(ids[i]):
                # The receipt the caller holds now: the extend's new one on a queue
                # that rotates receipts, else the one it sent.
                self._made_stale.add(answered_i.receipt or handles[i].receipt)
                self._record(operation, "stale", (ids[i],))
        at = self.clock.now()
        for i, kind in enumerate(entry_faults):
            if isinstance(kind, Outcome):
                self._record(operation, kind.kind, (ids[i],), at=at)
            elif kind is not None and kind != "stale":
                self._record(operation, kind, (ids[i],), at=at)
        answer = [o for o in out if o is not None]
        assert len(answer) == len(handles), "every entry has an outcome"
        return answer

    def __repr__(self) -> str:
        with self._lock:
            total = sum(self._injected.values())
        return f"FaultyBackend({self.inner!r}, seed={self.seed!r}, injected={total})"
