"""The lease API, the same in both renewer modes, on each cloud backend's local service.

Every test runs with ``renewer="thread"`` and ``renewer="process"`` (see conftest):
what a handler sees - renewals, completes, releases, losses, ``on_lost``, ``close``,
stats - must not depend on where the renewals happen.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from leasekeeper import Handle, LeaseError, LeaseLost, LeaseState, LeaseTooShort, Message
from tests.renewer.conftest import Leasing

pytestmark = [pytest.mark.realtime, pytest.mark.slow]


def wait_for(condition: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def test_a_lease_is_renewed_past_its_timeout_then_completed(leasing: Leasing) -> None:
    leasing.subject.send("job")
    (message,) = leasing.receive()
    lease = leasing.manager.register(message)
    wait_for(lambda: lease.extensions >= 2)  # 4 s timeout, renewed every ~2 s
    assert leasing.subject.backend.receive(max_messages=1) == []  # still ours
    assert lease.state is LeaseState.ACTIVE and lease.visible_for() > 0
    lease.complete()
    assert lease.state is LeaseState.COMPLETED
    lease.complete()  # a second time does nothing
    stats = leasing.manager.stats()
    assert (stats.registered, stats.completed, stats.lost) == (1, 1, 0)
    assert stats.extended >= 2
    assert leasing.manager.leases() == []


def test_the_lease_scope_deletes_on_success_and_releases_on_error(leasing: Leasing) -> None:
    leasing.subject.send("good")
    leasing.subject.send("bad")
    bad, good = sorted(leasing.receive(2), key=lambda m: str(m.body))
    with leasing.manager.lease(good):
        pass
    with pytest.raises(RuntimeError), leasing.manager.lease(bad) as lease:
        raise RuntimeError("handler failed")
    assert lease.state is LeaseState.RELEASED and not lease.is_lost
    (again,) = leasing.receive()  # released: back at once, the good one is gone
    assert str(again.body) == "bad"


def test_the_decorator(leasing: Leasing) -> None:
    seen: list[str] = []

    @leasing.manager.leased
    def handle(message: Any) -> str:
        seen.append(str(message.body))
        return "done"

    leasing.subject.send("job")
    (message,) = leasing.receive()
    assert handle(message) == "done"
    assert seen == ["job"]
    assert leasing.manager.get(message) is None  # ended: completed
    assert leasing.manager.stats().completed == 1


def test_a_lost_lease_is_told_and_deletes_nothing(leasing: Leasing) -> None:
    leasing.subject.send("job")
    (message,) = leasing.receive()
    lease = leasing.manager.register(message)
    # Someone else deletes it with the receipt of our receive: the next extend is
    # refused, and the handler hears of it.
    assert leasing.subject.backend.delete([message.handle])[0].kind == "ok"
    assert lease.lost.wait(30), "the loss was never told"
    wait_for(lambda: leasing.lost)
    assert leasing.lost[0][0] is lease
    assert lease.state is LeaseState.LOST
    with pytest.raises(LeaseLost):
        lease.check()
    with pytest.raises(LeaseLost):
        lease.complete()
    assert leasing.manager.stats().lost == 1


def test_close_releases_what_is_held_and_tells_the_handlers(leasing: Leasing) -> None:
    for i in range(3):
        leasing.subject.send(f"job {i}")
    leases = [leasing.manager.register(m) for m in leasing.receive(3, visibility=30)]
    leasing.manager.close()
    assert all(lease.state is LeaseState.RELEASED for lease in leases)
    assert all(lease.lost.is_set() for lease in leases)
    assert len(leasing.receive(3)) == 3  # back at once, not after 30 s


def test_batches_and_revoke(leasing: Leasing) -> None:
    for i in range(5):
        leasing.subject.send(f"job {i}")
    leases = [leasing.manager.register(m) for m in leasing.receive(5, visibility=30)]
    assert leasing.manager.complete_many(leases[:3]) == [None, None, None]
    assert [lease.state for lease in leases[:3]] == [LeaseState.COMPLETED] * 3
    assert leasing.manager.release_many(leases[3:4], 0.0) == [None]
    leasing.manager.revoke(leases[4])
    assert leases[3].state is LeaseState.RELEASED and not leases[3].is_lost
    assert leases[4].state is LeaseState.RELEASED and leases[4].is_lost
    with pytest.raises(LeaseError):
        leases[0].release()  # completed
    assert len(leasing.receive(2)) == 2


def test_register_many_leases_a_receive_and_refuses_what_has_too_little_left(
    leasing: Leasing,
) -> None:
    for n in range(3):
        leasing.subject.send(f"job {n}")
    first, second, third = leasing.receive(3)
    late = Message(  # the third as if received 3.5 s ago: 0.5 s left, under minimal_life
        id=third.id,
        body=third.body,
        receipt=third.receipt,
        backend=third.backend,
        received_at=third.received_at - 3.5,
        visibility_timeout=third.visibility_timeout,
    )
    got = leasing.manager.register_many([first, second, late])
    assert isinstance(got[2], LeaseTooShort)
    held = [lease for lease in got[:2] if not isinstance(lease, Exception)]
    assert [lease.id for lease in held] == [first.id, second.id]
    assert leasing.manager.register_many([first]) == held[:1]  # this delivery's own lease
    wait_for(lambda: all(lease.extensions >= 1 for lease in held))  # renewed past 4 s
    assert leasing.manager.complete_many(held) == [None, None]
    assert leasing.manager.stats().completed == 2


def test_receive_leases_every_message_at_once(leasing: Leasing) -> None:
    for n in range(3):
        leasing.subject.send(f"job {n}")
    held: list[Any] = []
    for _ in range(50):
        held += leasing.manager.receive(max_messages=3 - len(held), wait_seconds=1)
        if len(held) == 3:
            break
    assert len(held) == 3
    wait_for(lambda: all(h.extensions >= 1 for h in held))  # all renewed, none waiting
    for lease in held:
        with lease:
            assert lease.receive_count == 1
    assert [h.state for h in held] == [LeaseState.COMPLETED] * 3
    assert leasing.subject.backend.receive(max_messages=3) == []


def test_a_watch_is_renewed_until_forgotten_and_never_deleted(leasing: Leasing) -> None:
    leasing.subject.send("owned by a framework")
    (message,) = leasing.receive()
    watched = leasing.manager.watch(message)
    wait_for(lambda: watched.extensions >= 1)
    assert leasing.subject.backend.receive(max_messages=1) == []  # still hidden
    with pytest.raises(LeaseError, match="watch"):
        watched.complete()
    watched.forget()
    assert watched.state is LeaseState.FORGOTTEN and not watched.is_lost
    # The owner requeues it (with the newest receipt: MNS and Azure rotate them on
    # every extend). No late extend of ours hides it again: it is back at once.
    backend = leasing.subject.backend
    assert backend.release([Handle(message.id, watched.receipt)], 0.0)[0].kind == "ok"
    (again,) = leasing.receive()
    assert again.id == message.id
    assert leasing.lost == []
    assert leasing.manager.stats().forgotten == 1


def test_close_forgets_watches_and_the_counts_survive_it(leasing: Leasing) -> None:
    leasing.subject.send("owned by a framework")
    (message,) = leasing.receive()
    watched = leasing.manager.watch(message)
    leasing.manager.close()
    assert watched.state is LeaseState.FORGOTTEN and not watched.is_lost
    stats = leasing.manager.stats()  # after close(): the renewer's final counts
    assert (stats.registered, stats.forgotten, stats.released) == (1, 1, 0)
