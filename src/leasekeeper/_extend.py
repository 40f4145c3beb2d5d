"""The extend pipeline: plan, send and apply each renewal; the retry policy.

``Extender`` runs on the dispatch threads, one chunk of due leases at a time (at
most the backend's ``max_batch``). For each lease it decides how long to ask for
- or that the lease lapsed, reached the service's cap or ``max_lease_duration``
- sends one call per group of leases asking the same timeout, watches their
deadlines while the call is out, and applies each entry's outcome (see the table
in docs/design.md, "Scheduling"). It is part of the renewal engine and works on
it through the engine's named methods; the counters it bumps are guarded by the
engine's registry lock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

from leasekeeper._record import LeaseRecord, LeaseState
from leasekeeper._schedule import Lane
from leasekeeper.backends.base import Backend, Handle, Outcome

if TYPE_CHECKING:
    from leasekeeper._engine import RenewalEngine

log = logging.getLogger("leasekeeper.manager")

# Retry of a failed extend: exponential from 50 ms to 5 s, jittered, and never later
# than half the time the lease has left (so several attempts fit before it lapses).
RETRY_BASE = 0.05
RETRY_CAP = 5.0

_ACTIVE = LeaseState.ACTIVE


class Extender:
    """The extend pipeline of one ``RenewalEngine``."""

    def __init__(self, engine: RenewalEngine) -> None:
        self._engine = engine
        self._lock = engine.registry_lock
        self._metrics = engine.metrics
        self._clock = engine.clock
        self._config = engine.config

    def extend_batch(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        """Extend one chunk of due leases (runs on a dispatch thread)."""
        try:
            self._extend_batch(lane, records)
        except BaseException as exc:
            # Rule 6: whatever escaped (a bug, or a CancelledError from an SDK bridged
            # onto asyncio), no popped lease is left unscheduled.
            with self._lock:
                self._metrics.scheduler_errors += 1
            for record in records:
                if record.state is _ACTIVE and record.gen == 0:
                    self._engine.reschedule(record, self._clock.now() + RETRY_BASE)
            if not isinstance(exc, Exception):
                raise
            log.error("leasekeeper dispatch error (%s); leases rescheduled", type(exc).__name__)
        self._engine.drain()

    def _extend_batch(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        backend = lane.backend
        locked: list[LeaseRecord] = []
        for record in records:
            # A handler holding the op lock is completing or releasing the lease;
            # that operation reschedules it if it fails, so skip it here.
            if record.op_lock.acquire(blocking=False):
                locked.append(record)
        try:
            now = self._clock.now()
            groups: dict[float, list[LeaseRecord]] = {}
            for record in locked:
                if record.state is not _ACTIVE:
                    continue
                asked = self._plan_extend(backend, record, now)
                if asked is not None:
                    groups.setdefault(asked, []).append(record)
            for asked, group in groups.items():
                self._send_extend(lane, group, asked)
        finally:
            for record in locked:
                record.op_lock.release()

    def _send_extend(self, lane: Lane, group: list[LeaseRecord], asked: float) -> None:
        backend = lane.backend
        sent_at = self._clock.now()
        # Measured at the send, so it includes any wait for a dispatch thread.
        send_lag = max(0.0, sent_at - min(record.due for record in group))
        self._metrics.send_lag.append(send_lag)
        late = [record for record in group if sent_at >= record.visible_until]
        if late:
            self._engine.count_lapses(late, sent_at)
        on_time = [record for record in group if sent_at < record.visible_until]
        if on_time:
            with self._lock:
                for record in on_time:
                    self._engine.schedule.watch(lane, record)
                earliest = min(record.visible_until for record in on_time)
                if earliest < self._engine.dispatcher.next_wake:
                    self._engine.dispatcher.wake_locked()
        try:
            outcomes = self._engine.calls.call(
                backend, "extend", [r.handle() for r in group], asked
            )
        finally:
            for record in group:
                record.watch = 0  # back in time (or not): the watch is moot
        answered_at = self._clock.now()
        latency = answered_at - sent_at
        self._metrics.extend_latency.append(latency)
        with self._lock:
            self._metrics.extend_calls += 1
        for record, outcome in zip(group, outcomes, strict=True):
            self._apply_extend(
                backend, record, outcome, sent_at=sent_at, answered_at=answered_at, asked=asked
            )
        self._check_margin(send_lag, latency)
        self._engine.adapt_threshold(answered_at)

    def _plan_extend(self, backend: Backend, record: LeaseRecord, now: float) -> float | None:
        """How long to ask for, or None after ending the lease (lost, abandoned, capped)."""
        if now >= record.visible_until:
            if record.retries:
                # Transient errors all the way to the deadline: the service's fault.
                self._engine.end(
                    record,
                    LeaseState.LOST,
                    f"no successful extend before its deadline (last error: {record.last_error})",
                )
                return None
            if not backend.rotates_receipts:
                # Rule 5: where receipts do not rotate (SQS), the service answers a
                # late extend with success whether or not another consumer received
                # the message meanwhile, so its answer would prove nothing: the lapse
                # is decided here, and nothing is sent.
                self._engine.count_lapses([record], now)
                self._engine.end(
                    record,
                    LeaseState.LOST,
                    "lapsed: its invisibility ran out before an extend was sent",
                )
                return None
        limit = self._config.max_lease_duration
        if limit is not None and now >= record.registered_at + limit:
            self._engine.end(
                record, LeaseState.ABANDONED, f"max_lease_duration ({limit:g}s) reached"
            )
            return None
        asked = min(self._config.visibility_timeout, backend.max_visibility)
        hard = record.message.hard_deadline
        if hard is not None and now + asked > hard:
            asked = hard - now
            if now + asked <= record.visible_until + 1e-3:
                self._engine.end(
                    record,
                    LeaseState.ABANDONED,
                    "capped: the service's limit on total invisibility is reached",
                )
                return None
        return asked

    def _apply_extend(
        self,
        backend: Backend,
        record: LeaseRecord,
        outcome: Outcome,
        *,
        sent_at: float,
        answered_at: float,
        asked: float,
    ) -> None:
        kind = outcome.kind
        if record.state is not _ACTIVE:
            # Ended while the call was out (its deadline watch fired). Where receipts
            # rotate, a success means nobody else received the message and it is
            # hidden for another whole timeout with nobody on it: hand it back now.
            if kind == "ok" and outcome.receipt is not None and backend.rotates_receipts:
                self._engine.dispatcher.submit(
                    self.hand_back, backend, record.message.id, outcome.receipt
                )
            return
        if kind == "ok":
            deadline = record.visible_until
            if answered_at >= deadline and not backend.rotates_receipts:
                # The answer came after the deadline: the service may have got the
                # request after it too, and then its success proves nothing (rule 5).
                self._engine.end(
                    record, LeaseState.LOST, "lapsed: the extend was answered after the deadline"
                )
                return
            if outcome.receipt is not None:
                record.receipt = outcome.receipt
            # Rule 1: the deadline counts from just before the request was sent.
            record.visible_until = sent_at + asked
            record.extensions += 1
            if self._engine.calls.observers:
                self._engine.calls.tell("on_extended", record, deadline - answered_at)
            record.retries = 0
            with self._lock:
                self._metrics.extended += 1
            self._engine.reschedule(record)
            return
        if kind != "lost":
            with self._lock:
                self._metrics.extend_errors += 1
        if kind == "lost":
            self._engine.end(
                record, LeaseState.LOST, f"lost: {outcome.detail or 'receipt rejected'}"
            )
        elif kind == "capped":
            self._engine.end(record, LeaseState.ABANDONED, f"capped: {outcome.detail}")
        elif kind == "fatal":
            log.error("extend of message %r failed fatally: %s", record.message.id, outcome.detail)
            self._engine.end(record, LeaseState.LOST, f"fatal: {outcome.detail}")
        else:
            self._retry(record, outcome.detail)

    def hand_back(self, backend: Backend, message_id: str, receipt: str) -> None:
        """Release a message whose lease already ended (visibility 0), best effort."""
        handle = Handle(message_id, receipt)
        outcome = self._engine.calls.call(backend, "release", [handle], 0.0)[0]
        log.info("message %r handed back after a late extend: %s", message_id, outcome.kind)

    def _retry(self, record: LeaseRecord, detail: str) -> None:
        now = self._clock.now()
        remaining = record.visible_until - now
        if remaining <= 0:
            self._engine.end(
                record,
                LeaseState.LOST,
                f"no successful extend before its deadline (last error: {detail})",
            )
            return
        record.retries += 1
        record.last_error = detail
        backoff = min(RETRY_CAP, RETRY_BASE * 2 ** (record.retries - 1))
        delay = min(backoff * self._engine.rng.uniform(0.5, 1.5), remaining / 2)
        with self._lock:
            self._metrics.retries += 1
        log.info(
            "extend of message %r failed (%s); retry %d in %.3fs, %.3fs left",
            record.message.id,
            detail,
            record.retries,
            delay,
            remaining,
        )
        # Scheduled at most `remaining / 2` ahead, the final retry is due at the
        # deadline itself, where _plan_extend turns it into "lost".
        self._engine.reschedule(record, now + max(delay, min(remaining, 1e-3)))

    def _check_margin(self, lag: float, latency: float) -> None:
        """Rule 3: warn when lateness (the scheduler's own, and waiting for a dispatch
        thread) plus call latency eat into the extend threshold."""
        threshold = self._engine.threshold
        if lag + latency <= threshold / 2:
            return
        now = self._clock.now()
        with self._lock:
            if not self._metrics.margin_warning_due(now):
                return
        log.warning(
            "send lag (%.3fs) + extend latency (%.3fs) exceed half of extend_threshold "
            "(%.3fs): leases risk lapsing; raise extend_threshold or max_concurrency",
            lag,
            latency,
            threshold,
        )
