"""ECS task scale-in protection: a busy worker's task is not scaled in or replaced.

``Worker(..., scale_in_protection=True)`` (``AsyncWorker`` the same; ``leasekeeper
worker --scale-in-protection``) adds a ``ScaleInProtection`` to the worker's
listeners. Through the ECS agent's endpoint, ``$ECS_AGENT_URI/task-protection/v1/
state`` (a PUT of ``{"ProtectionEnabled": true, "ExpiresInMinutes": N}``), it
protects the task when the worker goes from holding no message to holding some -
before their handlers start - and renews the protection while the worker stays
busy, ``renew_lead`` before the N minutes run out. It removes it once the worker
has held nothing for ``idle_grace`` seconds (so a worker that takes one message
after another makes one call a busy spell, not one a message: the agent is
rate-limited), and at once when the graceful shutdown begins (SIGTERM).

What it cannot do costs one WARNING and never stops the work: outside ECS
(``ECS_AGENT_URI`` unset) it says so once and does nothing; a call that fails (the
agent unreachable, an HTTP error, ECS's refusal) is retried while it still matters,
15 s after the first failure and up to 5 minutes apart, and only the first failure
of a run of them is a WARNING. A task ECS will never protect (a standalone task:
``TASK_NOT_VALID``) is said once, and protection is off from then on.

``ProtectionPlan`` decides which call is due when (plain data and numbers, tested
without threads); ``ScaleInProtection`` makes the calls on one thread of its own
(``leasekeeper-ecs-protection``), waiting on the worker's clock - on a
``leasekeeper.testing.ManualClock`` its moments come when the test advances it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass

from leasekeeper.clock import SYSTEM_CLOCK, Clock, wait_until
from leasekeeper.fleet._http import Answer, call, join
from leasekeeper.receiving.listeners import WorkerListener

__all__ = [
    "AGENT_PATH",
    "EcsAgent",
    "ProtectionError",
    "ProtectionPlan",
    "ScaleInProtection",
]

log = logging.getLogger("leasekeeper.fleet")

#: The task-protection endpoint, under ``$ECS_AGENT_URI``.
AGENT_PATH = "task-protection/v1/state"
#: ``ExpiresInMinutes``' range, as ECS takes it.
MIN_MINUTES, MAX_MINUTES = 1, 2880
#: The failure reason of a task that cannot be protected at all (not part of a service).
NEVER = frozenset({"TASK_NOT_VALID"})


class ProtectionError(Exception):
    """A protection call that did not take effect, as far as is known: ``unsure``,
    it may have (the agent timed out, or failed after it may have asked ECS);
    ``permanent``, it never will."""

    def __init__(self, message: str, *, permanent: bool = False, unsure: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent
        self.unsure = unsure


class EcsAgent:
    """The ECS agent's task-protection endpoint (``agent_uri``: ``$ECS_AGENT_URI``)."""

    def __init__(self, agent_uri: str, *, timeout: float = 5.0) -> None:
        self.url = join(agent_uri, AGENT_PATH)
        self.timeout = timeout

    def put(self, enabled: bool, minutes: int) -> None:
        """Protect the task for ``minutes`` (or remove its protection); raises
        ``ProtectionError`` unless the agent answers with the protection it set.
        ``ExpiresInMinutes`` goes with both: ECS reads it only to protect."""
        body = json.dumps({"ProtectionEnabled": enabled, "ExpiresInMinutes": minutes})
        try:
            answer = call(
                "PUT",
                self.url,
                headers={"Content-Type": "application/json"},
                body=body.encode(),
                timeout=self.timeout,
            )
        except Exception as exc:  # refused, reset, timed out, a malformed answer
            raise ProtectionError(
                f"the ECS agent did not answer ({type(exc).__name__}: {exc})",
                unsure=isinstance(exc, TimeoutError),  # it had the request
            ) from None
        refusal = _refusal(answer)
        if refusal is not None:
            raise refusal

    def __repr__(self) -> str:
        return f"EcsAgent({self.url!r})"


def _refusal(answer: Answer) -> ProtectionError | None:
    """None for the agent's success (``{"protection": {...}}``), else why not: ECS's
    ``failure`` (``Arn``, ``Reason``, ``Detail``), the agent's ``error`` (``Code``,
    ``Message``), or the HTTP status."""
    try:
        data = json.loads(answer.body) if answer.body else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        data = {}
    if answer.status == 200 and isinstance(data.get("protection"), dict):
        return None
    failure = data.get("failure")
    if isinstance(failure, dict):
        reason = str(failure.get("Reason") or "unknown")
        detail = failure.get("Detail")
        text = f"ECS refused: {reason}" + (f" ({detail})" if detail else "")
        return ProtectionError(text[:300], permanent=reason in NEVER)
    unsure = answer.status >= 500  # the agent may have asked ECS, which may have done it
    error = data.get("error")
    if isinstance(error, dict):
        text = f"HTTP {answer.status}: {error.get('Code') or 'error'}: {error.get('Message') or ''}"
        return ProtectionError(text.strip(": ")[:300], unsure=unsure)
    text = f"HTTP {answer.status} from the ECS agent: {answer.text[:200]!r}"
    return ProtectionError(text, unsure=unsure)


def backoff(failures: int) -> float:
    """Seconds before trying again after ``failures`` failed calls in a row: 15 s,
    doubling, at most 5 minutes."""
    return min(300.0, 15.0 * 2.0 ** (failures - 1))


@dataclass
class ProtectionPlan:
    """Which protection call is due when: the worker's moments in, calls out (times
    on the worker's clock; pure - no thread, no I/O).

    ``protected_until`` is a conservative estimate: the time just before the last
    successful protect was sent, plus its minutes (ECS counts from when it got it,
    later). A failed call changes nothing of what is believed; it only delays the
    next try (``retry_at``) - except that a protect whose outcome is unknown (the
    agent timed out, or failed after it may have asked ECS) may hold until
    ``maybe_until``: once idle, the protection is lifted all the same, so that a
    task is never left protected by a call that seemed to fail.
    """

    minutes: int = 60
    idle_grace: float = 5.0
    busy: bool = False
    draining: bool = False
    idle_since: float | None = None
    protected_until: float | None = None
    maybe_until: float | None = None
    retry_at: float | None = None
    failures: int = 0

    @property
    def renew_lead(self) -> float:
        """How long before the protection ends a busy worker renews it: a quarter of
        it, at least a minute, at most half."""
        period = self.minutes * 60.0
        return min(period / 2, max(60.0, period / 4))

    def protected(self, now: float) -> bool:
        return self.protected_until is not None and now < self.protected_until

    def held(self, now: float) -> bool:
        """Protected, or maybe (an unsure protect): what lifting it is for."""
        return self.protected(now) or (self.maybe_until is not None and now < self.maybe_until)

    def on_busy(self) -> None:
        if not self.draining:
            self.busy, self.idle_since = True, None

    def on_idle(self, now: float) -> None:
        self.busy, self.idle_since = False, now

    def on_drain(self) -> None:
        if not self.draining:
            self.retry_at = None  # lifted at once, even while the agent was failing
        self.busy, self.draining = False, True

    def due(self, now: float) -> bool | None:
        """The call due now: True (protect, or renew), False (remove it), None."""
        at = self._next(now)
        if at is None or at > now:
            return None
        return self.busy and not self.draining

    def next_at(self, now: float) -> float | None:
        """When a call next falls due, if nothing changes meanwhile (None: never)."""
        return self._next(now)

    def _next(self, now: float) -> float | None:
        if self.busy and not self.draining:
            at = now if self.protected_until is None else self.protected_until - self.renew_lead
        elif not self.held(now):
            return None  # nothing to remove: never set, removed, or run out
        elif self.draining:
            at = now
        elif self.idle_since is not None:
            at = self.idle_since + self.idle_grace
        else:
            return None
        return at if self.retry_at is None else max(at, self.retry_at)

    def answered(
        self, enabled: bool, ok: bool, sent_at: float, now: float, *, unsure: bool = False
    ) -> None:
        """The call ``enabled`` sent at ``sent_at`` was answered (``ok``) at ``now``;
        ``unsure``: it failed, but may have taken effect."""
        until = now + self.minutes * 60.0  # the latest a protect sent by now could hold
        if ok:
            self.failures, self.retry_at = 0, None
            self.protected_until = sent_at + self.minutes * 60.0 if enabled else None
            if not enabled:
                self.maybe_until = None
            return
        self.failures += 1
        self.retry_at = now + backoff(self.failures)
        if enabled and unsure:
            self.maybe_until = until if self.maybe_until is None else max(self.maybe_until, until)


class ScaleInProtection(WorkerListener):
    """Protects an ECS task while its worker holds messages (see the module docstring).

    ``ScaleInProtection(agent_uri=None, *, minutes=60, idle_grace=5.0, clock=None,
    timeout=5.0)``: ``agent_uri`` None reads ``ECS_AGENT_URI`` (unset: it says so
    once and does nothing); ``minutes`` is each protection's ``ExpiresInMinutes``
    (1 to 2880); ``clock``, the worker's. A worker given ``scale_in_protection=True``
    makes one; ``worker.listeners.add(ScaleInProtection(...))`` adds your own.
    """

    def __init__(
        self,
        agent_uri: str | None = None,
        *,
        minutes: int = 60,
        idle_grace: float = 5.0,
        clock: Clock | None = None,
        timeout: float = 5.0,
    ) -> None:
        if isinstance(minutes, bool) or not isinstance(minutes, int):
            raise TypeError(f"minutes must be an integer, got {minutes!r}")
        if not MIN_MINUTES <= minutes <= MAX_MINUTES:
            raise ValueError(
                f"minutes (ECS's ExpiresInMinutes) must be {MIN_MINUTES} to {MAX_MINUTES}, "
                f"got {minutes}"
            )
        if not idle_grace >= 0:
            raise ValueError(f"idle_grace must be >= 0 seconds, got {idle_grace!r}")
        uri = os.environ.get("ECS_AGENT_URI") if agent_uri is None else agent_uri
        self.agent: EcsAgent | None = EcsAgent(uri, timeout=timeout) if uri else None
        if self.agent is None:
            log.warning(
                "scale-in protection: ECS_AGENT_URI is not set (not on ECS, or an ECS agent "
                "older than task protection): the task is not protected; the worker runs "
                "as usual"
            )
        self.plan = ProtectionPlan(minutes=minutes, idle_grace=idle_grace)
        self.clock: Clock = SYSTEM_CLOCK if clock is None else clock
        #: Calls the agent answered with success, and calls that failed.
        self.succeeded = self.failed = 0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False
        self._said_protected = False
        self._streak = False  # failures since the last success (the first one said)

    # ------------------------------------------------------------------ the worker's moments

    def started(self) -> None:
        with self._cond:
            if self.agent is None or self._thread is not None:
                return
            self._closing = False
            self.plan.draining = False  # a run after an earlier one
            self._thread = threading.Thread(
                target=self._run, name="leasekeeper-ecs-protection", daemon=True
            )
            self._thread.start()

    def busy(self) -> None:
        """Protect the task before the handlers start: wait for the agent's answer -
        unless the last call failed (then the handlers do not wait for a retry)."""
        with self._cond:
            plan = self.plan
            plan.on_busy()
            self._cond.notify_all()
            if self._thread is None or plan.failures or plan.protected(self.clock.now()):
                return
            # Bounded by the call's own timeout (real time): the agent answers or not.
            assert self.agent is not None
            self._cond.wait_for(
                lambda: (
                    self._closing
                    or self._thread is None
                    or bool(plan.failures)
                    or plan.protected(self.clock.now())
                ),
                timeout=self.agent.timeout + 1.0,
            )

    def idle(self) -> None:
        with self._cond:
            self.plan.on_idle(self.clock.now())
            self._cond.notify_all()

    def draining(self) -> None:
        with self._cond:
            self.plan.on_drain()
            self._cond.notify_all()

    def stopped(self) -> None:
        """Let a call under way (the shutdown's removal) finish, then end the thread."""
        with self._cond:
            self.plan.on_drain()
            thread = self._thread
            self._cond.notify_all()
        if thread is not None:
            wait = 0.0 if self.agent is None else self.agent.timeout + 1.0
            # The removal first, if it is due now and not out yet: then the thread ends.
            with self._cond:
                self._cond.wait_for(
                    lambda: self.plan.due(self.clock.now()) is None or self._thread is None,
                    timeout=wait,
                )
                self._closing = True
                self._cond.notify_all()
            thread.join(wait)
            with self._cond:
                if self._thread is thread:
                    self._thread = None

    # ------------------------------------------------------------------ the thread

    def _run(self) -> None:
        agent = self.agent
        assert agent is not None
        clock, plan, cond = self.clock, self.plan, self._cond
        with cond:
            while not self._closing:
                now = clock.now()
                enabled = plan.due(now)
                if enabled is None:
                    wait_until(clock, cond, plan.next_at(now))
                    continue
                cond.release()
                error: ProtectionError | None = None
                sent_at = clock.now()
                try:
                    agent.put(enabled, plan.minutes)
                except ProtectionError as exc:
                    error = exc
                finally:
                    cond.acquire()
                unsure = error is not None and error.unsure
                plan.answered(enabled, error is None, sent_at, clock.now(), unsure=unsure)
                self._report(enabled, error)
                if error is not None and error.permanent:
                    self._thread = None
                    cond.notify_all()
                    return
                cond.notify_all()
            if self._thread is threading.current_thread():
                self._thread = None
            cond.notify_all()

    def _report(self, enabled: bool, error: ProtectionError | None) -> None:
        what = "protect" if enabled else "unprotect"
        if error is None:
            recovered, self._streak = self._streak, False
            self.succeeded += 1
            if recovered:
                log.info("ECS scale-in protection works again (%s)", what)
            if enabled and not self._said_protected:
                self._said_protected = True
                log.info(
                    "ECS scale-in protection: the task is protected while the worker holds "
                    "messages (ExpiresInMinutes %d, renewed while busy)",
                    self.plan.minutes,
                )
            elif not recovered:
                log.debug("ECS scale-in protection: %s", what)
            return
        self.failed += 1
        if error.permanent:
            log.warning("ECS scale-in protection is off: %s (only a service's tasks)", error)
        elif not self._streak:
            self._streak = True
            log.warning(
                "ECS scale-in protection: %s failed: %s; the worker goes on and tries again "
                "(further failures are not logged at this level)",
                what,
                error,
            )
        else:
            log.debug("ECS scale-in protection: %s failed again: %s", what, error)

    def __repr__(self) -> str:
        where = "outside ECS" if self.agent is None else self.agent.url
        return f"<ScaleInProtection {where} minutes={self.plan.minutes}>"
