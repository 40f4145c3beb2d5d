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

Op locks are taken in one fixed order (by ``id``), so two batch callers whose
leases overlap cannot deadlock; dispatch threads only ever try op locks without
blocking.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from leasekeeper._handler_ops import LAPSED, HandlerOps
from leasekeeper._record import LeaseRecord, LeaseState
from leasekeeper.backends.base import Backend, Outcome, chunked
from leasekeeper.errors import LeaseError
from leasekeeper.lease import WatchLease

log = logging.getLogger("leasekeeper.manager")

_ACTIVE = LeaseState.ACTIVE

Result = BaseException | None  # per lease: None when done, else what the single form raises


class BatchOps:
    """complete_many / release_many / release_all over one engine's ``HandlerOps``."""

    def __init__(self, ops: HandlerOps) -> None:
        self._ops = ops
        self._engine = ops.engine
        self._clock = ops.clock

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
        unique.sort(key=id)
        args: dict[int, float] = {}
        for record in unique:
            try:
                args[id(record)] = arg_of(record)
            except (ValueError, TypeError) as exc:
                results[id(record)] = exc
        locked = [record for record in unique if id(record) not in results]
        for record in locked:
            record.op_lock.acquire()
        try:
            # (backend, arg) -> the leases to send in calls of max_batch
            groups: dict[tuple[int, float], tuple[Backend, list[LeaseRecord]]] = {}
            for record in locked:
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
                    outcomes = self._engine.calls.call(
                        backend, operation, [record.handle() for record in chunk], arg
                    )
                    for record, first in zip(chunk, outcomes, strict=True):
                        try:
                            finish(record, self._ops.retry(record, operation, arg, first), arg)
                            results[id(record)] = None
                        except LeaseError as exc:
                            results[id(record)] = exc
        finally:
            for record in locked:
                record.op_lock.release()
            self._engine.drain()
        return [results[id(record)] for record in records]

    # ------------------------------------------------------------------ close()

    def release_all(self, deadline: float | None) -> None:
        """Release every active lease (close()): batched, in parallel, within
        ``deadline``; each handler sees ``lease.lost`` set."""
        engine = self._engine
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
            if isinstance(record, WatchLease):
                # Its owner (a framework) ends the message; leasekeeper only stops.
                engine.end(record, LeaseState.FORGOTTEN, "forgotten by close()")
                record.op_lock.release()
                continue
            backend = record.message.backend
            if self._clock.now() >= record.visible_until and not backend.rotates_receipts:
                engine.end(record, LeaseState.LOST, LAPSED)  # a release would prove nothing
                record.op_lock.release()
                continue
            by_backend.setdefault(id(backend), (backend, []))[1].append(record)
        for backend, group in by_backend.values():
            chunks += [(backend, chunk) for chunk in chunked(group, backend.max_batch)]
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
            outcomes = self._engine.calls.call(backend, "release", handles, 0.0)
            for record, outcome in zip(chunk, outcomes, strict=True):
                if outcome.kind not in ("ok", "lost"):
                    log.warning(
                        "close(): release of message %r failed (%s: %s); "
                        "it reappears when its invisibility runs out",
                        record.message.id,
                        outcome.kind,
                        outcome.detail,
                    )
                self._engine.end(
                    record, LeaseState.RELEASED, "released by close()", stop_handler=True
                )
        finally:
            for record in chunk:
                record.op_lock.release()
            self._engine.drain()  # close() may have returned already
