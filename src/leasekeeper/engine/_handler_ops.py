"""A handler's operations on its lease: complete, release, forget, abandon.

These run on the handler's thread (or the closing thread), one at a time per lease
(rule 4: the lease's busy flag, ``_gate``), and work on the engine only through its
``Ledger``: ``end``, ``end_completed``, ``reschedule``, ``drain``, ``count_lapses``.

A lease whose deadline passed without a successful extend is judged by rule 5
(``_lapse``) as it is for extends: where receipts do not rotate (SQS), the service
would answer a delete or release with a stale handle with success and do nothing,
so the lease ends lost and nothing is sent; where they rotate (MNS, Azure), the
service itself tells a stale receipt from a live one, so the call is made.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from typing import TYPE_CHECKING

from leasekeeper.backends.contract import OK, Handle, Outcome
from leasekeeper.clock import Clock, now_function
from leasekeeper.config import LeaseConfig
from leasekeeper.engine._calls import Calls, checked
from leasekeeper.engine._extend import RETRY_BASE
from leasekeeper.engine._gate import OpGate
from leasekeeper.engine._lapse import Operation, lapsed
from leasekeeper.engine._ledger import Ledger
from leasekeeper.engine._transitions import (
    COMPLETED,
    FORGOTTEN,
    completable,
    lost_error,
    releasable,
    released,
)
from leasekeeper.errors import BackendError, LeaseLost
from leasekeeper.failures import Failures
from leasekeeper.reasons import Ending, LostReason
from leasekeeper.record import LeaseRecord, LeaseState

if TYPE_CHECKING:
    from leasekeeper.lease import Lease

log = logging.getLogger("leasekeeper.manager")

# A handler's delete/release is retried this many times on transient errors before
# the error reaches the handler.
OP_ATTEMPTS = 4

_ACTIVE = LeaseState.ACTIVE
_new_tuple = tuple.__new__  # builds a Handle without NamedTuple's Python-level __new__


def valid_delay(delay: object) -> bool:
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        return False
    try:
        return math.isfinite(delay) and delay >= 0
    except OverflowError:  # an int beyond float range
        return False


class HandlerOps:
    """complete / release / forget / abandon for the leases of one engine.

    Each operation is three steps, shared with the batch forms (``_batch_ops``):
    ``prepare_*`` decides, with the lease taken, whether a call is to be sent at all
    (or raises why not); the call; ``finish_*`` applies its outcome (after retrying
    a transient one with ``retry``) and raises what the handler must hear.
    """

    def __init__(
        self,
        ledger: Ledger,
        gate: OpGate,
        calls: Calls,
        *,
        config: LeaseConfig,
        clock: Clock,
        rng: random.Random,
        lock: threading.Lock,
    ) -> None:
        self._ledger = ledger
        self._gate = gate
        self._calls = calls  # the engine's one Calls, never replaced
        self._config = config
        self._clock = clock
        self._now = now_function(clock)
        self._rng = rng
        # The engine's registry lock, which guards the busy flags: the hot path below
        # sets one inline rather than through the gate (a call less per complete).
        self._lock = lock
        #: What a handler's failure does (release with a growing delay, or dead-letter
        #: a poison message); the manager binds its own.
        self.failures = Failures(config, None, rng)

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def gate(self) -> OpGate:
        return self._gate

    # ------------------------------------------------------------------ complete

    def complete(self, record: LeaseRecord) -> None:
        # Half of the register/complete hot path (see ``make bench``): the common case
        # - active, free, in time, one delete that succeeds - runs first and short,
        # taking the registry lock twice in all (here, and in end_completed, which
        # gives the lease back). The op lock of old was a lock object per lease; the
        # busy flag (rule 4, ``_gate``) costs no more bytecodes than it did.
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost in CPython 3.11, on the hot path
        if record.busy:
            lock.release()
            self._gate.take(record)  # an extend is out: wait for its receipt
        else:
            record.busy = True
            lock.release()
        try:
            if record.state is _ACTIVE and not self._calls.observers:
                visible_until = record.visible_until
                if self._now() < visible_until:
                    message = record.message
                    try:
                        answer: object = message.backend.delete(
                            [_new_tuple(Handle, (message.id, record.receipt))]
                        )
                    except Exception as exc:
                        answer = exc
                    # The common answer is [OK] itself (the shared instance), in time;
                    # any other - a well-formed success included, or one after the
                    # deadline, which rule 5 judges (``_lapse``) - goes the long way.
                    if (
                        type(answer) is list
                        and len(answer) == 1
                        and answer[0] is OK
                        and self._now() < visible_until
                    ):
                        self._ledger.end_completed(record)
                        return
                    first = checked(message.backend, "delete", 1, answer)[0]
                    self.finish_delete(record, self.retry(record, "delete", 0.0, first))
                    self.after_op(record)
                    return
            self._complete_slowly(record)
        except BaseException:
            self.after_op(record)  # never left busy: a later operation would wait for ever
            raise

    def _complete_slowly(self, record: LeaseRecord) -> None:
        """``complete`` of a lease that is not simply active and in time, or with
        observers to tell (the lease taken; given back here, unless it raises)."""
        if (
            record.state is not _ACTIVE or self._now() >= record.visible_until
        ) and not self.prepare_delete(record):
            self.after_op(record)
            return  # completed already
        message = record.message
        first = self._calls.call(message.backend, "delete", [record.handle()], 0.0)[0]
        self.finish_delete(record, self.retry(record, "delete", 0.0, first))
        self.after_op(record)

    def prepare_delete(self, record: LeaseRecord) -> bool:
        """Whether to send the delete of ``record`` (taken): False when it is
        completed already; raises when it cannot be completed. An abandoned lease
        whose message is still hidden may be; a lapsed one only where receipts
        rotate (rule 5)."""
        if record.state is _ACTIVE:
            self._judge_before_sending(record, "delete")
            return True
        return completable(record, self._now())

    def finish_delete(self, record: LeaseRecord, outcome: Outcome) -> None:
        """Apply a delete's outcome (the lease taken; the caller gives it back):
        completed, or raise."""
        ledger = self._ledger
        if outcome.kind == "ok":
            ending = lapsed(record, self._now(), "delete", "answered")
            if ending is None:
                ledger.end(record, LeaseState.COMPLETED, COMPLETED)  # the caller gives it back
                return
            # Rule 5, as for an extend: the answer came after the deadline, so the
            # request may have reached the service after it too, when another consumer
            # could hold the message; where receipts do not rotate (SQS) the service
            # then answers success and deletes nothing. The message may come again.
            ledger.end(record, LeaseState.LOST, ending)
            raise LeaseLost(record.message.id, ending.detail, ending.lost_reason)
        if outcome.kind == "lost":
            # Rule 4: "not found" after we lost it is a loss, not a success.
            ending = Ending(LostReason.REJECTED, f"rejected: {outcome.detail}")
            ledger.end(record, LeaseState.LOST, ending)
            raise LeaseLost(
                record.message.id, f"delete rejected: {outcome.detail}", LostReason.REJECTED
            )
        if outcome.kind == "fatal":
            ledger.end(
                record, LeaseState.LOST, Ending(LostReason.FATAL, f"fatal: {outcome.detail}")
            )
        raise BackendError("delete", record.message.id, outcome.kind, outcome.detail)

    def _judge_before_sending(self, record: LeaseRecord, operation: Operation) -> None:
        """Before a delete or release of an active lease (taken): count a lapse, and
        where rule 5 says the call would prove nothing, end the lease lost and raise."""
        now = self._now()
        if now < record.visible_until:
            return
        self._ledger.count_lapses([record], now)
        ending = lapsed(record, now, operation, "before sending")
        if ending is None:
            return
        if record.state is _ACTIVE:
            self._ledger.end(record, LeaseState.LOST, ending)
        self._ledger.drain()
        raise lost_error(record, ending.detail)

    # ------------------------------------------------------------------ release

    def release(
        self, record: LeaseRecord, delay: float | None, *, stop_handler: bool = False
    ) -> None:
        """Release ``record``. ``stop_handler``: the release is not the handler's own
        doing (a shutdown), so set ``lease.lost`` to tell it to stop."""
        seconds = self.release_delay(record, delay)
        self._gate.take(record)
        try:
            if not self.prepare_release(record):
                return
            backend = record.message.backend
            first = self._calls.call(backend, "release", [record.handle()], seconds)[0]
            outcome = self.retry(record, "release", seconds, first)
            self.finish_release(record, outcome, seconds, stop_handler=stop_handler)
        finally:
            self.after_op(record)

    def release_delay(self, record: LeaseRecord, delay: float | None) -> float:
        """The delay to release ``record`` with: ``delay``, checked, or the configured
        one grown per receive; capped by the backend's maximum."""
        if delay is None:
            # Jittered from the engine's rng: reproducible under jitter_seed.
            jitter = self._rng.uniform(0.8, 1.2) if self._config.release_delay else 1.0
            delay = self._config.failed_delay(record.message.receive_count, jitter)
        elif not valid_delay(delay):
            raise ValueError(f"release delay must be a finite number >= 0, got {delay!r}")
        return min(float(delay), record.message.backend.max_visibility)

    def prepare_release(self, record: LeaseRecord) -> bool:
        """Whether to send the release of ``record`` (taken): False when it ended
        already; raises for a completed or lapsed one (rule 5)."""
        if not releasable(record):
            return False  # released already, or not ours to release
        self._judge_before_sending(record, "release")
        return True

    def finish_release(
        self, record: LeaseRecord, outcome: Outcome, delay: float, *, stop_handler: bool
    ) -> None:
        """Apply a release's outcome (the lease taken; the caller gives it back)."""
        ledger = self._ledger
        if outcome.kind == "lost":
            ledger.end(
                record,
                LeaseState.LOST,
                Ending(LostReason.REJECTED, f"rejected: {outcome.detail}"),
            )
        elif outcome.kind == "ok":
            ending = released(delay, stop_handler)
            ledger.end(record, LeaseState.RELEASED, ending, stop_handler=stop_handler)
        else:
            # Could not release: stop renewing so it lapses and comes back anyway.
            log.warning(
                "release of message %r failed (%s: %s); it will reappear when its "
                "invisibility runs out",
                record.message.id,
                outcome.kind,
                outcome.detail,
            )
            ledger.end(
                record,
                LeaseState.RELEASED,
                Ending(None, f"release failed: {outcome.detail}"),
                stop_handler=stop_handler,
            )

    # ------------------------------------------------------------------ the rest

    def fail(self, lease: Lease, error: BaseException | None, delay: float | None) -> None:
        """The handler failed: ``Failures`` releases the message or dead-letters it."""
        self.failures.fail(lease, error, delay)

    def forget(self, record: LeaseRecord) -> None:
        """Stop renewing ``record`` without a call to the service. An extend keeps the
        lease busy for as long as its call is out, so taking it here waits for that
        call: no extend of this lease reaches the service after this returns."""
        self._gate.take(record)
        try:
            self._ledger.end(record, LeaseState.FORGOTTEN, FORGOTTEN)
        finally:
            self._gate.give(record)
        self._ledger.drain()

    def progress(self, record: LeaseRecord) -> None:
        """The handler made progress: the stall clock (``stall_timeout``) starts over."""
        record.progressed_at = self._now()

    def rolled_over(self, record: LeaseRecord) -> None:
        """Count a rollover (the continuation sent, the original deleted)."""
        self._ledger.bump("rolled_over")

    def abandon(self, record: LeaseRecord, reason: str) -> None:
        """Stop renewing ``record`` and report it: its handler succeeded but the delete
        kept failing, so the message is left to come back and be done again."""
        self._ledger.end(record, LeaseState.ABANDONED, Ending(LostReason.DELETE_FAILED, reason))
        self._ledger.drain()

    def retry(self, record: LeaseRecord, operation: str, arg: float, first: Outcome) -> Outcome:
        """``first`` (the outcome of a first attempt), or, while it is transient and the
        lease has time, that of up to ``OP_ATTEMPTS - 1`` more single calls."""
        backend = record.message.backend
        outcome = first
        for attempt in range(1, OP_ATTEMPTS):
            if outcome.kind != "retry" or self._now() >= record.visible_until:
                break
            self._sleep(RETRY_BASE * 2 ** (attempt - 1) * self._rng.uniform(0.5, 1.5))
            outcome = self._calls.call(backend, operation, [record.handle()], arg)[0]
        return outcome

    def _sleep(self, seconds: float) -> None:
        gate = threading.Condition()
        with gate:
            self._clock.wait(gate, seconds)

    def after_op(self, record: LeaseRecord) -> None:
        """After a handler's op: give the lease back, renew it again if it is still
        ours, then report. (An extend that fell due meanwhile skipped the lease,
        which was left unscheduled.)"""
        self._gate.give(record)
        if record.state is _ACTIVE and record.gen == 0:
            self._ledger.reschedule(record)
        self._ledger.drain()
