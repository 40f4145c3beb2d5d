"""A handler's operations on its lease: complete, release, abandon.

These run on the handler's thread (or the closing thread), one at a time per
lease under its op lock (rule 4), and work on the engine only through its named
methods: ``end``, ``reschedule``, ``drain``, ``count_lapses``.

A lease whose deadline passed without a successful extend is decided here as it
is for extends (rule 5): where receipts do not rotate (SQS), the service would
answer a delete or release with a stale handle with success and do nothing, so
the lease ends lost and nothing is sent; where they rotate (MNS, Azure), the
service itself tells a stale receipt from a live one, so the call is made.
"""

from __future__ import annotations

import logging
import math
import threading

from leasekeeper._calls import checked
from leasekeeper._engine import RenewalEngine
from leasekeeper._extend import RETRY_BASE
from leasekeeper._record import LeaseRecord, LeaseState
from leasekeeper.backends.base import OK, Handle, Outcome
from leasekeeper.clock import Clock, now_function
from leasekeeper.errors import BackendError, LeaseError, LeaseLost

log = logging.getLogger("leasekeeper.manager")

# A handler's delete/release is retried this many times on transient errors before
# the error reaches the handler.
OP_ATTEMPTS = 4

_ACTIVE = LeaseState.ACTIVE
_new_tuple = tuple.__new__  # builds a Handle without NamedTuple's Python-level __new__
_COMPLETED = LeaseState.COMPLETED
LAPSED = "lapsed: its invisibility ran out before it was extended"
_LAPSED = LAPSED
LATE_DELETE = "lapsed: the delete was answered after the deadline"


def valid_delay(delay: object) -> bool:
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        return False
    try:
        return math.isfinite(delay) and delay >= 0
    except OverflowError:  # an int beyond float range
        return False


class HandlerOps:
    """complete / release / abandon for the leases of one engine.

    Each operation is three steps, shared with the batch forms (``_batch_ops``):
    ``prepare_*`` decides, with the op lock held, whether a call is to be sent at all
    (or raises why not); the call; ``finish_*`` applies its outcome (after retrying
    a transient one with ``retry``) and raises what the handler must hear.
    """

    def __init__(self, engine: RenewalEngine) -> None:
        self.engine = engine
        self._clock = engine.clock
        self._now = now_function(engine.clock)
        self._config = engine.config
        self._calls = engine.calls  # the engine's one Calls, never replaced

    @property
    def clock(self) -> Clock:
        return self._clock

    # ------------------------------------------------------------------ complete

    def complete(self, record: LeaseRecord) -> None:
        # Half of the register/complete hot path (see ``make bench``): the common case
        # - active, in time, one delete that succeeds - runs first and short. The op
        # lock is taken with acquire/release rather than ``with``, which costs twice as
        # much in CPython 3.11 (the special-method lookups).
        lock = record.op_lock
        lock.acquire()
        try:
            if (
                record.state is not _ACTIVE or self._now() >= record.visible_until
            ) and not self.prepare_delete(record):
                return
            message = record.message
            calls = self._calls
            if calls.observers:  # timed and told: not the hot path any more
                first = calls.call(message.backend, "delete", [record.handle()], 0.0)[0]
                self.finish_delete(record, self.retry(record, "delete", 0.0, first))
                return
            try:
                answer: object = message.backend.delete(
                    [_new_tuple(Handle, (message.id, record.receipt))]
                )
            except Exception as exc:
                answer = exc
            # The common answer is [OK] itself (the shared instance); any other answer,
            # a well-formed success included, takes the general path below.
            if (
                type(answer) is list
                and len(answer) == 1
                and answer[0] is OK
                and (self._now() < record.visible_until or message.backend.rotates_receipts)
            ):
                self.engine.end_completed(record)
                return
            first = checked(message.backend, "delete", 1, answer)[0]
            self.finish_delete(record, self.retry(record, "delete", 0.0, first))
        finally:
            lock.release()

    def prepare_delete(self, record: LeaseRecord) -> bool:
        """Whether to send the delete of ``record`` (op lock held): False when it is
        completed already; raises when it cannot be completed. An abandoned lease
        whose message is still hidden may be; a lapsed one only where receipts
        rotate (rule 5)."""
        state = record.state
        if state is _ACTIVE:
            if self._now() >= record.visible_until:
                self._lapsed(record)  # raises where the delete would prove nothing
            return True
        if state is _COMPLETED:
            return False
        if state is LeaseState.RELEASED:
            if record.signalled:
                raise LeaseLost(record.message.id, record.reason or "released")
            raise LeaseError(
                f"lease on message {record.message.id!r} was released ({record.reason}); "
                "it cannot be completed"
            )
        if state is LeaseState.LOST or self._now() >= record.visible_until:
            raise LeaseLost(record.message.id, record.reason or str(state))
        return True  # abandoned, and its message still hidden

    def finish_delete(self, record: LeaseRecord, outcome: Outcome) -> None:
        """Apply a delete's outcome (op lock held): completed, or raise."""
        engine = self.engine
        if outcome.kind == "ok":
            if self._now() < record.visible_until or record.message.backend.rotates_receipts:
                engine.end_completed(record)
                return
            # Rule 5, as for an extend: the answer came after the deadline, so the
            # request may have reached the service after it too, when another consumer
            # could hold the message; where receipts do not rotate (SQS) the service
            # then answers success and deletes nothing. The message may come again.
            try:
                engine.end(record, LeaseState.LOST, LATE_DELETE)
                raise LeaseLost(record.message.id, LATE_DELETE)
            finally:
                self.after_op(record)
        try:
            if outcome.kind == "lost":
                # Rule 4: "not found" after we lost it is a loss, not a success.
                engine.end(record, LeaseState.LOST, f"lost: {outcome.detail}")
                raise LeaseLost(record.message.id, f"delete rejected: {outcome.detail}")
            if outcome.kind == "fatal":
                engine.end(record, LeaseState.LOST, f"fatal: {outcome.detail}")
            raise BackendError("delete", record.message.id, outcome.kind, outcome.detail)
        finally:
            self.after_op(record)

    def _lapsed(self, record: LeaseRecord) -> None:
        """The deadline passed unextended (op lock held): count the lapse, and where
        the service cannot tell (receipts do not rotate) end the lease lost."""
        engine = self.engine
        engine.count_lapses([record], self._now())
        if record.message.backend.rotates_receipts:
            return
        if record.state is _ACTIVE:
            engine.end(record, LeaseState.LOST, _LAPSED)
        engine.drain()
        raise LeaseLost(record.message.id, record.reason or _LAPSED)

    # ------------------------------------------------------------------ release

    def release(
        self, record: LeaseRecord, delay: float | None, *, stop_handler: bool = False
    ) -> None:
        """Release ``record``. ``stop_handler``: the release is not the handler's own
        doing (a shutdown), so set ``lease.lost`` to tell it to stop."""
        seconds = self.release_delay(record, delay)
        with record.op_lock:
            if not self.prepare_release(record):
                return
            backend = record.message.backend
            first = self.engine.calls.call(backend, "release", [record.handle()], seconds)[0]
            outcome = self.retry(record, "release", seconds, first)
            self.finish_release(record, outcome, seconds, stop_handler=stop_handler)

    def release_delay(self, record: LeaseRecord, delay: float | None) -> float:
        """The delay to release ``record`` with: ``delay``, checked, or the configured
        one grown per receive; capped by the backend's maximum."""
        if delay is None:
            cfg = self._config
            count = max(1, record.message.receive_count)
            try:
                delay = cfg.release_delay * cfg.release_backoff ** (count - 1)
            except OverflowError:  # a poison message received a thousand times
                delay = math.inf
        elif not valid_delay(delay):
            raise ValueError(f"release delay must be a finite number >= 0, got {delay!r}")
        return min(float(delay), record.message.backend.max_visibility)

    def prepare_release(self, record: LeaseRecord) -> bool:
        """Whether to send the release of ``record`` (op lock held): False when it
        ended already; raises for a completed or lapsed one (rule 5)."""
        state = record.state
        if state is _COMPLETED:
            raise LeaseError(
                f"lease on message {record.message.id!r} was completed; cannot release"
            )
        if state is not _ACTIVE:
            return False  # released already, or not ours to release
        if self._now() >= record.visible_until:
            self._lapsed(record)
        return True

    def finish_release(
        self, record: LeaseRecord, outcome: Outcome, delay: float, *, stop_handler: bool
    ) -> None:
        """Apply a release's outcome (op lock held)."""
        engine = self.engine
        try:
            if outcome.kind == "lost":
                engine.end(record, LeaseState.LOST, f"lost: {outcome.detail}")
            elif outcome.kind == "ok":
                reason = "released at shutdown" if stop_handler else f"released (delay {delay:g}s)"
                engine.end(record, LeaseState.RELEASED, reason, stop_handler=stop_handler)
            else:
                # Could not release: stop renewing so it lapses and comes back anyway.
                log.warning(
                    "release of message %r failed (%s: %s); it will reappear when its "
                    "invisibility runs out",
                    record.message.id,
                    outcome.kind,
                    outcome.detail,
                )
                engine.end(
                    record,
                    LeaseState.RELEASED,
                    f"release failed: {outcome.detail}",
                    stop_handler=stop_handler,
                )
        finally:
            self.after_op(record)

    def forget(self, record: LeaseRecord) -> None:
        """Stop renewing ``record`` without a call to the service. The op lock is held
        by an extend for as long as its call is out, so taking it here waits for that
        call: no extend of this lease reaches the service after this returns."""
        with record.op_lock:
            self.engine.end(record, LeaseState.FORGOTTEN, "forgotten: its owner took it back")
        self.engine.drain()

    def abandon(self, record: LeaseRecord, reason: str) -> None:
        """Stop renewing ``record`` and report it (as max_lease_duration would)."""
        self.engine.end(record, LeaseState.ABANDONED, reason)
        self.engine.drain()

    # ------------------------------------------------------------------ shared

    def retry(self, record: LeaseRecord, operation: str, arg: float, first: Outcome) -> Outcome:
        """``first`` (the outcome of a first attempt), or, while it is transient and the
        lease has time, that of up to ``OP_ATTEMPTS - 1`` more single calls."""
        backend = record.message.backend
        outcome = first
        for attempt in range(1, OP_ATTEMPTS):
            if outcome.kind != "retry" or self._now() >= record.visible_until:
                break
            self._sleep(RETRY_BASE * 2 ** (attempt - 1) * self.engine.rng.uniform(0.5, 1.5))
            outcome = self.engine.calls.call(backend, operation, [record.handle()], arg)[0]
        return outcome

    def _sleep(self, seconds: float) -> None:
        gate = threading.Condition()
        with gate:
            self._clock.wait(gate, seconds)

    def after_op(self, record: LeaseRecord) -> None:
        """After a handler's op: renew again if it is still ours, then report. (An
        extend that fell due meanwhile skipped the lease, which was left unscheduled.)"""
        if record.state is _ACTIVE and record.gen == 0:
            self.engine.reschedule(record)
        self.engine.drain()
