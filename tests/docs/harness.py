"""What the documentation's code blocks run against (docs/contributing.md, "Code blocks").

Every page of README.md and docs/ gets one ``DocsHarness``, as ``harness`` in the
page's namespace (the ``harness`` fixture is module-scoped, and a page is a module).
Its hidden blocks (``<!-- invisible-code-block: python ... -->``) ask it for what the
visible blocks use: a ``MemoryQueue`` with messages in it, an SQS queue on the
session's moto server (the environment set so that ``boto3.client("sqs")`` reaches
it), a queue on a local MNS server or on Azurite. It also stands in for the reader's
own code: ``process(body)``, ``handle(message)``, ``alert(lease, reason)``.

It checks what a reader would check, so that an example which would lose a message
fails:

- after every block: no lease was lost (``stats().lost`` of every ``LeaseManager``
  made on the page, and ``alert``), and no message was processed twice;
- after the page, once every manager is closed: no message of the harness's queues
  is still invisible. A message received and never leased (or released) stays
  hidden until its visibility timeout runs out: that is a message lost for that
  long, and a second consumer gets it while the first may still work on it.

A block that runs until stopped (a ``Worker``, a ``while True`` loop) is preceded by
``harness.interrupt_when_drained()``: once the queues are empty the harness presses
Ctrl-C (SIGINT to the main thread), as the reader would; a worker shuts down
gracefully, a plain loop ends with ``KeyboardInterrupt``, which the harness expects.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import signal
import sys
import threading
import time
import types
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import pytest

import leasekeeper
from leasekeeper import LeaseManager
from leasekeeper.backends.memory import MemoryQueue

# How long a block that runs until interrupted may take to drain its queues.
DRAIN_DEADLINE = 30.0
# Between two Ctrl-Cs, when the first did not stop the block (it arrived before a
# worker had set up its signal handler, say).
SIGNAL_AGAIN_AFTER = 3.0


def services() -> Any:
    """tests.services, imported when first needed: conftest.py imports this module
    before pytest registers tests.services as a plugin (which must import it first)."""
    from tests import services as module

    return module


def sqs_client(endpoint: str, region: str) -> Any:
    """A boto3 SQS client of the harness's own, on moto, in ``region``."""
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _origin(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


class Tracked:
    """One queue the harness made: how many of its messages are left, and how many
    of those are invisible (received, not deleted, not visible again)."""

    label = "queue"

    def left(self) -> int:
        raise NotImplementedError

    def in_flight(self) -> int:
        raise NotImplementedError

    def send(self, bodies: list[str]) -> None:
        raise NotImplementedError

    def close(self) -> None:
        """Remove what the harness made on a service."""


class TrackedMemory(Tracked):
    def __init__(self, queue: MemoryQueue) -> None:
        self.queue = queue
        self.label = repr(queue)

    def left(self) -> int:
        return len(self.queue)

    def in_flight(self) -> int:
        return self.queue.in_flight_count()

    def send(self, bodies: list[str]) -> None:
        self.queue.send_many(bodies)


class TrackedSQS(Tracked):
    def __init__(self, endpoint: str, region: str, url: str) -> None:
        self.client = sqs_client(endpoint, region)
        self.url = url
        self.label = f"SQS queue {url}"
        self._lock = threading.Lock()  # the operator's thread asks too

    def _counts(self) -> tuple[int, int]:
        with self._lock:
            attributes = self.client.get_queue_attributes(
                QueueUrl=self.url,
                AttributeNames=[
                    "ApproximateNumberOfMessages",
                    "ApproximateNumberOfMessagesNotVisible",
                    "ApproximateNumberOfMessagesDelayed",
                ],
            )["Attributes"]
        visible = int(attributes["ApproximateNumberOfMessages"])
        hidden = int(attributes["ApproximateNumberOfMessagesNotVisible"])
        delayed = int(attributes["ApproximateNumberOfMessagesDelayed"])
        return visible + hidden + delayed, hidden

    def left(self) -> int:
        return self._counts()[0]

    def in_flight(self) -> int:
        return self._counts()[1]

    def send(self, bodies: list[str]) -> None:
        with self._lock:
            for body in bodies:
                self.client.send_message(QueueUrl=self.url, MessageBody=body)

    def close(self) -> None:
        with self._lock:
            self.client.delete_queue(QueueUrl=self.url)


class TrackedMNS(Tracked):
    def __init__(self, server: Any, name: str, queue: Any) -> None:
        self.server = server
        self.name = name
        self.queue = queue
        self.label = f"MNS queue {name!r}"

    def left(self) -> int:
        stats = self.server.queue_stats(self.name)
        return int(stats.visible + stats.in_flight + stats.delayed)

    def in_flight(self) -> int:
        return int(self.server.queue_stats(self.name).in_flight)

    def send(self, bodies: list[str]) -> None:
        from mns.queue import Message as SDKMessage

        for body in bodies:
            self.queue.send_message(SDKMessage(body))


class TrackedAzure(Tracked):
    def __init__(self, client: Any) -> None:
        self.client = client
        self.label = f"Azure queue {client.queue_name!r}"
        self._lock = threading.Lock()

    def left(self) -> int:
        with self._lock:
            return int(self.client.get_queue_properties().approximate_message_count)

    def in_flight(self) -> int:
        with self._lock:
            total = int(self.client.get_queue_properties().approximate_message_count)
            visible = len(list(self.client.peek_messages(max_messages=32)))
        return total - visible

    def send(self, bodies: list[str]) -> None:
        with self._lock:
            for body in bodies:
                self.client.send_message(body)

    def close(self) -> None:
        with self._lock:
            self.client.delete_queue()
            self.client.close()


class TrackedRedis(Tracked):
    """A Redis stream and its consumer group: an entry is left until deleted
    (XACK + XDEL), in flight while it is pending in the group."""

    def __init__(self, client: Any, stream: str, group: str) -> None:
        self.client = client
        self.stream = stream
        self.group = group
        self.label = f"Redis stream {stream!r}"

    def left(self) -> int:
        return int(self.client.xlen(self.stream))

    def in_flight(self) -> int:
        if not self.client.exists(self.stream):
            return 0
        groups = self.client.xinfo_groups(self.stream)
        return sum(
            int(g["pending"]) for g in groups if g["name"] in (self.group, self.group.encode())
        )

    def send(self, bodies: list[str]) -> None:
        for body in bodies:
            self.client.xadd(self.stream, {"body": body})

    def close(self) -> None:
        self.client.delete(self.stream)
        self.client.close()


class Operator:
    """The reader at the terminal: presses Ctrl-C once the queues are drained.

    While armed it owns SIGINT (a worker puts its own handler in place while it
    runs, and puts this one back); this handler raises ``KeyboardInterrupt`` in the
    block, as Python's own does. ``__exit__`` swallows that interrupt when the
    operator sent it, and fails the block when the queues were not drained in time.
    """

    def __init__(self, drained: Callable[[], bool], within: float, page: str) -> None:
        self.drained = drained
        self.within = within
        self.page = page  # the file the block's code comes from
        self.sent = 0
        self.timed_out = False
        self._done = threading.Event()
        self._main = threading.main_thread().ident
        self._thread = threading.Thread(target=self._watch, name="docs-operator", daemon=True)
        self._previous: Any = None

    def _on_sigint(self, signum: int, frame: FrameType | None) -> None:
        # Only into the block's own code: a Ctrl-C that lands as the block ends (in
        # __exit__, say) must not interrupt pytest itself.
        while frame is not None:
            if frame.f_code.co_filename == self.page and not self._done.is_set():
                raise KeyboardInterrupt
            frame = frame.f_back

    def _press(self) -> None:
        assert self._main is not None
        self.sent += 1
        signal.pthread_kill(self._main, signal.SIGINT)

    def _watch(self) -> None:
        deadline = time.monotonic() + self.within
        last = 0.0
        while not self._done.wait(0.05):
            now = time.monotonic()
            if now > deadline:
                self.timed_out = True
            elif not (self.drained() and now - last > SIGNAL_AGAIN_AFTER):
                continue
            if not self._done.is_set():
                self._press()
                last = now
            if self.timed_out:
                return

    def __enter__(self) -> Operator:
        self._previous = signal.signal(signal.SIGINT, self._on_sigint)
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: object, tb: object) -> bool:
        self._done.set()
        self._thread.join()
        signal.signal(signal.SIGINT, self._previous)
        if self.timed_out:
            raise AssertionError(
                f"the block ran for {self.within:g} s without draining its queues; "
                "the harness pressed Ctrl-C"
            )
        # Our own Ctrl-C ending a plain loop is how such a block ends.
        return kind is KeyboardInterrupt and self.sent > 0


class DocsHarness:
    """One page's queues, stand-ins and checks (see the module docstring)."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request
        self.tracked: list[Tracked] = []
        self.managers: list[LeaseManager] = []
        self.processed: collections.Counter[str] = collections.Counter()
        self.handled: list[Any] = []
        self.lost_reports: list[str] = []
        self.lost_allowed = False
        self._interrupt_within: float | None = None
        self._slow_first: tuple[float, Any] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._patch = pytest.MonkeyPatch()
        self._cleanups: list[Callable[[], None]] = []
        self._mns_server: Any = None
        self._shell: Any = None
        self._sent = 0
        self._endpoints: dict[str, str] = {}  # a page's local endpoint -> the session's moto
        self._local_queues: dict[str, str] = {}  # local_sqs's queues: name -> moto's URL
        # Every LeaseManager made on this page (a Worker's, a default manager, the
        # page's own): its lost leases fail the block that lost them.
        original_init = LeaseManager.__init__
        managers = self.managers

        # functools.wraps: code that reads LeaseManager's signature (the framework
        # integrations check their options against it) sees the real one.
        @functools.wraps(original_init)
        def tracking_init(manager: LeaseManager, *args: Any, **kwargs: Any) -> None:
            original_init(manager, *args, **kwargs)
            managers.append(manager)

        self._patch.setattr(LeaseManager, "__init__", tracking_init)

    # ------------------------------------------------------------------ queues

    def memory_queue(
        self, messages: int = 3, *, visibility_timeout: float = 30.0, **kwargs: Any
    ) -> MemoryQueue:
        """A MemoryQueue on the system clock holding ``messages`` messages
        (``job-1``...); the operator stops a worker on it once it is empty. A
        driven clock (``clock=ManualClock()``) works too."""
        queue = MemoryQueue(visibility_timeout, **kwargs)
        # A receive's long poll would hold a worker's shutdown up for up to a second.
        queue.max_wait_seconds = 0.1  # type: ignore[attr-defined]
        self._track(TrackedMemory(queue), messages)
        return queue

    def sqs_queue(
        self,
        messages: int = 3,
        *,
        name: str | None = None,
        region: str = "us-east-1",
        visibility_timeout: int = 30,
    ) -> str:
        """An SQS queue on the session's moto server, holding ``messages`` messages;
        returns its URL. The environment is set for the rest of the page as a
        reader's would be: ``boto3.client("sqs")`` reaches moto, in ``region``, with
        dummy credentials. ``name`` for a page that spells out a queue URL
        (``https://sqs.REGION.amazonaws.com/123456789012/NAME``: moto's account)."""
        endpoint = self.sqs_queue_environment(region)
        client = sqs_client(endpoint, region)

        def create() -> str:
            url: str = client.create_queue(
                QueueName=name or f"docs-{uuid.uuid4().hex[:12]}",
                Attributes={"VisibilityTimeout": str(visibility_timeout)},
            )["QueueUrl"]
            return url

        url = create()
        try:
            client.purge_queue(QueueUrl=url)
        except client.exceptions.PurgeQueueInProgress:
            # Another page purged a queue of this name within the minute: start afresh.
            client.delete_queue(QueueUrl=url)
            url = create()
        self._track(TrackedSQS(endpoint, region, url), messages)
        return url

    def sqs_queue_environment(self, region: str = "us-east-1") -> str:
        """The environment ``sqs_queue`` sets (``boto3.client("sqs")`` reaches moto);
        returns moto's endpoint."""
        endpoint: str = self.request.getfixturevalue("moto_endpoint")
        for variable, value in {
            **services().CHILD_ENV,
            "AWS_REGION": region,
            "AWS_DEFAULT_REGION": region,
            "AWS_ENDPOINT_URL": endpoint,
        }.items():
            self._patch.setenv(variable, value)
        return endpoint

    def mns_queue(
        self, messages: int = 3, *, name: str = "jobs", visibility_timeout: int = 30
    ) -> Any:
        """A queue on a local MNS server of the page's own; MNS_ENDPOINT,
        MNS_ACCESS_KEY_ID and MNS_ACCESS_KEY_SECRET point at it. Returns the
        ``mns.queue.Queue``."""
        from mns.account import Account

        from leasekeeper.testing.mns_server import MNSServer

        if self._mns_server is None:
            self._mns_server = MNSServer(
                access_id=services().MNS_ACCESS_ID, access_key=services().MNS_ACCESS_KEY
            )
            self._mns_server.start()
            self._cleanups.append(self._mns_server.stop)
            self._patch.setenv("MNS_ENDPOINT", self._mns_server.endpoint)
            self._patch.setenv("MNS_ACCESS_KEY_ID", services().MNS_ACCESS_ID)
            self._patch.setenv("MNS_ACCESS_KEY_SECRET", services().MNS_ACCESS_KEY)
        self._mns_server.create_queue(name, visibility_timeout=visibility_timeout)
        queue = Account(
            self._mns_server.endpoint, services().MNS_ACCESS_ID, services().MNS_ACCESS_KEY
        ).get_queue(name)
        self._track(TrackedMNS(self._mns_server, name, queue), messages)
        return queue

    def azure_queue(self, messages: int = 3, *, name: str = "jobs") -> str:
        """A queue on the session's Azurite holding ``messages`` messages; returns
        the connection string."""
        from azure.storage.queue import QueueClient

        conn: str = self.request.getfixturevalue("azurite")
        client = QueueClient.from_connection_string(conn, name)
        with contextlib.suppress(Exception):  # left over by an interrupted run
            client.delete_queue()
        client.create_queue()
        self._track(TrackedAzure(client), messages)
        return conn

    def redis_queue(
        self, messages: int = 0, *, stream: str = "jobs", group: str = "workers"
    ) -> str:
        """A stream on the session's Redis server (empty: a page sends its own
        entries); returns the server's URL. The page spells a reader's Redis,
        ``redis://localhost:6379/...``: for the rest of the page
        ``leasekeeper.connect`` takes that host and port to be the session's server."""
        import redis

        served: str = self.request.getfixturevalue("redis_url")
        client = redis.Redis.from_url(served)
        client.delete(stream)  # left over by an interrupted run
        server = urllib.parse.urlsplit(served)
        connect = leasekeeper.connect

        def connect_to_session_server(url: str, *args: Any, **kwargs: Any) -> Any:
            parts = urllib.parse.urlsplit(url)
            if parts.scheme == "redis" and parts.netloc.endswith("localhost:6379"):
                url = urllib.parse.urlunsplit(parts._replace(netloc=server.netloc))
            return connect(url, *args, **kwargs)

        self._patch.setattr(leasekeeper, "connect", connect_to_session_server)
        self._track(TrackedRedis(client, stream, group), messages)
        return served

    def local_sqs(
        self, endpoint: str, messages: int = 0, *, name: str = "jobs", environment: bool = True
    ) -> str:
        """A page that runs SQS on a local stand-in the suite does not have
        (LocalStack, ElasticMQ, a moto server on a port of its own) at ``endpoint``,
        e.g. ``http://localhost:4566``: a queue ``name`` on the session's moto, and
        every SDK client of this process made for ``endpoint`` talks to moto instead
        (the queue URLs the page spells are left as they are: moto finds a queue by
        its name). With ``environment``, ``AWS_ENDPOINT_URL`` and the rest are set as
        ``sqs_queue`` sets them (the reader's ``export AWS_ENDPOINT_URL=...``);
        without, no endpoint is configured anywhere. Returns moto's URL of the queue."""
        url = self._local_queues.get(name)
        if url is None:  # made once a page: moto purges a queue once a minute at most
            url = self._local_queues[name] = self.sqs_queue(messages, name=name)
        else:
            self.sqs_queue_environment()
            self.refill(messages)
        if not environment:
            self._patch.delenv("AWS_ENDPOINT_URL", raising=False)
            self._patch.delenv("AWS_ENDPOINT_URL_SQS", raising=False)
        moto = self.request.getfixturevalue("moto_endpoint")
        if not self._endpoints:
            self._redirect_clients()
        self._endpoints[_origin(endpoint)] = moto
        return url

    def _redirect_clients(self) -> None:
        import botocore.session

        create_client = botocore.session.Session.create_client
        endpoints = self._endpoints

        @functools.wraps(create_client)
        def redirected(session: Any, *args: Any, **kwargs: Any) -> Any:
            spelled = kwargs.get("endpoint_url")
            if isinstance(spelled, str) and _origin(spelled) in endpoints:
                kwargs["endpoint_url"] = endpoints[_origin(spelled)]
            return create_client(session, *args, **kwargs)

        self._patch.setattr(botocore.session.Session, "create_client", redirected)

    def stand_in_for_testcontainers(self) -> None:
        """``testcontainers.localstack.LocalStackContainer`` for a page that starts
        LocalStack in Docker (no Docker here): the session's moto, on its own random
        port as a container's would be."""
        moto = self.request.getfixturevalue("moto_endpoint")
        self.local_sqs(moto)  # the queue "jobs" on moto, as the page creates it

        class LocalStackContainer:
            def __init__(self, image: str = "localstack/localstack", **kwargs: Any) -> None:
                self.image = image

            def with_services(self, *services: str) -> LocalStackContainer:
                return self

            def get_url(self) -> str:
                return str(moto)

            def __enter__(self) -> LocalStackContainer:
                return self

            def __exit__(self, *exc: object) -> None:
                return None

        package = types.ModuleType("testcontainers")
        module = types.ModuleType("testcontainers.localstack")
        module.LocalStackContainer = LocalStackContainer  # type: ignore[attr-defined]
        package.localstack = module  # type: ignore[attr-defined]
        self._patch.setitem(sys.modules, "testcontainers", package)
        self._patch.setitem(sys.modules, "testcontainers.localstack", module)

    def track_sqs(self, endpoint: str, url: str, region: str = "us-east-1") -> None:
        """Check, after the page, the queue at ``url`` a page made on a server of its
        own (its shell block started it at ``endpoint``)."""
        self.tracked.append(TrackedSQS(endpoint, region, url))

    def track_azure(self, connection_string: str, name: str) -> None:
        """Check, after the page, the Azure queue ``name`` a page made itself."""
        from azure.storage.queue import QueueClient

        client = QueueClient.from_connection_string(connection_string, name)
        self.tracked.append(TrackedAzure(client))

    def setenv(self, name: str, value: str) -> None:
        """Set an environment variable for the rest of the page (the reader's
        ``export``)."""
        self._patch.setenv(name, value)

    def _track(self, queue: Tracked, messages: int) -> None:
        self.tracked.append(queue)
        self.refill(messages)

    def refill(self, messages: int = 3) -> None:
        """Send ``messages`` more messages (``job-N``, numbered on from the last) to
        the queue made last."""
        bodies = [f"job-{self._sent + i}" for i in range(1, messages + 1)]
        self._sent += messages
        self.tracked[-1].send(bodies)

    @staticmethod
    def rounds(count: int) -> Any:
        """A ``running`` flag of a ``while running:`` loop: true ``count`` times."""

        class Rounds:
            left = count

            def __bool__(self) -> bool:
                self.left -= 1
                return self.left >= 0

        return Rounds()

    @staticmethod
    def receive(backend: Any, count: int) -> list[Any]:
        """Exactly ``count`` messages from ``backend`` (a receive may return fewer)."""
        got: list[Any] = []
        deadline = time.monotonic() + 30
        while len(got) < count and time.monotonic() < deadline:
            got += backend.receive(max_messages=count - len(got), wait_seconds=1)
        assert len(got) == count, f"received {len(got)} of {count} messages"
        return got

    # ------------------------------------------------------------------ the reader's code

    def process(self, body: object, *context: object) -> None:
        """Stands in for the reader's work on a message body (and whatever else the
        page hands it, such as an attribute): records the body."""
        self.processed[str(body)] += 1
        if self._slow_first is not None and sum(self.processed.values()) == 1:
            seconds, clock = self._slow_first
            if clock is None:
                time.sleep(seconds)
            else:
                clock.advance(seconds)

    def handle(self, message: Any) -> None:
        """Stands in for a handler: processes ``message.body``."""
        self.handled.append(message)
        self.process(message.body)

    def alert(self, lease: Any, reason: str) -> None:
        """Stands in for an ``on_lost`` callback: a lost lease fails the block."""
        self.lost_reports.append(f"{lease!r}: {reason}")

    def slow_first_job(self, seconds: float, *, clock: Any = None) -> None:
        """Make the first ``process()`` call of the page take ``seconds`` (of
        ``clock``, a ``ManualClock``, when given): a batch received at once and
        leased one message at a time then lets the rest of the batch run out of
        invisibility, and fails."""
        self._slow_first = (seconds, clock)

    # ------------------------------------------------------------------ control

    def interrupt_when_drained(self, within: float = DRAIN_DEADLINE) -> None:
        """The next block runs until stopped: press Ctrl-C once the queues are
        empty (and fail it if they are not within ``within`` seconds)."""
        self._interrupt_within = within

    def allow_lost_leases(self) -> None:
        """This page loses leases on purpose (fault injection): do not fail it."""
        self.lost_allowed = True

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The page's event loop: blocks with a top-level ``await``/``async with``
        run on it, so they share what they set up."""
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def drained(self) -> bool:
        return all(queue.left() == 0 for queue in self.tracked)

    @contextlib.contextmanager
    def running_block(self, page: str) -> Iterator[None]:
        """Around one block of ``page``: the operator if asked for, then the checks."""
        within, self._interrupt_within = self._interrupt_within, None
        if within is None:
            yield
        else:
            with Operator(self.drained, within, page):
                yield
        self.check_block()

    def check_block(self) -> None:
        problems = []
        if not self.lost_allowed:
            lost = {m: m.stats().lost for m in self.managers}
            problems += [f"{m!r} lost {n} lease(s)" for m, n in lost.items() if n]
            problems += [f"on_lost was called: {report}" for report in self.lost_reports]
        twice = sorted(body for body, n in self.processed.items() if n > 1)
        if twice:
            problems.append(f"processed more than once: {', '.join(twice)}")
        assert not problems, "; ".join(problems)

    @property
    def shell(self) -> Any:
        """The page's shell session (tests/docs/shell.py), made when first needed."""
        if self._shell is None:
            from tests.docs.shell import ShellSession

            self._shell = ShellSession(self.setenv)
            self._cleanups.append(self._shell.close)
        return self._shell

    def finish(self) -> None:
        """After the page: close every manager, then no message may be left invisible."""
        problems: list[str] = []
        try:
            for manager in self.managers:
                if not manager.closed:
                    manager.close()
            leasekeeper.shutdown()
            leasekeeper.configure()  # the defaults, for the next page
            for queue in self.tracked:
                stranded = queue.in_flight()
                if stranded:
                    problems.append(
                        f"{stranded} message(s) of {queue.label} still invisible after every "
                        "manager closed: received and never leased, completed or released"
                    )
        finally:
            for queue in self.tracked:
                with contextlib.suppress(Exception):
                    queue.close()
            for cleanup in reversed(self._cleanups):
                cleanup()
            if self._loop is not None:
                self._loop.close()
            self._patch.undo()
        assert not problems, "; ".join(problems)

    def bind(self, namespace: dict[str, Any]) -> None:
        """The names every page has (a page's own definitions take precedence)."""
        namespace.setdefault("process", self.process)
        namespace.setdefault("handle", self.handle)
        namespace.setdefault("alert", self.alert)


@pytest.fixture(scope="module")
def harness(request: pytest.FixtureRequest) -> Iterator[DocsHarness]:
    """The page's harness (Sybil treats a page as a module)."""
    page = DocsHarness(request)
    yield page
    page.finish()


__all__ = ["DocsHarness", "Operator", "harness"]
