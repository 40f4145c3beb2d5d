"""Redis Streams with two consumers of one group, on a real Redis server (>= 6.2).

What a consumer group must do for leases: an entry whose lease is renewed is never
claimed by the other consumer; a killed consumer's entry is reclaimed once the
group's timeout has passed; an entry the other consumer reclaimed is reported lost
to the first and is never taken back by its late renewals or delete. And Redis
6.2's quirk: a pending entry deleted out of band is "gone", not an error.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import leasekeeper
import redis
from leasekeeper import Lease, LeaseManager, LeaseState
from leasekeeper.backends.redis import RedisStreamsBackend

pytestmark = [pytest.mark.realtime]

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 2  # the group's visibility timeout, seconds


@pytest.fixture
def stream(redis_url: str) -> Iterator[str]:
    name = f"streams-{uuid.uuid4().hex[:12]}"
    yield f"{redis_url}?stream={name}&group=g"
    admin = redis.Redis.from_url(redis_url)
    admin.delete(name)
    admin.close()


def consumer(url: str, name: str, timeout: int = TIMEOUT) -> RedisStreamsBackend:
    backend = leasekeeper.connect(url, consumer=name, visibility_timeout=timeout)
    assert isinstance(backend, RedisStreamsBackend)
    return backend


def pending(backend: RedisStreamsBackend) -> list[tuple[str, str, int]]:
    """(id, consumer, delivery count) of every pending entry of the group."""
    rows = backend.client.xpending_range(backend.stream, backend.group, "-", "+", 100)
    return [(r["message_id"].decode(), r["consumer"].decode(), r["times_delivered"]) for r in rows]


@pytest.mark.parametrize("renewer", ["thread", "process"])
def test_a_renewed_entry_is_never_claimed_by_the_other(stream: str, renewer: str) -> None:
    a, b = consumer(stream, "a"), consumer(stream, "b")
    sent = a.send("long job")
    with LeaseManager(
        a, renewer=renewer, visibility_timeout=TIMEOUT, timer_interval=0.25, minimal_life=0.5
    ) as manager:
        manager.stats()  # the renewer runs (a process one, started, renews as "a")
        [message] = a.receive()
        lease = manager.register(message)
        # B keeps asking for 2.5 timeouts: the group would hand it over after one.
        deadline = time.monotonic() + 2.5 * TIMEOUT
        while time.monotonic() < deadline:
            assert b.receive(wait_seconds=0.5) == []
        assert lease.state is LeaseState.ACTIVE and lease.extensions >= 2
        # renewals reset the idle time without counting a delivery (XCLAIM ... JUSTID)
        assert pending(a) == [(sent, "a", 1)]
        lease.complete()
    assert pending(a) == [] and a.client.xlen(a.stream) == 0


def test_a_killed_consumers_entry_is_reclaimed_after_the_timeout(stream: str) -> None:
    holder_timeout = 4  # tests/redis/holder.py's
    b = consumer(stream, "b", holder_timeout)
    sent = b.send("job")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.redis.holder", stream],
        stdout=subprocess.PIPE,
        env=env,
        cwd=REPO,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["held", sent]
        assert pending(b) == [(sent, "doomed", 1)]
        proc.kill()
        proc.wait(10)
        killed = time.monotonic()
        early = b.receive()
        if time.monotonic() - killed < 1:  # renewed at most 2 s before: not idle enough
            assert early == []
        got: list[leasekeeper.Message] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = b.receive(wait_seconds=1)
        [message] = got
        assert (message.id, message.receive_count) == (sent, 2)
        assert pending(b) == [(sent, "b", 2)]
        assert b.delete([message.handle])[0].kind == "ok"
    finally:
        proc.kill()
        proc.wait(10)


def test_an_entry_reclaimed_by_the_other_is_lost_not_stolen_back(stream: str) -> None:
    a, b = consumer(stream, "a"), consumer(stream, "b")
    sent = a.send("job")
    [message] = a.receive()
    lost: list[tuple[Lease, str]] = []
    with LeaseManager(
        a,
        visibility_timeout=TIMEOUT,
        timer_interval=0.25,
        minimal_life=0.5,
        on_lost=lambda lease, reason: lost.append((lease, reason)),
    ) as manager:
        lease = manager.register(message)
        # A stalls (its renewals are late): the entry sits idle past the timeout...
        a.client.xclaim(a.stream, a.group, "a", 0, [sent], idle=TIMEOUT * 1000 + 1, justid=True)
        [taken] = b.receive()  # ...and B reclaims it, a second delivery
        assert (taken.id, taken.receive_count) == (sent, 2)
        # A's next renewal finds it delivered again: lost, and B keeps it.
        deadline = time.monotonic() + 10 * TIMEOUT
        while lease.state is LeaseState.ACTIVE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lease.state is LeaseState.LOST
        assert [reported for reported, _ in lost] == [lease]
    [late] = a.extend([message.handle], TIMEOUT)
    assert late.kind == "lost" and "delivered again" in late.detail
    assert a.delete([message.handle])[0].kind == "lost"
    assert pending(b) == [(sent, "b", 2)]  # not stolen back
    assert b.delete([taken.handle])[0].kind == "ok"


def test_a_pending_entry_deleted_out_of_band_is_gone(stream: str) -> None:
    a, b = consumer(stream, "a"), consumer(stream, "b")
    first, second = a.send("one"), a.send("two")
    held = a.receive(max_messages=2)
    a.client.xdel(a.stream, first, second)  # out of band, while pending
    [gone] = a.extend([held[0].handle], TIMEOUT)  # 6.2: XCLAIM alone would succeed
    assert gone.kind == "lost" and "deleted" in gone.detail
    # the other, still pending, idles past the timeout; Redis 6.2's XAUTOCLAIM then
    # answers a bare nil for it: no message, and it is acknowledged so it stops coming
    a.client.xclaim(a.stream, a.group, "a", 0, [second], idle=TIMEOUT * 1000 + 1, justid=True)
    assert b.receive() == []
    assert pending(b) == []
