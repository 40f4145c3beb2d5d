"""One backend call, guarded: whatever the backend does, the caller gets one Outcome per entry.

The renewal engine must never be taken down by a backend (rule 6), and a backend
is other people's code talking to other people's services. So an exception, or an
answer of the wrong shape, becomes "retry" for every entry, logged by the type of
the exception only (an SDK's exception text can quote the receipt it rejected).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from leasekeeper.backends.base import Backend, Handle, Outcome

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


def call_backend(
    backend: Backend, operation: str, handles: Sequence[Handle], arg: float
) -> list[Outcome]:
    """``backend.<operation>(handles[, arg])``, always answering one Outcome per handle."""
    try:
        if operation == "extend":
            answer: object = backend.extend(handles, arg)
        elif operation == "release":
            answer = backend.release(handles, arg)
        else:
            answer = backend.delete(handles)
    except Exception as exc:
        answer = exc
    return checked(backend, operation, len(handles), answer)


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
