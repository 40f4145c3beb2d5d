"""The renewer's replies and notices in the worker: who reads them, and that none waits.

A lone request's reply is read by the thread that asked; while several are out the
reader thread reads them; notices are applied whether or not a thread waits; and a
renewer that dies answers every waiting request at once. (``Replies`` over a socket
pair, the test playing the renewer; then a real renewer process.)
"""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import pytest

from leasekeeper import LeaseManager, LeaseState
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.renewers._frames import Done, FrameReader, recv_frame, send_frame
from leasekeeper.renewers._replies import Replies
from tests.services import CHILD_ENV, make_client

DEAD = "the renewer is gone"


class Ask(NamedTuple):
    request: int


class Notice(NamedTuple):
    text: str


class Link:
    """``Replies`` as ``RenewerLink`` wires it, with the reader thread running; the
    test holds the renewer's end of the socket."""

    def __init__(self) -> None:
        ours, theirs = socket.socketpair()
        self.conn = Connection(ours.detach())
        self.renewer = Connection(theirs.detach())
        self.notices: list[tuple[str, str]] = []  # (text, the thread that applied it)
        self.noticed = threading.Condition()
        self.replies = Replies(self.conn.fileno(), FrameReader(self.conn), self._apply, DEAD)
        self.reader = threading.Thread(target=self.replies.serve, name="reader", daemon=True)
        self.reader.start()

    def _apply(self, frames: list[Any]) -> None:
        for frame in frames:
            if isinstance(frame, Done):
                self.replies.answer(frame.request, frame.payload)
            else:
                with self.noticed:
                    self.notices.append((frame.text, threading.current_thread().name))
                    self.noticed.notify_all()

    def ask(self) -> Any:
        opened = self.replies.open()
        if opened is None:
            return DEAD
        request, waiter = opened
        send_frame(self.conn, Ask(request))
        return self.replies.wait(waiter)

    def wait_notices(self, count: int) -> list[tuple[str, str]]:
        with self.noticed:
            assert self.noticed.wait_for(lambda: len(self.notices) >= count, 10)
            return list(self.notices)

    def close(self) -> None:
        self.renewer.close()
        self.reader.join(10)
        self.conn.close()
        self.replies.close()


@pytest.fixture
def link() -> Iterator[Link]:
    made = Link()
    yield made
    made.close()


def test_a_lone_request_s_reply_and_what_came_before_it_are_read_by_the_asking_thread(
    link: Link,
) -> None:
    def renewer() -> None:
        ask = recv_frame(link.renewer)
        send_frame(link.renewer, Notice("before the reply"))
        send_frame(link.renewer, Done(ask.request, "answer"))

    answering = threading.Thread(target=renewer)
    answering.start()
    answers: list[Any] = []

    def asker() -> None:
        answers.append(link.ask())
        answers.append(list(link.notices))  # what was applied by the time ask returned

    asking = threading.Thread(target=asker, name="asker")
    asking.start()
    asking.join(10)
    answering.join(10)
    assert answers == ["answer", [("before the reply", "asker")]]


def test_a_notice_that_comes_while_no_thread_waits_is_applied_at_once(link: Link) -> None:
    send_frame(link.renewer, Notice("lost"))
    assert link.wait_notices(1) == [("lost", "reader")]
    # ... and after a request came and went, too: the reader thread reads again.
    answering = threading.Thread(
        target=lambda: send_frame(link.renewer, Done(recv_frame(link.renewer).request, 1))
    )
    answering.start()
    assert link.ask() == 1
    answering.join(10)
    send_frame(link.renewer, Notice("new receipt"))
    assert link.wait_notices(2)[1] == ("new receipt", "reader")


def test_eight_threads_asking_at_once_each_get_their_own_reply(link: Link) -> None:
    per_thread = 200
    answers: dict[int, list[Any]] = {t: [] for t in range(8)}

    def renewer() -> None:
        reader = FrameReader(link.renewer)
        answered = 0
        while answered < 8 * per_thread:
            frames = reader.read()  # the requests that came together, answered together
            for _ask in frames:
                if answered % 7 == 0:
                    send_frame(link.renewer, Notice(f"notice {answered}"))
                answered += 1
            for ask in frames:
                send_frame(link.renewer, Done(ask.request, ask.request))

    def asker(thread: int) -> None:
        for _ in range(per_thread):
            answers[thread].append(link.ask())

    answering = threading.Thread(target=renewer)
    answering.start()
    askers = [threading.Thread(target=asker, args=(t,)) for t in range(8)]
    for thread in askers:
        thread.start()
    for thread in askers:
        thread.join(60)
    answering.join(10)
    replies = [reply for thread in answers.values() for reply in thread]
    assert len(replies) == 8 * per_thread
    assert len(set(replies)) == len(replies)  # each request its own reply
    assert len(link.notices) == len(range(0, 8 * per_thread, 7))


def test_every_waiting_request_is_answered_at_once_when_the_renewer_dies(link: Link) -> None:
    results: list[Any] = []
    asked = threading.Barrier(9)

    def asker() -> None:
        asked.wait()
        results.append(link.ask())

    askers = [threading.Thread(target=asker) for _ in range(8)]
    for thread in askers:
        thread.start()
    asked.wait()
    for _ in range(8):
        recv_frame(link.renewer)  # every request was sent: the renewer had them all
    link.renewer.close()  # ... and died without a reply
    for thread in askers:
        thread.join(10)
    assert results == [DEAD] * 8
    link.reader.join(10)
    assert not link.reader.is_alive()  # the reader thread saw the end too
    assert link.ask() == DEAD  # and later requests are answered at once


# ---------------------------------------------------------------------- a real renewer


@pytest.fixture
def queue_url(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    for name, value in CHILD_ENV.items():
        monkeypatch.setenv(name, value)
    admin = make_client(moto_endpoint)
    url: str = admin.create_queue(QueueName=f"replies-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    admin.send_message_batch(
        QueueUrl=url, Entries=[{"Id": str(i), "MessageBody": f"job {i}"} for i in range(8)]
    )
    yield url
    admin.delete_queue(QueueUrl=url)


@pytest.mark.realtime
@pytest.mark.slow
def test_a_renewer_killed_while_eight_threads_wait_on_completes_has_its_successor_do_them(
    moto_endpoint: str, queue_url: str
) -> None:
    """Eight completes wait on a renewer that answers nothing (stopped), and it is
    killed: each is asked again of the renewer started in its place, which took the
    leases over, and done there - none lost, none left waiting for a timeout."""
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    lost: list[str] = []
    manager = LeaseManager(
        backend,
        renewer="process",
        visibility_timeout=30,
        # (With max_lease_duration the renewer holds no lease back, so the worker
        # cannot delete them itself: each complete is a request to the renewer.)
        max_lease_duration=600,
        on_lost=lambda lease, reason: lost.append(threading.current_thread().name),
    )
    try:
        messages: list[Any] = []
        while len(messages) < 8:
            messages += backend.receive(max_messages=8 - len(messages), wait_seconds=1)
        leases = [manager.register(m) for m in messages]
        pid = manager.renewer_pid
        os.kill(pid, signal.SIGSTOP)  # it answers nothing: the completes wait
        errors: list[BaseException | None] = [None] * 8
        started = threading.Barrier(9)

        def complete(i: int) -> None:
            started.wait()
            try:
                leases[i].complete()
            except BaseException as exc:
                errors[i] = exc

        threads = [threading.Thread(target=complete, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        started.wait()
        time.sleep(0.3)  # (a complete not yet sent when it dies goes the same way)
        os.kill(pid, signal.SIGKILL)
        for thread in threads:
            thread.join(60)
        assert errors == [None] * 8
        assert all(lease.state is LeaseState.COMPLETED for lease in leases)
        assert manager.renewer_pid not in (0, pid)
        stats = manager.stats()
        assert (stats.lost, lost) == (0, [])
    finally:
        manager.close()
