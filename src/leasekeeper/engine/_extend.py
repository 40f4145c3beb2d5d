"""The extend pipeline: plan, send and apply each renewal; the retry policy.

``Extender`` runs on the dispatch threads, one chunk of due leases at a time (at
most the backend's ``max_batch``). For each lease it decides how long to ask for
- or that the lease lapsed (rule 5, ``_lapse``), reached the service's cap or
``max_lease_duration`` - sends one call per group of leases asking the same
timeout, watches their deadlines while the call is out, and applies each entry's
outcome (see the table in docs/design.md, "Scheduling").

It gets what it uses and nothing more: the ``Calls`` it makes, the ``Ledger`` of the
leases it ends and reschedules, the ``OpGate`` of rule 4, the config, the clock and
the jitter. It never takes the engine's lock.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence

from leasekeeper.backends.contract import Backend, Handle, Message, Outcome
from leasekeeper.clock import Clock
from leasekeeper.config import LeaseConfig
from leasekeeper.engine._calls import Calls
from leasekeeper.engine._gate import OpGate
from leasekeeper.engine._lapse import lapsed
from leasekeeper.engine._ledger import Ledger
from leasekeeper.engine._schedule import Lane
from leasekeeper.reasons import Ending, LostReason
from leasekeeper.record import LeaseRecord, LeaseState

log = logging.getLogger("leasekeeper.manager")

# Retry of a failed extend: exponential from 50 ms to 5 s, jittered, and never later
# than half the time the lease has left (so several attempts fit before it lapses).
RETRY_BASE = 0.05
RETRY_CAP = 5.0

#: With ``on_cap="rollover"``, ``lease.rolling`` is set this many extend thresholds
#: before the service's cap: the time a handler gets for a step of work, the send of
#: its continuation and the delete of the original. (A lease that cannot be extended
#: to the cap any more is kept until the cap for that: it is not ended a threshold
#: early.) Each hop works for all of the cap but this, so a job of N caps takes the
#: fewest hops a cap allows when thresholds are small beside it.
ROLL_LEAD = 2.0


def rolling_at(hard_deadline: float, threshold: float) -> float:
    """When a lease whose message the service caps at ``hard_deadline`` is told to
    roll over (``on_cap="rollover"``)."""
    return hard_deadline - ROLL_LEAD * threshold


_ACTIVE = LeaseState.ACTIVE
_LOST = LeaseState.LOST
_ABANDONED = LeaseState.ABANDONED


def natural_due(
    record: LeaseRecord, threshold: float, max_lease: float | None, *, rolls: bool
) -> float:
    """When ``record`` is next due: ``threshold`` before its deadline, or at
    ``max_lease`` (``max_lease_duration``) after it was registered so that
    abandonment is reported on time; with ``rolls`` (``on_cap="rollover"``), when
    its handler is to be told to roll over, and for a lease that cannot be extended
    any more, at its deadline."""
    roll = record.roll
    if roll is not None and roll.capped is not None:
        return record.visible_until
    due = record.visible_until - threshold
    if max_lease is not None:
        due = min(due, record.registered_at + max_lease)
    hard = record.message.hard_deadline
    if rolls and hard is not None and (roll is None or not roll.signalled):
        due = min(due, rolling_at(hard, threshold))
    return due


def hold_until(message: Message, config: LeaseConfig, threshold: float, limited: bool) -> float:
    """Until when a lease on ``message`` may be held back from the schedule by its
    owner (the renewer process: most jobs end before their first renewal): a timer
    tick before its first extend could fall due, whatever an adaptive threshold does
    meanwhile. Minus infinity when ``limited``: its first due time would depend on
    when it is scheduled (``max_lease_duration``, rollovers)."""
    if limited:
        return -math.inf
    if config.adaptive:
        threshold = max(threshold, config.threshold_bounds[1])
    return message.visible_until - threshold - config.timer_interval


def owner_hold_until(message: Message, config: LeaseConfig) -> float:
    """``hold_until`` as a renewer engine on ``config`` computes it for ``message``,
    worked out by whoever else knows only the config (a worker whose renewer process
    holds its leases back): the threshold an engine holds leases against is the
    configured one, or an adaptive one's upper bound."""
    limited = config.on_cap == "rollover" or config.max_lease_duration is not None
    return hold_until(message, config, config.threshold, limited)


class Extender:
    """The extend pipeline of one renewal engine."""

    def __init__(
        self,
        calls: Calls,
        ledger: Ledger,
        gate: OpGate,
        *,
        config: LeaseConfig,
        clock: Clock,
        rng: random.Random,
    ) -> None:
        self._calls = calls
        self._ledger = ledger
        self._gate = gate
        self._config = config
        self._clock = clock
        self._rng = rng
        self._short_said = False  # a message arrived shorter than the threshold (said once)

    def extend_batch(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        """Extend one chunk of due leases (runs on a dispatch thread)."""
        try:
            self._extend_batch(lane, records)
        except BaseException as exc:
            # Rule 6: whatever escaped (a bug, or a CancelledError from an SDK bridged
            # onto asyncio), no popped lease is left unscheduled.
            self._ledger.bump("scheduler_errors")
            for record in records:
                if record.state is _ACTIVE and record.gen == 0:
                    self._ledger.reschedule(record, self._clock.now() + RETRY_BASE)
            if not isinstance(exc, Exception):
                raise
            log.error("leasekeeper dispatch error (%s); leases rescheduled", type(exc).__name__)
        self._ledger.drain()

    def _extend_batch(self, lane: Lane, records: Sequence[LeaseRecord]) -> None:
        # A lease that is busy is being completed, released or forgotten; that
        # operation reschedules it if it fails, so skip it here.
        taken = self._gate.try_take(records)
        try:
            now = self._clock.now()
            groups: dict[float, list[LeaseRecord]] = {}
            for record in taken:
                if record.state is not _ACTIVE:
                    continue
                asked = self._plan_extend(lane.backend, record, now)
                if asked is not None:
                    groups.setdefault(asked, []).append(record)
            for asked, group in groups.items():
                self._send_extend(lane, group, asked)
        finally:
            self._gate.give_all(taken)

    def _send_extend(self, lane: Lane, group: list[LeaseRecord], asked: float) -> None:
        backend = lane.backend
        ledger = self._ledger
        sent_at = self._clock.now()
        # Measured at the send, so it includes any wait for a dispatch thread; a lease
        # due before it was registered (it arrived with less than the threshold left)
        # is late only from its registration.
        send_lag = max(0.0, sent_at - min(max(r.due, r.registered_at) for r in group))
        late = [record for record in group if sent_at >= record.visible_until]
        if late:
            ledger.count_lapses(late, sent_at)
        on_time = [record for record in group if sent_at < record.visible_until]
        if on_time:
            ledger.watch_deadlines(lane, on_time)
        try:
            outcomes = self._calls.call(backend, "extend", [r.handle() for r in group], asked)
        finally:
            for record in group:
                record.watch = 0  # back in time (or not): the watch is moot
        answered_at = self._clock.now()
        latency = answered_at - sent_at
        ledger.bump("extend_calls")
        for record, outcome in zip(group, outcomes, strict=True):
            self._apply_extend(
                backend, record, outcome, sent_at=sent_at, answered_at=answered_at, asked=asked
            )
        if ledger.timed(send_lag, latency):
            self._warn_margin(send_lag, latency, ledger.threshold)
        ledger.adapt_threshold(answered_at)

    def _plan_extend(self, backend: Backend, record: LeaseRecord, now: float) -> float | None:
        """How long to ask for, or None after ending the lease (lost, abandoned, capped,
        stalled) or leaving it as it is until its next due time."""
        if not record.extensions and not self._short_said:
            self._say_if_short(record)
        if self._ended_before_sending(record, now) or self._rolling_only(record, now):
            return None
        asked = min(self._config.visibility_timeout, backend.max_visibility)
        hard = record.message.hard_deadline
        if hard is not None and now + asked > hard:
            asked = hard - now
            if now + asked <= record.visible_until + 1e-3:
                self._capped(record, "capped: the service's limit on total invisibility is reached")
                return None
        return asked

    def _say_if_short(self, record: LeaseRecord) -> None:
        """A message that arrived with less invisibility than the threshold is extended
        at once, at the cost of a call: not a lag, but a setting to fix. Said once."""
        left = record.visible_until - record.registered_at
        threshold = self._ledger.threshold
        if left >= threshold:
            return
        self._short_said = True
        log.warning(
            "a message arrived with %.1fs of invisibility, less than extend_threshold "
            "(%.1fs): such messages are extended at once, a call each. Receive them through "
            "the manager (manager.receive(), a Worker: they ask for visibility_timeout, %gs) "
            "or set the queue's own visibility timeout to %gs, to save that call",
            left,
            threshold,
            self._config.visibility_timeout,
            self._config.visibility_timeout,
        )

    def _ended_before_sending(self, record: LeaseRecord, now: float) -> bool:
        """End ``record`` if it is not to be extended at all: its time is up (lapsed,
        ``max_lease_duration``, capped and kept to its deadline) or its handler
        stalled. True when it ended (or was left for its next due time)."""
        ledger = self._ledger
        roll = record.roll
        if roll is not None and roll.capped is not None:
            # Capped, and kept to its deadline for a rollover: ended there.
            if now >= record.visible_until - 1e-3:
                ledger.end(record, _ABANDONED, Ending(LostReason.CAPPED, roll.capped))
            else:
                ledger.reschedule(record)
            return True
        ending = lapsed(record, now, "extend", "before sending")
        if ending is not None and not record.retries:
            ledger.count_lapses([record], now)
        limit = self._config.max_lease_duration
        if ending is None and limit is not None and now >= record.registered_at + limit:
            ending = Ending(LostReason.ABANDONED, f"max_lease_duration ({limit:g}s) reached")
            ledger.end(record, _ABANDONED, ending)
            return True
        stall = self._config.stall_timeout
        if ending is None and stall is not None and record.stalls:
            idle = now - record.last_progress()
            if idle >= stall:
                ending = Ending(
                    LostReason.STALLED,
                    f"stalled: no progress for {idle:.1f}s (stall_timeout {stall:g}s)",
                )
        if ending is None:
            return False
        ledger.end(record, _LOST, ending)
        return True

    def _rolling_only(self, record: LeaseRecord, now: float) -> bool:
        """With ``on_cap="rollover"``: tell the handler to roll over once the cap is
        near. True when the lease was due for that alone (its extend is not due yet)."""
        hard = record.message.hard_deadline
        if (
            hard is None
            or self._config.on_cap != "rollover"
            or record.is_rolling
            or now < rolling_at(hard, self._ledger.threshold)
        ):
            return False
        self._tell_rolling(record, hard - now)
        if now >= record.visible_until - self._ledger.threshold:
            return False
        self._ledger.reschedule(record)
        return True

    def _capped(self, record: LeaseRecord, detail: str) -> None:
        """``record`` cannot be extended any more. Abandoned (``capped``), or - with
        ``on_cap="rollover"`` - kept to its deadline, so that a rollover under way
        can finish (the message stays the handler's until then), and ended there."""
        if self._config.on_cap != "rollover" or self._clock.now() >= record.visible_until:
            self._ledger.end(record, _ABANDONED, Ending(LostReason.CAPPED, detail))
            return
        record.roll_state().capped = detail
        if not record.is_rolling:
            self._tell_rolling(record, record.visible_until - self._clock.now())
        self._ledger.reschedule(record, record.visible_until)

    def _tell_rolling(self, record: LeaseRecord, left: float) -> None:
        """Set ``lease.rolling``: the handler is to hand its job on."""
        if record.signal_rolling():
            log.info(
                "lease on message %r: %.1fs to the service's cap; the handler is told to roll over",
                record.message.id,
                left,
            )
            if self._calls.observers:
                self._calls.tell("on_rolling", record)

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
        ledger = self._ledger
        if record.state is not _ACTIVE:
            # Ended while the call was out (its deadline watch fired). Where receipts
            # rotate, a success means nobody else received the message and it is
            # hidden for another whole timeout with nobody on it: hand it back now.
            if kind == "ok" and outcome.receipt is not None and backend.rotates_receipts:
                ledger.submit(self.hand_back, backend, record.message.id, outcome.receipt)
            return
        if kind == "ok":
            deadline = record.visible_until
            ending = lapsed(record, answered_at, "extend", "answered")
            if ending is not None:
                ledger.end(record, _LOST, ending)
                return
            if outcome.receipt is not None:
                record.receipt = outcome.receipt
            # Rule 1: the deadline counts from just before the request was sent.
            record.visible_until = sent_at + asked
            record.extensions += 1
            if self._calls.observers:
                self._calls.tell("on_extended", record, deadline - answered_at)
            record.retries = 0
            ledger.bump("extended")
            ledger.reschedule(record)
            return
        if kind != "lost":
            ledger.bump("extend_errors")
        if kind == "lost":
            detail = outcome.detail or "receipt rejected"
            ledger.end(record, _LOST, Ending(LostReason.REJECTED, f"rejected: {detail}"))
        elif kind == "capped":
            self._capped(record, f"capped: {outcome.detail}")
        elif kind == "fatal":
            log.error("extend of message %r failed fatally: %s", record.message.id, outcome.detail)
            ledger.end(record, _LOST, Ending(LostReason.FATAL, f"fatal: {outcome.detail}"))
        else:
            self._retry(record, outcome.detail)

    def hand_back(self, backend: Backend, message_id: str, receipt: str) -> None:
        """Release a message whose lease already ended (visibility 0), best effort."""
        handle = Handle(message_id, receipt)
        outcome = self._calls.call(backend, "release", [handle], 0.0)[0]
        log.info("message %r handed back after a late extend: %s", message_id, outcome.kind)

    def _retry(self, record: LeaseRecord, detail: str) -> None:
        now = self._clock.now()
        record.last_error = detail
        ending = lapsed(record, now, "extend", "retrying")
        if ending is not None:
            self._ledger.end(record, _LOST, ending)
            return
        remaining = record.visible_until - now
        record.retries += 1
        backoff = min(RETRY_CAP, RETRY_BASE * 2 ** (record.retries - 1))
        delay = min(backoff * self._rng.uniform(0.5, 1.5), remaining / 2)
        self._ledger.bump("retries")
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
        self._ledger.reschedule(record, now + max(delay, min(remaining, 1e-3)))

    @staticmethod
    def _warn_margin(lag: float, latency: float, threshold: float) -> None:
        """Rule 3: lateness (the scheduler's own, and waiting for a dispatch thread)
        plus call latency eat into the extend threshold. The advice follows the
        larger of the two."""
        if lag >= latency:
            advice = (
                "renewals start late: a thread holding the GIL (use renewer='process') "
                "or every dispatch thread busy (raise max_concurrency)"
            )
        else:
            advice = "the service answers slowly: raise extend_threshold to renew earlier"
        log.warning(
            "send lag (%.3fs) + extend latency (%.3fs) exceed half of extend_threshold "
            "(%.3fs): leases risk lapsing; %s",
            lag,
            latency,
            threshold,
            advice,
        )
