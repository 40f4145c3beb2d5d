"""Receipts are secrets (rule 7): no log line, repr or exception text may contain one.

Each scenario runs with DEBUG logging captured for the root logger, collects every
receipt the queue ever issued (``QueueSpy.receipts``) and then searches all log
records (messages and formatted tracebacks), the reprs of everything a user can
hold, and the text, repr and traceback of every exception raised. The service
backends (SQS, MNS, Azure) get the same treatment in their own test suites.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Iterable, Iterator, Sequence

import pytest

from leasekeeper import (
    Handle,
    LeaseError,
    LeaseManager,
    LeaseTooShort,
    Message,
    Outcome,
    Worker,
)
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import Faults, FaultyBackend, ManualClock
from tests.reliability.invariants import QueueSpy


@pytest.fixture
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    caplog.set_level(logging.DEBUG)  # the root logger: leasekeeper's and everyone's
    yield caplog


def log_texts(caplog: pytest.LogCaptureFixture) -> list[str]:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    texts = [caplog.text]
    for record in caplog.records:
        texts.append(formatter.format(record))
        if record.exc_info:
            texts.append(formatter.formatException(record.exc_info))
    return texts


def exception_texts(errors: Iterable[BaseException]) -> list[str]:
    texts: list[str] = []
    for error in errors:
        texts += [str(error), repr(error), "".join(traceback.format_exception(error))]
    return texts


def assert_no_receipt(receipts: set[str], texts: Sequence[str]) -> None:
    assert receipts, "the scenario issued no receipts"
    blob = "\n".join(texts)
    leaked = sum(1 for receipt in receipts if receipt in blob)
    assert leaked == 0, f"{leaked} receipt(s) leaked"  # never print them


def test_no_receipt_in_logs_reprs_or_errors_under_every_fault(
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    queue = MemoryQueue(30, clock=clock, rotate_receipts=True, max_batch=3)
    spy = QueueSpy(queue)
    faulty = FaultyBackend(
        spy,
        seed=7,
        clock=clock,
        extend=Faults(retry=0.1, lost=0.03, stale=0.03, capped=0.02, throttle=0.05, malformed=0.05),
        delete=Faults(retry=0.2, exception=0.05),
        release=Faults(retry=0.2, malformed=0.1),
        malformed_forms=("short", "none", "strings", "bad_kind", "bad_receipt"),
    )
    errors: list[BaseException] = []
    reports: list[str] = []
    manager = LeaseManager(
        faulty, clock=clock, on_lost=lambda lease, reason: reports.append(reason)
    )
    for i in range(24):
        queue.send(f"job {i}")
    messages = faulty.receive(max_messages=12) + faulty.receive(max_messages=12)
    leases = [manager.register(m) for m in messages[:20]]
    faulty.script("extend", "fatal", "exception")
    for step in range(60):
        clock.advance(20)
        if step % 10 == 9:
            for lease in leases[step // 10 :: 6]:
                try:
                    lease.complete() if step % 20 else lease.release(5)
                except LeaseError as exc:
                    errors.append(exc)
    clock.advance(35)
    for late in messages[20:]:  # received long ago: too little life left
        with pytest.raises(LeaseTooShort) as raised:
            manager.register(late)
        errors.append(raised.value)
    for lease in leases:
        try:
            lease.complete()
        except LeaseError as exc:
            errors.append(exc)
    manager.close()
    assert reports and errors  # the scenario did produce losses and errors
    texts = log_texts(debug_logs) + exception_texts(errors)
    texts += [repr(manager), repr(manager.stats()), repr(faulty), repr(spy), repr(queue)]
    texts += [repr(list(faulty.events)), repr(faulty.counts), repr(faulty.faults("extend"))]
    for lease, message in zip(leases, messages, strict=False):
        texts += [repr(lease), str(lease.reason), repr(message), repr(message.raw)]
        texts += [repr(message.handle), repr(lease.handle())]
    texts.append(repr(queue.extend([messages[0].handle], 5)))
    texts.append(repr(Outcome("ok", receipt="rcpt-visible-in-tests-only")))
    assert_no_receipt(spy.receipts, texts)


def test_no_receipt_leaks_from_a_worker_with_real_threads(
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    queue = MemoryQueue(2.0, rotate_receipts=True)
    spy = QueueSpy(queue)
    faulty = FaultyBackend(
        spy,
        seed=3,
        receive=Faults(exception=0.2),
        extend=Faults(retry=0.2, stale=0.05, exception=0.05),
        delete=Faults(retry=0.1),
    )
    manager = LeaseManager(
        faulty, visibility_timeout=2.0, timer_interval=0.2, minimal_life=0.5, extend_threshold=1
    )
    for i in range(8):
        queue.send(f"job {i}")

    def handler(message: Message) -> None:
        time.sleep(1.2)
        if message.receive_count == 1 and message.id.endswith("3"):
            raise ValueError(f"handler failed on {message.id}")

    Worker(manager, handler, concurrency=8, wait_seconds=0.05).run(until_idle=3.0)
    manager.close(timeout=5)
    assert manager.stats().extended > 0
    texts = log_texts(debug_logs)
    texts += [repr(manager), repr(faulty), repr(list(faulty.events))]
    assert_no_receipt(spy.receipts, texts)


def _quoting_error(operation: str, handles: Sequence[Handle]) -> BaseException:
    # What botocore raises for an invalid handle: the message quotes the handle.
    quoted = handles[0].receipt if handles else "?"
    return RuntimeError(
        f"An error occurred (ReceiptHandleIsInvalid) when calling the "
        f'ChangeMessageVisibility operation: The input receipt handle "{quoted}" '
        "is not a valid receipt handle."
    )


def test_regression_a_backend_exception_that_quotes_the_receipt_reaches_the_logs(
    debug_logs: pytest.LogCaptureFixture,
) -> None:
    """LeaseManager._call logs an unexpected backend exception with
    exc_info=log.isEnabledFor(DEBUG): the traceback carries the exception's text,
    and SDK errors quote the receipt (botocore's ReceiptHandleIsInvalid does). A
    backend adapter should map such errors, but the manager is the last line: it
    knows the handles it passed and can redact them (or log type and code only)."""
    clock = ManualClock()
    queue = MemoryQueue(30, clock=clock)
    spy = QueueSpy(queue)
    faulty = FaultyBackend(spy, seed=1, clock=clock, exceptions=[_quoting_error])
    manager = LeaseManager(faulty, clock=clock)
    queue.send("job")
    lease = manager.register(faulty.receive()[0])
    faulty.script("extend", "exception")
    clock.advance(25)
    assert lease.extensions == 1  # retried and renewed: the error itself was handled
    manager.close()
    assert_no_receipt(spy.receipts, log_texts(debug_logs))


def test_the_leak_checker_finds_a_leak(debug_logs: pytest.LogCaptureFixture) -> None:
    # The control: a receipt logged on purpose is found.
    queue = MemoryQueue(30)
    spy = QueueSpy(queue)
    queue.send("job")
    message = spy.receive()[0]
    logging.getLogger("someone.else").debug("oops: %s", message.receipt)
    with pytest.raises(AssertionError, match="leaked"):
        assert_no_receipt(spy.receipts, log_texts(debug_logs))
