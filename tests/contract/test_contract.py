"""The backend contract: what every leasekeeper backend does, tested the same way on
each (the ``subject`` fixture in conftest.py: MemoryQueue plain and rotating, SQS on
moto, MNS on the local server with the real SDK, Azure Storage Queue on Azurite).

A new backend is tested by adding one entry to ``SUBJECTS`` in conftest.py, which
builds it on a fresh queue and declares where its service differs from the others.

No timing assertions: a test waits by polling with a generous deadline, and a
message meant to stay hidden is hidden for 30 s while the test looks for a few.
"""

from __future__ import annotations

import pickle
import time
import uuid
from collections.abc import Sequence

import pytest

from leasekeeper import ConfigError, LeaseManager, ReceiveError, Worker
from leasekeeper.backends.base import (
    Backend,
    CloudBackend,
    Counter,
    ForwardingBackend,
    Handle,
    Message,
    Outcome,
    QueueCounts,
    Sender,
)
from leasekeeper.backends.registry import URLSpec
from tests.azure.settings import KEY as AZURITE_KEY
from tests.contract.conftest import HIDDEN, Subject

#: The longest a test polls for something the service should do (seconds).
PATIENCE = 30.0
POLL = 0.2


def receive_n(
    subject: Subject, n: int, visibility: float = HIDDEN, backend: Backend | None = None
) -> list[Message]:
    """Receive exactly ``n`` messages (several calls if need be), from the subject's
    backend or ``backend`` (a wrapper of it)."""
    backend = subject.backend if backend is None else backend
    step: int = getattr(backend, "max_receive", n)
    got: list[Message] = []
    waited, deadline = 0.0, time.monotonic() + PATIENCE
    while len(got) < n:
        batch = backend.receive(max_messages=min(step, n - len(got)), visibility_timeout=visibility)
        got += batch
        if not batch:
            assert waited < PATIENCE and time.monotonic() < deadline, (
                f"{subject.name}: received {len(got)} of {n} messages"
            )
            subject.pause(POLL)
            waited += POLL
    return got


def receive_again(subject: Subject, message_id: str, visibility: float = HIDDEN) -> Message:
    """Poll until ``message_id`` is received again (it is the only message there)."""
    waited, deadline = 0.0, time.monotonic() + PATIENCE
    while True:
        for message in subject.backend.receive(visibility_timeout=visibility):
            assert message.id == message_id, "the test's queue holds one message"
            return message
        assert waited < PATIENCE and time.monotonic() < deadline, (
            f"{subject.name}: message {message_id} did not come back"
        )
        subject.pause(POLL)
        waited += POLL


def newest(handles: Sequence[Handle], outcomes: Sequence[Outcome]) -> list[Handle]:
    """The handles to use next: a rotated receipt replaces the one it was sent with."""
    return [
        Handle(h.message_id, o.receipt or h.receipt) for h, o in zip(handles, outcomes, strict=True)
    ]


def one(subject: Subject, visibility: float = HIDDEN) -> Message:
    subject.send("job")
    [message] = receive_n(subject, 1, visibility)
    return message


# ---------------------------------------------------------------- receive


def test_receive_gives_leasable_messages(subject: Subject) -> None:
    backend = subject.backend
    assert isinstance(backend, Backend)
    for body in ("a", "b", "c"):
        subject.send(body)
    before = subject.clock.now()
    messages = receive_n(subject, 3)
    after = subject.clock.now()
    assert sorted(m.body for m in messages) == ["a", "b", "c"]
    assert backend.max_lease_age == subject.lease_age  # type: ignore[attr-defined]
    assert len({m.id for m in messages}) == 3
    for message in messages:
        assert message.backend is backend
        assert message.receive_count == 1
        # the deadline counts from just before the request was sent: never later
        # than the service's own
        assert before <= message.received_at <= after
        assert message.visibility_timeout == HIDDEN
        assert message.visible_until <= message.received_at + HIDDEN
        assert message.receipt not in repr(message)
        assert message.attributes == {}  # sent without any
        assert message.group is None  # sent without a group (MNS, Azure, Redis have none)
        if subject.total_cap is None:
            assert message.hard_deadline is None
        else:
            assert message.hard_deadline is not None
            # the service's cap, less the backend's safety margin
            cap = message.received_at + subject.total_cap
            assert cap - 120 <= message.hard_deadline <= cap


def test_receive_from_an_empty_queue_is_an_empty_list(subject: Subject) -> None:
    assert subject.backend.receive(visibility_timeout=HIDDEN) == []
    # a fraction of a second is a valid wait (the services round it up)
    assert subject.backend.receive(wait_seconds=0.3, visibility_timeout=HIDDEN) == []


def test_receive_refuses_arguments_no_service_takes(subject: Subject) -> None:
    receive = subject.backend.receive
    with pytest.raises(ValueError):
        receive(max_messages=0)
    with pytest.raises(TypeError):
        receive(max_messages="2")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        receive(visibility_timeout=-1)
    with pytest.raises(ValueError):
        receive(visibility_timeout=subject.backend.max_visibility + 1)


def test_adopt_turns_the_native_message_back_into_a_message(subject: Subject) -> None:
    message = one(subject)
    adopted = subject.backend.adopt(message.raw, visibility_timeout=HIDDEN)
    assert (adopted.id, adopted.receipt, adopted.backend) == (
        message.id,
        message.receipt,
        subject.backend,
    )
    assert adopted.visible_until <= subject.clock.now() + HIDDEN
    [outcome] = subject.backend.extend([adopted.handle], HIDDEN)
    assert outcome.kind == "ok"


# ---------------------------------------------------------------- extend, delete, release


def test_extend_rotates_receipts_as_declared_and_refuses_stale_ones(subject: Subject) -> None:
    backend = subject.backend
    message = one(subject)
    [outcome] = backend.extend([message.handle], HIDDEN)
    assert outcome.kind == "ok"
    assert message.receipt not in repr(outcome) + outcome.detail
    if backend.rotates_receipts:
        # a new receipt each extend; the one it replaced is dead
        assert outcome.receipt is not None and outcome.receipt != message.receipt
        [stale] = backend.extend([message.handle], HIDDEN)
        assert stale.kind == "lost" and message.receipt not in stale.detail
        assert backend.delete([message.handle])[0].kind == "lost"
    else:
        assert outcome.receipt is None
        assert backend.extend([message.handle], HIDDEN)[0].kind == "ok"
    [handle] = newest([message.handle], [outcome])
    assert backend.delete([handle]) == [Outcome("ok")]
    # deleted: the receipt is worth nothing now
    assert backend.extend([handle], HIDDEN)[0].kind == "lost"
    assert backend.release([handle], 0)[0].kind == "lost"
    assert backend.delete([handle])[0].kind == subject.delete_twice


def test_an_extended_message_stays_hidden_past_its_first_timeout(subject: Subject) -> None:
    message = one(subject, visibility=2)
    [outcome] = subject.backend.extend([message.handle], HIDDEN)
    assert outcome.kind == "ok"
    subject.pause(2 + 2)  # the first timeout, with a margin
    assert subject.backend.receive(visibility_timeout=HIDDEN) == []
    [handle] = newest([message.handle], [outcome])
    assert subject.backend.delete([handle]) == [Outcome("ok")]


def test_a_message_not_extended_comes_back_with_a_new_receipt(subject: Subject) -> None:
    message = one(subject, visibility=1)
    again = receive_again(subject, message.id)  # after its timeout: failover
    assert again.receive_count == 2 and again.receipt != message.receipt
    # the earlier receive's receipt (moto still takes it; the services refuse it)
    [old] = subject.backend.extend([message.handle], HIDDEN)
    assert old.kind == ("lost" if subject.rejects_earlier_receipt else "ok")
    [outcome] = subject.backend.extend([again.handle], HIDDEN)
    assert outcome.kind == "ok"
    assert subject.backend.delete(newest([again.handle], [outcome])) == [Outcome("ok")]


def test_release_gives_the_message_back_and_each_delivery_counts(subject: Subject) -> None:
    message = one(subject)
    for count in (2, 3):
        [released] = subject.backend.release([message.handle], 0)
        assert released.kind == "ok"
        message = receive_again(subject, message.id)  # at once (MNS: after its 1 s minimum)
        assert message.receive_count == count
    assert subject.backend.delete([message.handle]) == [Outcome("ok")]


def test_a_batch_of_max_batch_works_and_a_larger_one_as_declared(subject: Subject) -> None:
    backend = subject.backend
    size = backend.max_batch
    for i in range(size + 1):
        subject.send(f"job {i}")
    handles = [m.handle for m in receive_n(subject, size + 1)]
    outcomes = backend.extend(handles[:size], HIDDEN)
    assert [o.kind for o in outcomes] == ["ok"] * size
    handles[:size] = newest(handles[:size], outcomes)
    if subject.oversize_batch == "split":
        outcomes = backend.extend(handles, HIDDEN)
        assert [o.kind for o in outcomes] == ["ok"] * (size + 1)
        handles = newest(handles, outcomes)
    else:
        with pytest.raises(ValueError, match="max_batch"):
            backend.extend(handles, HIDDEN)
    for start in range(0, len(handles), size):
        chunk = handles[start : start + size]
        assert backend.delete(chunk) == [Outcome("ok")] * len(chunk)


def test_the_visibility_caps(subject: Subject) -> None:
    backend = subject.backend
    message = one(subject)
    limit = backend.max_visibility
    # The longest one extend may ask for: fine, unless the service's total cap
    # (SQS: 12 h after the receive; Azure: the message's expiry) comes first.
    [outcome] = backend.extend([message.handle], limit)
    capped = subject.total_cap is not None and subject.total_cap <= limit
    assert outcome.kind == ("capped" if capped else "ok"), outcome
    [handle] = newest([message.handle], [outcome])
    # Longer than any one call may ask: refused, and the message is untouched.
    [too_long] = backend.extend([handle], limit + 1)
    assert too_long.kind == "fatal" and too_long.receipt is None
    assert backend.delete([handle]) == [Outcome("ok")]


def test_receipts_stay_out_of_reprs_and_details(subject: Subject) -> None:
    message = one(subject)
    outcomes = subject.backend.extend([message.handle], HIDDEN)
    shown = repr(subject.backend) + repr(message) + repr(message.handle) + repr(outcomes)
    assert message.receipt not in shown
    assert all(o.receipt is None or o.receipt not in shown for o in outcomes)


# ---------------------------------------------------------------- producing, siblings, specs


def test_send_puts_a_message_with_its_attributes(subject: Subject) -> None:
    backend = subject.backend
    assert isinstance(backend, Sender)
    attributes = {"origin": "contract", "hop": "1"}
    if not backend.carries_attributes:
        with pytest.raises(ValueError, match="attributes"):
            backend.send("refused", attributes)
        attributes = {}
    sent = backend.send("payload", attributes)
    [message] = receive_n(subject, 1)  # the refused one was not sent
    assert (message.id, message.body, message.receive_count) == (sent, "payload", 1)
    assert message.attributes == attributes
    with pytest.raises(TypeError):
        message.attributes["hop"] = "2"  # type: ignore[index]
    for bad in ({"n": 1}, {1: "x"}, ["a"]):
        with pytest.raises(TypeError):
            backend.send("x", bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="body"):
        backend.send(42)  # type: ignore[arg-type]
    assert backend.delete([message.handle]) == [Outcome("ok")]


def test_send_with_a_delay(subject: Subject) -> None:
    backend = subject.backend
    assert isinstance(backend, Sender)
    with pytest.raises(ValueError, match="delay"):
        backend.send("x", delay=-1)
    if isinstance(backend, CloudBackend) and backend.max_send_delay == 0:
        with pytest.raises(ValueError, match="delay"):  # a service without delayed delivery
            backend.send("x", delay=1)
        return
    started = subject.clock.now()
    sent = backend.send("later", delay=2)
    early = backend.receive(visibility_timeout=HIDDEN)
    if subject.clock.now() - started < 1.5:  # else the machine stalled: too late to tell
        assert early == []
    message = receive_again(subject, sent)
    assert message.body == "later"
    assert backend.delete([message.handle]) == [Outcome("ok")]


def test_queue_counts_say_what_waits_and_what_is_held(subject: Subject) -> None:
    backend = subject.backend
    assert isinstance(backend, Counter) and isinstance(backend, Sender)
    assert backend.queue_counts().backlog == 0
    for body in ("a", "b", "c"):
        backend.send(body)
    delays = not (isinstance(backend, CloudBackend) and backend.max_send_delay == 0)
    if delays:
        backend.send("later", delay=600)
    [held] = receive_n(subject, 1)
    counts = backend.queue_counts()
    assert isinstance(counts, QueueCounts)
    if counts.visible is None:  # Azure counts only the whole queue
        assert counts == QueueCounts(None, None, None, 4) and counts.backlog == 4
    else:
        assert counts[:3] == (2, 1, 1 if delays else 0) and counts.backlog == 2
    # Through a wrapper too (FaultyBackend, a spy): the inner backend's counts.
    assert ForwardingBackend(backend).queue_counts() == counts
    assert backend.delete([held.handle]) == [Outcome("ok")]


def test_a_sibling_is_another_queue_of_the_same_account(subject: Subject) -> None:
    backend = subject.backend
    other = backend.sibling(f"sib{uuid.uuid4().hex[:12]}", create=True)  # type: ignore[attr-defined]
    assert type(other) is type(backend) and other is not backend
    other.send("over there")
    [message] = receive_n(subject, 1, backend=other)
    assert message.body == "over there" and message.backend is other
    assert backend.receive(visibility_timeout=HIDDEN) == []
    assert other.delete([message.handle]) == [Outcome("ok")]


@pytest.mark.usefixtures("service_env")
def test_spec_is_the_queue_by_url_and_builds_it_again(subject: Subject) -> None:
    backend = subject.backend
    if getattr(backend, "process_local", False):
        with pytest.raises(ConfigError, match="cannot be rebuilt"):
            backend.spec()  # type: ignore[attr-defined]
        return
    spec = backend.spec()  # type: ignore[attr-defined]
    assert isinstance(spec, URLSpec)
    assert pickle.loads(pickle.dumps(spec)) == spec
    shown = repr(spec) + spec.url
    for secret in ("testing", "test-key", AZURITE_KEY):  # the services' credentials
        assert secret not in shown and secret.encode() not in pickle.dumps(spec)
    rebuilt = spec.build()
    assert type(rebuilt) is type(backend)
    subject.send("through the spec")
    [message] = receive_n(subject, 1, backend=rebuilt)
    assert message.body == "through the spec"
    [outcome] = backend.extend([message.handle], HIDDEN)  # the same queue
    assert outcome.kind == "ok"
    assert rebuilt.delete(newest([message.handle], [outcome])) == [Outcome("ok")]


# ---------------------------------------------------------------- leases and wrappers


def test_a_lease_through_a_wrapper_and_the_manager(subject: Subject) -> None:
    inner = subject.backend
    wrapper = ForwardingBackend(inner)
    for name in ("max_batch", "max_visibility", "rotates_receipts"):
        assert getattr(wrapper, name) == getattr(inner, name)
    for name in ("max_receive", "max_wait_seconds", "clock"):
        assert getattr(wrapper, name, None) == getattr(inner, name, None)
    subject.send("job")
    [message] = receive_n(subject, 1, backend=wrapper)
    assert message.backend is wrapper  # so the manager's calls go through the wrapper
    with LeaseManager(
        wrapper, clock=subject.clock, visibility_timeout=HIDDEN, minimal_life=2.0
    ) as manager:
        lease = manager.register(message)
        lease.complete()
    # deleted: its receipt no longer works
    assert inner.extend([message.handle], HIDDEN)[0].kind == "lost"


# ---------------------------------------------------------------- what the services answer


@pytest.mark.parametrize("operation", ["extend", "release", "delete"])
def test_service_errors_map_to_outcomes(fallible: Subject, operation: str) -> None:
    backend = fallible.backend
    faults = fallible.faults
    assert faults is not None
    message = one(fallible)
    handle = message.handle
    for kind in faults.kinds:
        if kind == "capped" and operation != "extend":
            continue  # only an extend can run into the total cap
        code = faults.fail_next(operation, kind)  # type: ignore[arg-type]
        if operation == "extend":
            [outcome] = backend.extend([handle], HIDDEN)
        elif operation == "release":
            [outcome] = backend.release([handle], 5)
        else:
            [outcome] = backend.delete([handle])
        assert outcome.kind == kind, (kind, outcome)
        assert code in outcome.detail
        assert outcome.receipt is None and handle.receipt not in outcome.detail
    # the failed requests changed nothing: the receipt still works
    [outcome] = backend.extend([handle], HIDDEN)
    assert outcome.kind == "ok"
    assert backend.delete(newest([handle], [outcome])) == [Outcome("ok")]


def test_receive_errors_say_whether_retrying_can_help(fallible: Subject) -> None:
    backend = fallible.backend
    faults = fallible.faults
    assert faults is not None and fallible.drop_queue is not None
    for kind in ("retry", "fatal"):
        code = faults.fail_next("receive", kind)
        with pytest.raises(ReceiveError) as raised:
            backend.receive(visibility_timeout=HIDDEN)
        assert raised.value.kind == kind and raised.value.retryable is (kind == "retry")
        assert code in raised.value.detail
    assert backend.receive(visibility_timeout=HIDDEN) == []  # the service is fine again
    fallible.drop_queue()  # for real: the queue is gone
    with pytest.raises(ReceiveError) as raised:
        backend.receive(visibility_timeout=HIDDEN)
    assert raised.value.kind == "fatal" and not raised.value.retryable
    if fallible.name != "redis":  # XLEN of a stream that is gone is 0, not an error
        assert isinstance(backend, Counter)
        with pytest.raises(ReceiveError) as raised:
            backend.queue_counts()
        assert raised.value.kind == "fatal" and raised.value.operation == "counts"


def test_a_worker_stops_on_a_deleted_queue(fallible: Subject) -> None:
    assert fallible.drop_queue is not None
    fallible.drop_queue()
    worker = Worker(
        fallible.backend,
        lambda message: None,
        wait_seconds=0.5,
        shutdown_timeout=5,
        visibility_timeout=HIDDEN,
        # A renewer process would build the backend again, and Redis Streams' build
        # creates the stream this test dropped.
        renewer="thread",
    )
    with pytest.raises(ReceiveError) as raised:
        worker.run()
    assert not raised.value.retryable and worker.error is raised.value
    assert worker.manager.closed
