"""A handler's operations on its lease: complete, release, abandon - and close()'s release.

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
from collections.abc import Sequence

from leasekeeper._calls import call_backend, checked
from leasekeeper._engine import RenewalEngine
from leasekeeper._extend import RETRY_BASE
from leasekeeper._record import LeaseRecord, LeaseState
from leasekeeper.backends.base import Backend, Handle, Outcome, chunked
from leasekeeper.clock import Clock, now_function
from leasekeeper.errors import BackendError, LeaseError, LeaseLost

log = logging.getLogger("leasekeeper.manager")

# A handler's delete/release is retried this many times on transient errors before
# the error reaches the handler.
OP_ATTEMPTS = 4

_ACTIVE = LeaseState.ACTIVE
_new_tuple = tuple.__new__  # builds a Handle without NamedTuple's Python-level __new__
_COMPLETED = LeaseState.COMPLETED
_LAPSED = "lapsed: its invisibility ran out before it was extended"


def valid_delay(delay: object) -> bool:
    if isinstance(delay, bool) or not isinstance(delay, (int, float)):
        return False
    try:
        return math.isfinite(delay) and delay >= 0
    except OverflowError:  # an int beyond float range
        return False


class HandlerOps:
    """complete / release / abandon for the leases of one engine."""

    def __init__(self, engine: RenewalEngine) -> None:
        self.engine = engine
        self._clock = engine.clock
        self._now = now_function(engine.clock)
        self._config = engine.config

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
            state = record.state
            if state is not _ACTIVE or self._now() >= record.visible_until:
                if state is _COMPLETED:
                    return
                self._before_late_delete(record)  # raises unless the delete may go
            message = record.message
            try:
                answer: object = message.backend.delete(
                    [_new_tuple(Handle, (message.id, record.receipt))]
                )
            except Exception as exc:
                answer = exc
            if type(answer) is list and len(answer) == 1:
                first = answer[0]
                if type(first) is Outcome and first.kind == "ok":
                    self.engine.end_completed(record)
                    return
            self._after_failed_delete(record, answer)
        finally:
            lock.release()

    def _after_failed_delete(self, record: LeaseRecord, answer: object) -> None:
        """The first delete did not simply succeed (op lock held): check its answer,
        retry what is transient, then complete, or raise."""
        engine = self.engine
        first = checked(record.message.backend, "delete", 1, answer)[0]
        outcome = self._single(record, "delete", 0.0, first)
        if outcome.kind == "ok":
            engine.end_completed(record)
            engine.drain()
            return
        try:
            if outcome.kind == "lost":
                # Rule 4: "not found" after we lost it is a loss, not a success.
                engine.end(record, LeaseState.LOST, f"lost: {outcome.detail}")
                raise LeaseLost(record.message.id, f"delete rejected: {outcome.detail}")
            if outcome.kind == "fatal":
                engine.end(record, LeaseState.LOST, f"fatal: {outcome.detail}")
            raise BackendError("delete", record.message.id, outcome.kind, outcome.detail)
        finally:
            self._after_op(record)

    def _before_late_delete(self, record: LeaseRecord) -> None:
        """A delete of a lease that is not active, or whose deadline passed: raise
        unless it may still be sent (op lock held). An abandoned lease whose message
        is still hidden may be; a lapsed one only where receipts rotate (rule 5)."""
        state = record.state
        if state is _ACTIVE:
            self._lapsed(record)  # raises where the delete would prove nothing
            return
        if state is LeaseState.RELEASED:
            if record.signalled:
                raise LeaseLost(record.message.id, record.reason or "released")
            raise LeaseError(
                f"lease on message {record.message.id!r} was released ({record.reason}); "
                "it cannot be completed"
            )
        if state is LeaseState.LOST or self._now() >= record.visible_until:
            raise LeaseLost(record.message.id, record.reason or str(state))

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
        backend = record.message.backend
        if delay is None:
            cfg = self._config
            count = max(1, record.message.receive_count)
            try:
                delay = cfg.release_delay * cfg.release_backoff ** (count - 1)
            except OverflowError:  # a poison message received a thousand times
                delay = math.inf
        elif not valid_delay(delay):
            raise ValueError(f"release delay must be a finite number >= 0, got {delay!r}")
        delay = min(float(delay), backend.max_visibility)
        engine = self.engine
        with record.op_lock:
            state = record.state
            if state is _COMPLETED:
                raise LeaseError(
                    f"lease on message {record.message.id!r} was completed; cannot release"
                )
            if state is not _ACTIVE:
                return  # released already, or not ours to release
            if self._now() >= record.visible_until:
                self._lapsed(record)
            try:
                outcome = self._single(record, "release", delay)
                if outcome.kind == "lost":
                    engine.end(record, LeaseState.LOST, f"lost: {outcome.detail}")
                elif outcome.kind == "ok":
                    reason = (
                        "released at shutdown" if stop_handler else f"released (delay {delay:g}s)"
                    )
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
                self._after_op(record)

    def abandon(self, record: LeaseRecord, reason: str) -> None:
        """Stop renewing ``record`` and report it (as max_lease_duration would)."""
        self.engine.end(record, LeaseState.ABANDONED, reason)
        self.engine.drain()

    # ------------------------------------------------------------------ shared

    def _single(
        self, record: LeaseRecord, operation: str, arg: float, first: Outcome | None = None
    ) -> Outcome:
        """Run a handler's delete/release, retrying transient errors a few times.
        ``first``: the outcome of a first attempt already made."""
        backend = record.message.backend
        if first is None:
            first = call_backend(backend, operation, [record.handle()], arg)[0]
        outcome = first
        for attempt in range(1, OP_ATTEMPTS):
            if outcome.kind != "retry":
                return outcome
            if self._clock.now() >= record.visible_until:
                break
            self._sleep(RETRY_BASE * 2 ** (attempt - 1) * self.engine.rng.uniform(0.5, 1.5))
            outcome = call_backend(backend, operation, [record.handle()], arg)[0]
        return outcome

    def _sleep(self, seconds: float) -> None:
        gate = threading.Condition()
        with gate:
            self._clock.wait(gate, seconds)

    def _after_op(self, record: LeaseRecord) -> None:
        """After a handler's op: renew again if it is still ours, then report. (An
        extend that fell due meanwhile skipped the lease, which was left unscheduled.)"""
        if record.state is _ACTIVE and record.gen == 0:
            self.engine.reschedule(record)
        self.engine.drain()

    # ------------------------------------------------------------------ close()

    def release_all(self, deadline: float | None) -> None:
        """Release every active lease, in batches, in parallel: a backend without
        batch calls (MNS, Azure) would otherwise take one round trip per lease, one
        after another, while a shutdown waits."""
        engine = self.engine
        chunks: list[tuple[Backend, Sequence[LeaseRecord]]] = []
        by_backend: dict[int, tuple[Backend, list[LeaseRecord]]] = {}
        for record in engine.records():
            wait = -1.0 if deadline is None else max(0.0, deadline - self._clock.now())
            # A handler may be mid-delete: wait for it rather than race it.
            if not record.op_lock.acquire(timeout=wait):
                continue
            if record.state is not _ACTIVE:
                record.op_lock.release()
                continue
            backend = record.message.backend
            if self._clock.now() >= record.visible_until and not backend.rotates_receipts:
                engine.end(record, LeaseState.LOST, _LAPSED)  # a release would prove nothing
                record.op_lock.release()
                continue
            by_backend.setdefault(id(backend), (backend, []))[1].append(record)
        for backend, records in by_backend.values():
            chunks += [(backend, chunk) for chunk in chunked(records, backend.max_batch)]
        ran = engine.dispatcher.run_all(
            [(self._release_chunk, (backend, chunk)) for backend, chunk in chunks], deadline
        )
        for (_, chunk), done in zip(chunks, ran, strict=True):
            if done:
                continue
            for record in chunk:  # still queued at the timeout: never sent
                engine.end(
                    record,
                    LeaseState.RELEASED,
                    "close() timed out before releasing it: it lapses",
                    stop_handler=True,
                )
                record.op_lock.release()
        engine.drain()

    def _release_chunk(self, backend: Backend, chunk: Sequence[LeaseRecord]) -> None:
        """Release one batch of leases whose op locks the caller took; unlock them."""
        try:
            handles = [record.handle() for record in chunk]
            outcomes = call_backend(backend, "release", handles, 0.0)
            for record, outcome in zip(chunk, outcomes, strict=True):
                if outcome.kind not in ("ok", "lost"):
                    log.warning(
                        "close(): release of message %r failed (%s: %s); "
                        "it reappears when its invisibility runs out",
                        record.message.id,
                        outcome.kind,
                        outcome.detail,
                    )
                self.engine.end(
                    record, LeaseState.RELEASED, "released by close()", stop_handler=True
                )
        finally:
            for record in chunk:
                record.op_lock.release()
            self.engine.drain()  # close() may have returned already
