"""Handler operations on many leases at once, in batch calls.

``complete_many`` and ``release_many`` do for each lease exactly what
``complete``/``release`` do (the same checks, retries and outcomes, through
``HandlerOps``' prepare/finish steps), but send one call per ``max_batch``
leases of a backend: a stream committing a micro-batch of 1,000 SQS messages
makes 100 DeleteMessageBatch calls, not 1,000 DeleteMessage calls. Each lease's
result is its own: one entry that fails fails only its lease.

``release_all`` is close()'s: every active lease, in batches, in parallel on the
dispatch pool (a backend without batch calls would otherwise take one round trip
per lease, one after another, while a shutdown waits).

A batch takes all its leases at once (``OpGate.take_all``), so two batch callers
whose leases overlap cannot deadlock; dispatch threads only ever try, never wait.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from leasekeeper.backends.contract import Backend, Outcome
from leasekeeper.backends.shared import chunked
from leasekeeper.clock import now_function
from leasekeeper.engine._calls import Calls
from leasekeeper.engine._handler_ops import HandlerOps
from leasekeeper.engine._lapse import lapsed
from leasekeeper.engine._ledger import Ledger
from leasekeeper.errors import LeaseError, LeaseTooShort, ManagerClosed
from leasekeeper.lease import WatchLease
from leasekeeper.reasons import Ending
from leasekeeper.record import LeaseRecord, LeaseState

log = logging.getLogger("leasekeeper.manager")

_ACTIVE = LeaseState.ACTIVE

Result = BaseException | None  # per lease: None when done, else what the single form raises
#: Runs tasks in parallel until a deadline; per task, False if it never ran.
RunAll = Callable[
    [Sequence[tuple[Callable[..., object], tuple[Any, ...]]], float | None], list[bool]
]

RELEASED_BY_CLOSE = Ending(None, "released by close()")
FORGOTTEN_BY_CLOSE = Ending(None, "forgotten by close()")
CLOSE_TIMED_OUT = Ending(None, "close() timed out before releasing it: it lapses")


def overrides(obj: object, base: type, name: str) -> bool:
    """Whether ``obj``'s class (a subclass of ``base``) defines its own ``name``."""
    return getattr(type(obj), name) is not getattr(base, name)


def singles(renewer: object, base: type) -> tuple[bool, bool]:
    """Whether ``renewer`` (of a subclass of the standard renewer ``base``) takes
    ``complete_many``'s and ``release_many``'s leases one by one: so its own
    ``complete``/``release`` sees every one, unless it has its own batch form too."""
    return (
        overrides(renewer, base, "complete") and not overrides(renewer, base, "complete_many"),
        overrides(renewer, base, "release") and not overrides(renewer, base, "release_many"),
    )


def register_each(register: Callable[[Any], Any], messages: Sequence[Any]) -> list[Any]:
    """``register`` each of ``messages``: for each, its lease or the ``LeaseTooShort``
    or ``ManagerClosed`` it raised (``LeaseManager.register_many``'s, for a renewer
    without a batch form of its own, or a subclass whose ``register`` is its own)."""
    results: list[Any] = []
    for message in messages:
        try:
            results.append(register(message))
        except (LeaseTooShort, ManagerClosed) as exc:
            results.append(exc)
    return results


def one_by_one(operation: Callable[[Any], object], leases: Sequence[Any]) -> list[Result]:
    """A batch done as single operations: for a renewer subclass that overrides
    ``complete`` (or ``release``) but not its batch form, so it sees every one. Per
    lease, None or what ``operation(lease)`` raised."""
    results: list[Result] = []
    for lease in leases:
        try:
            operation(lease)
            results.append(None)
        except Exception as exc:
            results.append(exc)
    return results


R = TypeVar("R", bound=LeaseRecord)


def by_backend(records: Iterable[R]) -> list[tuple[Backend, list[R]]]:
    """``records`` grouped by their message's backend (a queue), in the order each
    backend first appears."""
    groups: dict[int, tuple[Backend, list[R]]] = {}
    for record in records:
        backend = record.message.backend
        groups.setdefault(id(backend), (backend, []))[1].append(record)
    return list(groups.values())


def delete_held(
    calls: Calls, records: Sequence[R], now: Callable[[], float]
) -> tuple[list[R], list[tuple[R, Outcome]]]:
    """Delete the messages of ``records`` (never renewed: each has the receipt it came
    with), one batch call per queue and ``max_batch``: those deleted in time ("ok"
    before their deadline), and the others with their outcome (the lease rules'
    to apply: ``BatchOps.complete_held``, or the renewer process's)."""
    deleted: list[R] = []
    answered: list[tuple[R, Outcome]] = []
    for backend, group in by_backend(records):
        for chunk in chunked(group, backend.max_batch):
            outcomes = calls.call(backend, "delete", [record.handle() for record in chunk], 0.0)
            at = now()
            for record, outcome in zip(chunk, outcomes, strict=True):
                if outcome.kind == "ok" and at < record.visible_until:
                    deleted.append(record)
                else:
                    answered.append((record, outcome))
    return deleted, answered


class BatchOps:
    """complete_many / release_many / release_all over one engine's ``HandlerOps``."""

    def __init__(
        self,
        ops: HandlerOps,
        ledger: Ledger,
        calls: Calls,
        records: Callable[[], list[LeaseRecord]],
        run_all: RunAll,
    ) -> None:
        self._ops = ops
        self._gate = ops.gate
        self._clock = ops.clock
        self._now = now_function(ops.clock)
        self._ledger = ledger
        self._calls = calls
        self._records = records  # the active leases, a snapshot
        self._run_all = run_all

    def complete_many(self, records: Sequence[LeaseRecord]) -> list[Result]:
        """Delete every lease's message; per lease, what ``complete()`` would do."""
        ops = self._ops
        return self._run(
            records,
            "delete",
            lambda record: 0.0,
            ops.prepare_delete,
            lambda record, outcome, arg: ops.finish_delete(record, outcome),
        )

    def complete_held(self, records: Sequence[LeaseRecord]) -> list[Result]:
        """``complete_many`` of leases never scheduled: held back by their owner
        (``RenewalEngine.hold``) and completed before their first extend, so
        each still has the receipt it came with, and nothing else can be using it.
        The plain case - in time, deleted - costs one batch call and one count for
        them all; any other lease is adopted (scheduled as if registered when it
        arrived) and goes the way ``complete()`` goes: retries, rule 5, lost."""
        now = self._now
        results: dict[int, Result] = {}  # the leases that did not simply complete
        start = now()
        late = [record for record in records if not start < record.visible_until]
        if late:  # rule 5 decides: the way complete() goes
            kept = [record for record in late if self._adopted(record, results)]
            results.update(zip(map(id, kept), self.complete_many(kept), strict=True))
        timely = [record for record in records if start < record.visible_until]
        # Rule 4 as for any lease: a release or forget of one of them (the worker's
        # shutdown) waits until its delete is answered.
        self._gate.take_all(timely)
        try:
            deleted, answered = delete_held(self._calls, timely, now)
            if deleted:
                self._ledger.end_held(deleted)
            for record, outcome in answered:
                results[id(record)] = self._finish_adopted(record, outcome)
        finally:
            self._give_back(timely)
        return [results.get(id(record)) for record in records]

    def _adopted(self, record: LeaseRecord, results: dict[int, Result]) -> bool:
        """Schedule a held lease (``Ledger.adopt``); False, its result the error, when
        the engine is closed."""
        try:
            self._ledger.adopt(record)
        except ManagerClosed as exc:
            results[id(record)] = exc
            return False
        return True

    def _finish_adopted(self, record: LeaseRecord, first: Outcome) -> Result:
        """A held lease (taken) whose delete was not simply done in time: scheduled,
        then the outcome applied as ``complete()`` applies it (retried while
        transient)."""
        results: dict[int, Result] = {}
        if not self._adopted(record, results):
            return results[id(record)]
        try:
            self._ops.finish_delete(record, self._ops.retry(record, "delete", 0.0, first))
        except LeaseError as exc:
            return exc
        return None

    def release_many(self, records: Sequence[LeaseRecord], delay: float | None) -> list[Result]:
        """Release every lease; per lease, what ``release(delay)`` would do."""
        ops = self._ops

        def finish(record: LeaseRecord, outcome: Outcome, arg: float) -> None:
            ops.finish_release(record, outcome, arg, stop_handler=False)

        return self._run(
            records,
            "release",
            lambda record: ops.release_delay(record, delay),
            ops.prepare_release,
            finish,
        )

    def _run(
        self,
        records: Sequence[LeaseRecord],
        operation: str,
        arg_of: Callable[[LeaseRecord], float],
        prepare: Callable[[LeaseRecord], bool],
        finish: Callable[[LeaseRecord, Outcome, float], None],
    ) -> list[Result]:
        results: dict[int, Result] = {}
        unique = list({id(record): record for record in records}.values())
        args: dict[int, float] = {}
        for record in unique:
            try:
                args[id(record)] = arg_of(record)
            except (ValueError, TypeError) as exc:
                results[id(record)] = exc
        taken = [record for record in unique if id(record) not in results]
        self._gate.take_all(taken)
        try:
            # (backend, arg) -> the leases to send in calls of max_batch
            groups: dict[tuple[int, float], tuple[Backend, list[LeaseRecord]]] = {}
            for record in taken:
                try:
                    send = prepare(record)
                except (LeaseError, ValueError) as exc:
                    results[id(record)] = exc
                    continue
                if not send:
                    results[id(record)] = None
                    continue
                backend = record.message.backend
                key = (id(backend), args[id(record)])
                groups.setdefault(key, (backend, []))[1].append(record)
            for (_, arg), (backend, group) in groups.items():
                for chunk in chunked(group, backend.max_batch):
                    outcomes = self._calls.call(
                        backend, operation, [record.handle() for record in chunk], arg
                    )
                    for record, first in zip(chunk, outcomes, strict=True):
                        try:
                            finish(record, self._ops.retry(record, operation, arg, first), arg)
                            results[id(record)] = None
                        except LeaseError as exc:
                            results[id(record)] = exc
        finally:
            self._give_back(taken)
        return [results[id(record)] for record in records]

    def _give_back(self, records: Sequence[LeaseRecord]) -> None:
        """After a batch call: the gate let go of ``records``; those still active and
        not renewed meanwhile go back on the schedule; what waited is done."""
        self._gate.give_all(records)
        for record in records:
            if record.state is _ACTIVE and record.gen == 0:
                self._ledger.reschedule(record)
        self._ledger.drain()

    # ------------------------------------------------------------------ close()

    def release_all(self, deadline: float | None) -> None:
        """Release every active lease (close()): batched, in parallel, within
        ``deadline``; each handler sees ``lease.lost`` set. Watch leases are forgotten
        instead: their owner ends their messages."""
        ledger = self._ledger
        releasing: list[LeaseRecord] = []
        for record in self._records():
            wait = None if deadline is None else max(0.0, deadline - self._clock.now())
            # A handler may be mid-delete: wait for it rather than race it.
            if not self._gate.take(record, wait):
                continue
            ending = None
            if record.state is not _ACTIVE:
                pass
            elif isinstance(record, WatchLease):
                ledger.end(record, LeaseState.FORGOTTEN, FORGOTTEN_BY_CLOSE)
            else:
                ending = lapsed(record, self._clock.now(), "release", "before sending")
                if ending is not None:  # a release would prove nothing (rule 5)
                    ledger.end(record, LeaseState.LOST, ending)
                else:
                    releasing.append(record)
                    continue
            self._gate.give(record)
        chunks: list[tuple[Backend, Sequence[LeaseRecord]]] = []
        for backend, group in by_backend(releasing):
            chunks += [(backend, chunk) for chunk in chunked(group, backend.max_batch)]
        ran = self._run_all(
            [(self._release_chunk, (backend, chunk)) for backend, chunk in chunks], deadline
        )
        for (_, chunk), done in zip(chunks, ran, strict=True):
            if done:
                continue
            for record in chunk:  # still queued at the timeout: never sent
                ledger.end(record, LeaseState.RELEASED, CLOSE_TIMED_OUT, stop_handler=True)
            self._gate.give_all(chunk)
        ledger.drain()

    def _release_chunk(self, backend: Backend, chunk: Sequence[LeaseRecord]) -> None:
        """Release one batch of leases the caller took; give them back."""
        try:
            handles = [record.handle() for record in chunk]
            outcomes = self._calls.call(backend, "release", handles, 0.0)
            for record, outcome in zip(chunk, outcomes, strict=True):
                if outcome.kind not in ("ok", "lost"):
                    log.warning(
                        "close(): release of message %r failed (%s: %s); "
                        "it reappears when its invisibility runs out",
                        record.message.id,
                        outcome.kind,
                        outcome.detail,
                    )
                self._ledger.end(record, LeaseState.RELEASED, RELEASED_BY_CLOSE, stop_handler=True)
        finally:
            self._gate.give_all(chunk)
            self._ledger.drain()  # close() may have returned already
