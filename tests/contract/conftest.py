"""The backends under the contract suite: one ``subject`` fixture, parametrised over
every backend leasekeeper ships, each with the local service it runs against.

**Testing a new backend = adding one entry to ``SUBJECTS``**: a function that
builds a ``Subject`` (the backend on a fresh queue, how to put a message on that
queue, how to let time pass) and declares what the service really does where
services differ (see docs/backend-semantics.md): whether an earlier receive's
receipt is refused after a re-receive, what a second delete answers, how a batch
larger than ``max_batch`` is handled, the total visibility cap, and - where the
backend can fail - its fault hooks and how to delete its queue. The tests in
test_contract.py read these declarations; they never skip a backend.

The local services are the session's own (tests/services.py: moto's server,
leasekeeper's MNS server with the real aliyun-mns-sdk, Azurite), shared with the
per-service tests. A service that cannot start fails these tests loudly.

Where a local stand-in deviates from the real service (moto accepts any receipt a
message ever had), the subject declares what the stand-in does, and the real
service's answer is covered by its recorded answers (``faults``): botocore's
before-call hook answering with SQS's recorded error responses, the MNS server's
fault injection, canned Azure error responses through the real azure-core pipeline.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from leasekeeper.backends.base import Backend, OutcomeKind
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.clock import SYSTEM_CLOCK, Clock
from leasekeeper.testing import ManualClock

FaultKind = Literal["lost", "retry", "fatal", "capped"]
Operation = Literal["receive", "extend", "delete", "release"]

#: The visibility timeout most tests receive with: long enough that nothing
#: reappears while a test runs, even on a loaded machine.
HIDDEN = 30.0
#: Azure messages are sent with this time-to-live, so its total cap (the
#: message's expiry) is testable.
AZURE_TTL = 3600


class FaultHooks:
    """Make the next call of an operation fail the way the real service fails.

    ``fail_next(operation, kind)`` arranges for the next ``operation`` request
    to be answered with a service error that means ``kind``, and returns that
    error's code. ``kinds`` are the kinds the service has an error for.
    """

    kinds: tuple[FaultKind, ...] = ("lost", "retry", "fatal")

    def fail_next(self, operation: Operation, kind: FaultKind) -> str:
        raise NotImplementedError


@dataclass
class Subject:
    """One backend under the contract: how to drive it and what its service does."""

    name: str
    backend: Backend
    clock: Clock
    send: Callable[[str], object]  # put a message with this body on the queue
    pause: Callable[[float], None]  # let time pass (a sleep, or a ManualClock advance)
    # after a re-receive, is the earlier receive's receipt refused? (moto: no)
    rejects_earlier_receipt: bool = True
    # a delete with the receipt of a message already deleted (SQS: 200, so "ok")
    delete_twice: OutcomeKind = "lost"
    # a batch of more than max_batch entries: split into calls, or refused (ValueError)
    oversize_batch: Literal["split", "reject"] = "split"
    # seconds after a receive past which the service will not hide the message
    total_cap: float | None = None
    # the backend's max_lease_age (the service's cap, as it states it)
    lease_age: float = math.inf
    faults: FaultHooks | None = None
    drop_queue: Callable[[], None] | None = None  # delete the queue (receive then fails)
    cleanup: list[Callable[[], None]] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"Subject({self.name})"


# ---------------------------------------------------------------- MemoryQueue


def _memory(request: pytest.FixtureRequest, *, rotate: bool) -> Subject:
    clock = ManualClock()
    queue = MemoryQueue(HIDDEN, clock=clock, rotate_receipts=rotate)
    return Subject(
        name="memory-rotating" if rotate else "memory",
        backend=queue,
        clock=clock,
        send=queue.send,
        pause=clock.advance,
        oversize_batch="reject",  # a whole-call ValueError, as SQS's TooManyEntries
    )


# ---------------------------------------------------------------- SQS on moto


# Recorded SQS error answers (Code, QueryErrorCode, Message, HTTP status): the JSON
# protocol in query-compatible mode, as the real service sends them (tests/sqs).
_SQS_ANSWERS: dict[FaultKind, tuple[str, str | None, str, int]] = {
    "lost": (
        "ReceiptHandleIsInvalid",
        "ReceiptHandleIsInvalid",
        'The input receipt handle "{receipt}" is not a valid receipt handle.',
        404,
    ),
    "retry": (
        "ServiceUnavailable",
        "ServiceUnavailable",
        "Service is unable to handle request.",
        503,
    ),
    "fatal": (
        "AWS.SimpleQueueService.NonExistentQueue",
        "QueueDoesNotExist",
        "The specified queue does not exist.",
        400,
    ),
    # moto counts the 12 hours from SentTimestamp; SQS from the receive. Recorded:
    "capped": (
        "InvalidParameterValue",
        None,
        "Value 43200 for parameter VisibilityTimeout is invalid. Reason: Total "
        "VisibilityTimeout for the message is beyond the limit [43200 seconds]",
        400,
    ),
}
_SQS_OPERATIONS = {
    "receive": "ReceiveMessage",
    "extend": "ChangeMessageVisibilityBatch",
    "release": "ChangeMessageVisibilityBatch",
    "delete": "DeleteMessageBatch",
}


class SQSFaults(FaultHooks):
    """Answers the next call with a recorded SQS error, through botocore's
    ``before-call`` event (the hook botocore's Stubber uses): no request is sent.
    The hook is registered at the first fault asked for: a client with a hook in
    code renews in a thread (the renewer process's client would not have it), so
    the tests that ask for none keep the renewer process they name."""

    kinds = ("lost", "retry", "fatal", "capped")

    def __init__(self, client: Any) -> None:
        self._client = client
        self._lock = threading.Lock()  # guards _pending and _hooked
        self._pending: dict[str, deque[FaultKind]] = defaultdict(deque)
        self._hooked = False

    def fail_next(self, operation: Operation, kind: FaultKind) -> str:
        with self._lock:
            if not self._hooked:
                self._client.meta.events.register_first(
                    "before-call.sqs", self._answer, unique_id=f"contract-faults-{id(self)}"
                )
                self._hooked = True
            self._pending[_SQS_OPERATIONS[operation]].append(kind)
        return _SQS_ANSWERS[kind][0]

    def _answer(self, model: Any, params: dict[str, Any], **_: Any) -> Any:
        from botocore.awsrequest import AWSResponse

        with self._lock:
            queued = self._pending.get(model.name)
            if not queued:
                return None
            kind = queued.popleft()
        code, query_code, message, status = _SQS_ANSWERS[kind]
        entries = params.get("Entries") or [{}]
        error = {"Code": code, "Message": message.format(receipt=entries[0].get("ReceiptHandle"))}
        if query_code:
            error["QueryErrorCode"] = query_code
        parsed = {"Error": error, "ResponseMetadata": {"HTTPStatusCode": status}}
        return AWSResponse("http://recorded", status, {}, None), parsed


class ScriptedFaults(FaultHooks):
    """The same recorded answers for the lean call path, which botocore's hooks never
    see: sent by a loopback server between the client and moto
    (tests/sqs/scripted.py) as SQS's JSON protocol carries them. A receive that
    fails "retry" fails every attempt the client's retry policy makes."""

    kinds = SQSFaults.kinds

    def __init__(self, script: Any, attempts: int) -> None:
        self._script = script
        self._attempts = attempts

    def fail_next(self, operation: Operation, kind: FaultKind) -> str:
        code, query_code, message, status = _SQS_ANSWERS[kind]
        repeat = self._attempts if operation == "receive" and kind == "retry" else 1
        for _ in range(repeat):
            self._script.error(
                _SQS_OPERATIONS[operation],
                code=code,
                query_code=query_code,
                message=message.format(receipt="AQEB" + "x" * 200),
                status=status,
            )
        return code


def _sqs(request: pytest.FixtureRequest, *, lean: bool = False) -> Subject:
    from leasekeeper.backends.sqs import SQSBackend
    from tests.services import make_client
    from tests.sqs.scripted import ScriptedSQS

    endpoint: str = request.getfixturevalue("moto_endpoint")
    admin = make_client(endpoint)
    url: str = admin.create_queue(
        QueueName=f"contract-{uuid.uuid4().hex[:12]}",
        Attributes={"VisibilityTimeout": str(int(HIDDEN))},
    )["QueueUrl"]
    script = ScriptedSQS(upstream=endpoint) if lean else None
    client = make_client(script.url if script is not None else endpoint)
    # the queue by the host the client calls (moto finds it by its path)
    backend = SQSBackend(client, url.replace(endpoint, client.meta.endpoint_url), fast_path=lean)
    faults: FaultHooks
    if script is None:
        faults = SQSFaults(client)
    else:
        lean_path = backend.lean
        assert lean_path is not None and lean_path.usable(), "the lean path is not in use"
        faults = ScriptedFaults(script, lean_path.max_attempts)
    subject = Subject(
        name="sqs-moto-lean" if lean else "sqs-moto",
        backend=backend,
        clock=SYSTEM_CLOCK,
        send=lambda body: admin.send_message(QueueUrl=url, MessageBody=body),
        pause=time.sleep,
        # moto accepts any receipt a message ever had (real SQS refuses one from an
        # earlier receive with InvalidParameterValue: a recorded answer, "lost").
        rejects_earlier_receipt=False,
        delete_twice="ok",  # a standard queue answers 200 (SQS and moto alike)
        total_cap=43200.0,
        lease_age=43200.0,
        faults=faults,
        drop_queue=lambda: admin.delete_queue(QueueUrl=url),
    )
    subject.cleanup.append(lambda: admin.delete_queue(QueueUrl=url))
    if script is not None:
        subject.cleanup.append(script.close)
    return subject


# ---------------------------------------------------------------- MNS on the local server

_MNS_ANSWERS: dict[FaultKind, tuple[str, int]] = {
    "lost": ("ReceiptHandleError", 400),
    "retry": ("InternalError", 500),
    "fatal": ("QueueNotExist", 404),
}
_MNS_OPERATIONS = {
    "receive": "receive",
    "extend": "change_visibility",
    "release": "change_visibility",
    "delete": "delete",  # one handle: DeleteMessage
}


class MNSFaults(FaultHooks):
    """The local MNS server's own fault injection (``MNSServer.fail_next``)."""

    def __init__(self, server: Any) -> None:
        self.server = server

    def fail_next(self, operation: Operation, kind: FaultKind) -> str:
        code, status = _MNS_ANSWERS[kind]
        self.server.fail_next(_MNS_OPERATIONS[operation], code, status)
        return code


def _mns(request: pytest.FixtureRequest) -> Subject:
    from leasekeeper.backends.mns import MNSBackend
    from tests.services import sdk_queue

    server = request.getfixturevalue("mns_server")
    name = f"contract-{uuid.uuid4().hex[:12]}"
    server.create_queue(name, visibility_timeout=int(HIDDEN))
    producer = sdk_queue(server, name)
    backend = MNSBackend(sdk_queue(server, name), queue_visibility_timeout=HIDDEN)

    def send(body: str) -> object:
        from mns.queue import Message as MNSMessage

        return producer.send_message(MNSMessage(body))

    subject = Subject(
        name="mns-local",
        backend=backend,
        clock=SYSTEM_CLOCK,
        send=send,
        pause=time.sleep,
        faults=MNSFaults(server),
        drop_queue=lambda: sdk_queue(server, name).delete(),
    )
    subject.cleanup.append(backend.close)
    return subject


# ---------------------------------------------------------------- Azure on Azurite

_AZURE_ANSWERS: dict[FaultKind, tuple[int, str]] = {
    "lost": (404, "MessageNotFound"),
    "retry": (503, "ServerBusy"),
    "fatal": (404, "QueueNotFound"),
}
_AZURE_METHODS = {"receive": "GET", "extend": "PUT", "release": "PUT", "delete": "DELETE"}


class AzureFaults(FaultHooks):
    """Canned Azure error responses (tests/azure/fakes.py), run through the real
    azure-core pipeline by a transport that otherwise talks to Azurite."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, deque[FaultKind]] = defaultdict(deque)

    def fail_next(self, operation: Operation, kind: FaultKind) -> str:
        with self._lock:
            self._pending[_AZURE_METHODS[operation]].append(kind)
        return _AZURE_ANSWERS[kind][1]

    def take(self, method: str) -> FaultKind | None:
        with self._lock:
            queued = self._pending.get(method)
            return queued.popleft() if queued else None

    def transport(self) -> Any:
        from azure.core.pipeline.transport import RequestsTransport, RequestsTransportResponse

        from tests.azure.fakes import error_response

        faults = self

        class InjectingTransport(RequestsTransport):
            def send(self, request: Any, **kwargs: Any) -> Any:  # type: ignore[override]
                kind = faults.take(request.method)
                if kind is None:
                    return super().send(request, **kwargs)
                status, code = _AZURE_ANSWERS[kind]
                return RequestsTransportResponse(request, error_response(status, code))

        return InjectingTransport()


def _azure(request: pytest.FixtureRequest) -> Subject:
    from azure.storage.queue import QueueClient

    from leasekeeper.backends.azure import AzureQueueBackend

    conn: str = request.getfixturevalue("azurite")
    name = f"contract-{uuid.uuid4().hex[:20]}"
    admin = QueueClient.from_connection_string(conn, name)
    admin.create_queue()
    faults = AzureFaults()

    def client() -> QueueClient:
        # A transport per client: azure-core's RequestsTransport is not thread-safe.
        return QueueClient.from_connection_string(
            conn, name, transport=faults.transport(), retry_total=0
        )

    receiving = client()
    backend = AzureQueueBackend(receiving, client_factory=client)
    subject = Subject(
        name="azure-azurite",
        backend=backend,
        clock=SYSTEM_CLOCK,
        send=lambda body: admin.send_message(body, time_to_live=AZURE_TTL),
        pause=time.sleep,
        total_cap=float(AZURE_TTL),  # a message cannot outlive its expiry
        lease_age=7 * 24 * 3600.0,  # the default time-to-live
        faults=faults,
        drop_queue=admin.delete_queue,
    )
    subject.cleanup += [backend.close, receiving.close, admin.delete_queue, admin.close]
    return subject


# ---------------------------------------------------------------- Redis Streams

_REDIS_ANSWERS: dict[FaultKind, str] = {
    "retry": "BUSY Redis is busy running a script. You can only call SCRIPT KILL.",
    "fatal": "NOGROUP No such key 'jobs' or consumer group 'g' in XPENDING",
}


class RedisFaults(FaultHooks):
    """Answers the backend's next script call of an operation with an error reply as
    Redis sends it, through a client whose ``execute_command`` consults this first.
    (A lost lease is no error in Redis: the scripts say so, tested for real.)"""

    kinds = ("retry", "fatal")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, deque[FaultKind]] = defaultdict(deque)

    def fail_next(self, operation: Operation, kind: FaultKind) -> str:
        mode = {"receive": "receive", "delete": "delete"}.get(operation, "idle")
        with self._lock:
            self._pending[mode].append(kind)
        return _REDIS_ANSWERS[kind].split()[0]

    def client(self, url: str) -> Any:
        import redis

        faults = self

        class FaultyRedis(redis.Redis):
            def execute_command(self, *args: Any, **options: Any) -> Any:
                if args and args[0] == "EVALSHA" and len(args) > 5:
                    # receive's ARGV[2] is the consumer, the change script's its mode
                    mode = args[5] if args[5] in ("idle", "delete") else "receive"
                    with faults._lock:
                        queued = faults._pending.get(mode)
                        kind = queued.popleft() if queued else None
                    if kind is not None:
                        raise redis.exceptions.ResponseError(_REDIS_ANSWERS[kind])
                return super().execute_command(*args, **options)

        return FaultyRedis.from_url(url, socket_timeout=10)


def _redis(request: pytest.FixtureRequest) -> Subject:
    import redis
    from leasekeeper.backends.redis import RedisStreamsBackend

    url: str = request.getfixturevalue("redis_url")
    stream = f"contract-{uuid.uuid4().hex[:12]}"
    admin = redis.Redis.from_url(url)
    faults = RedisFaults()
    backend = RedisStreamsBackend(
        faults.client(url), stream, "g", visibility_timeout=HIDDEN, consumer="contract"
    )
    subject = Subject(
        name="redis",
        backend=backend,
        clock=SYSTEM_CLOCK,
        send=lambda body: admin.xadd(stream, {"body": body}),
        pause=time.sleep,
        faults=faults,
        drop_queue=lambda: admin.delete(stream),
    )
    subject.cleanup += [lambda: admin.delete(stream), admin.close]
    return subject


#: Every backend under the contract. A new backend: one more entry.
SUBJECTS: dict[str, Callable[[pytest.FixtureRequest], Subject]] = {
    "memory": lambda request: _memory(request, rotate=False),
    "memory-rotating": lambda request: _memory(request, rotate=True),
    "sqs-moto": _sqs,
    # the same, through the lean call path (backends/sqs/lean.py)
    "sqs-moto-lean": lambda request: _sqs(request, lean=True),
    "mns-local": _mns,
    "azure-azurite": _azure,
    "redis": _redis,
}
#: Those whose service can fail (they declare fault hooks and a queue to delete).
FALLIBLE = ("sqs-moto", "sqs-moto-lean", "mns-local", "azure-azurite", "redis")


@contextlib.contextmanager
def made_subject(name: str, request: pytest.FixtureRequest) -> Iterator[Subject]:
    """Subject ``name`` on a fresh queue, cleaned up afterwards."""
    subject = SUBJECTS[name](request)
    try:
        yield subject
    finally:
        for step in reversed(subject.cleanup):
            with contextlib.suppress(Exception):  # the queue may be gone already
                step()


@pytest.fixture(params=list(SUBJECTS))
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    """Each backend in turn, on a fresh queue."""
    with made_subject(request.param, request) as made:
        yield made


@pytest.fixture(params=list(FALLIBLE))
def fallible(request: pytest.FixtureRequest) -> Iterator[Subject]:
    """Each backend whose service can fail, on a fresh queue, with its fault hooks."""
    with made_subject(request.param, request) as made:
        assert made.faults is not None and made.drop_queue is not None, made
        yield made
