"""Backend calls, guarded and observed.

The renewal engine must never be taken down by a backend (rule 6), and a backend
is other people's code talking to other people's services. So an exception, or an
answer of the wrong shape, becomes "retry" for every entry, logged by the type of
the exception only (an SDK's exception text can quote the receipt it rejected).

``Calls`` is the engine's way to make them: the same, plus timing and a
``CallEvent`` for each ``Observer`` - only when there is an observer, so an
unobserved manager pays nothing for it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from leasekeeper.backends.contract import Backend, Handle, Outcome
from leasekeeper.observers import CallEvent, Observer

log = logging.getLogger("leasekeeper.manager")

_KINDS = frozenset(("ok", "lost", "retry", "capped", "fatal"))


def well_formed(outcomes: object, expected: int) -> bool:
    """One Outcome per handle, each of a known kind, receipts None or a non-empty str."""
    if type(outcomes) is not list or len(outcomes) != expected:
        return False
    for outcome in outcomes:
        if not isinstance(outcome, Outcome) or outcome.kind not in _KINDS:
            return False
        receipt = outcome.receipt
        if receipt is not None and (type(receipt) is not str or not receipt):
            return False
    return True


def raw_call(backend: Backend, operation: str, handles: Sequence[Handle], arg: float) -> object:
    """``backend.<operation>(handles[, arg])``: its answer, or the exception it raised."""
    try:
        if operation == "extend":
            return backend.extend(handles, arg)
        if operation == "release":
            return backend.release(handles, arg)
        return backend.delete(handles)
    except Exception as exc:
        return exc


def call_backend(
    backend: Backend, operation: str, handles: Sequence[Handle], arg: float
) -> list[Outcome]:
    """``backend.<operation>(handles[, arg])``, always answering one Outcome per handle."""
    return checked(backend, operation, len(handles), raw_call(backend, operation, handles, arg))


def checked(backend: Backend, operation: str, entries: int, answer: object) -> list[Outcome]:
    """What a call that returned (or raised) ``answer`` means: its outcomes if they are
    well formed, else "retry" for every one of its ``entries``."""
    if isinstance(answer, BaseException):
        log.warning(
            "%s call for %d message(s) raised %s.%s; treated as transient",
            operation,
            entries,
            type(answer).__module__,
            type(answer).__qualname__,
        )
        return [Outcome("retry", detail=type(answer).__name__)] * entries
    if not well_formed(answer, entries):
        log.error(
            "%r.%s returned a malformed answer for %d handle(s); treated as transient",
            backend,
            operation,
            entries,
        )
        return [Outcome("retry", detail="malformed backend answer")] * entries
    return answer  # type: ignore[return-value]  # well_formed checked every entry


class Calls:
    """The engine's backend calls, and its observers.

    ``observers`` is a tuple, replaced (never mutated) when one is added, so the
    threads that read it need no lock. ``on_error`` counts an observer that raised.
    """

    __slots__ = ("_on_error", "observers")

    def __init__(self, on_error: Callable[[], None]) -> None:
        self.observers: tuple[Observer, ...] = ()
        self._on_error = on_error

    def call(
        self, backend: Backend, operation: str, handles: Sequence[Handle], arg: float
    ) -> list[Outcome]:
        """``call_backend``, timed and told to the observers when there are any."""
        if not self.observers:
            return call_backend(backend, operation, handles, arg)
        start = time.perf_counter()
        answer = raw_call(backend, operation, handles, arg)
        seconds = time.perf_counter() - start
        return self.seen(backend, operation, len(handles), answer, seconds)

    def seen(
        self, backend: Backend, operation: str, entries: int, answer: object, seconds: float
    ) -> list[Outcome]:
        """Check a call's ``answer`` and tell the observers about the call."""
        outcomes = checked(backend, operation, entries, answer)
        if isinstance(answer, BaseException):
            error: str | None = type(answer).__name__
        else:
            error = None if answer is outcomes else "malformed"
        event = CallEvent(
            operation, backend, entries, seconds, tuple(o.kind for o in outcomes), error
        )
        self.tell("on_call", event)
        return outcomes

    def tell(self, callback: str, *args: object) -> None:
        """Call ``observer.<callback>(*args)`` on every observer; contain what raises."""
        for observer in self.observers:
            try:
                getattr(observer, callback)(*args)
            except Exception:
                self._on_error()
                log.exception("observer %r raised in %s", observer, callback)
