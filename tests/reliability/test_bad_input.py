"""Bad input: each case gets a clear error and leaves no damage behind.

tests/core covers the basic config rules and single misuses; this file covers
the gaps: values of every type through every entry point, every order of double
operations from every lease state, wrong message types, handlers finishing after
their lease ended, malformed backends - and after each error it checks that the
manager's stats, the lease's state and the scheduler are as they were.
"""

from __future__ import annotations

import decimal
import fractions
import itertools
import logging
import math
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import leasekeeper
from leasekeeper import (
    ConfigError,
    Handle,
    Lease,
    LeaseConfig,
    LeaseError,
    LeaseLost,
    LeaseManager,
    LeaseState,
    LostReason,
    ManagerClosed,
    Message,
    Worker,
)
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import FaultyBackend, ManualClock

FIELDS = (
    "visibility_timeout",
    "timer_interval",
    "extend_threshold",
    "minimal_life",
    "max_lease_duration",
    "release_delay",
    "release_backoff",
    "max_concurrency",
)


def stable_id(value: object) -> str:
    """A test id for ``value``: its repr, without an address (the two processes of
    ``make test`` must collect the same ids)."""
    return re.sub(r" at 0x[0-9a-fA-F]+", "", repr(value))


WEIRD: list[object] = [
    None,
    True,
    False,
    "30",
    b"30",
    "",
    [30],
    {"seconds": 30},
    (30,),
    object(),
    decimal.Decimal("30"),
    fractions.Fraction(30),
    complex(30, 0),
    math.nan,
    math.inf,
    -math.inf,
    -1,
    -1e-9,
    0,
]


@pytest.fixture(autouse=True)
def quiet_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    caplog.set_level(logging.CRITICAL, logger="leasekeeper")
    yield


def valid(config: LeaseConfig) -> None:
    """Every rule LeaseConfig promises holds for a config it accepted."""
    for name in ("visibility_timeout", "timer_interval", "minimal_life", "release_delay"):
        value = getattr(config, name)
        assert type(value) is float and math.isfinite(value) and value >= 0, name
    assert config.visibility_timeout > config.timer_interval + config.minimal_life
    assert config.timer_interval < config.threshold < config.visibility_timeout
    assert config.release_backoff >= 1 and math.isfinite(config.release_backoff)
    assert type(config.max_concurrency) is int and config.max_concurrency >= 1


# ------------------------------------------------------------------ config


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize("bad", WEIRD, ids=stable_id)
def test_every_entry_point_rejects_a_bad_value_with_a_config_error(field: str, bad: object) -> None:
    if bad is None and field in ("extend_threshold", "max_lease_duration"):
        return  # None is their documented "not set"
    if field == "release_delay" and bad == 0 and not isinstance(bad, bool):
        return  # a zero delay is allowed (False is not: a bool is never seconds)
    queue = MemoryQueue(30)
    entry_points: list[Callable[[], object]] = [
        lambda: LeaseConfig(**{field: bad}),
        lambda: LeaseManager(**{field: bad}),
        lambda: LeaseManager(queue, config=LeaseConfig(), **{field: bad}),
        lambda: LeaseConfig().replace(**{field: bad}),
        lambda: Worker(queue, lambda message: None, **{field: bad}),
    ]
    for make in entry_points:
        with pytest.raises(ConfigError, match=field):
            make()


def test_configure_with_a_bad_value_keeps_the_previous_settings() -> None:
    leasekeeper.shutdown(release=False)
    good = leasekeeper.configure(visibility_timeout=60)
    try:
        with pytest.raises(ConfigError, match="timer_interval"):
            leasekeeper.configure(visibility_timeout=60, timer_interval=math.nan)
        queue = MemoryQueue(60)
        assert leasekeeper.default_manager(queue).config == good
    finally:
        leasekeeper.shutdown(release=False)
        leasekeeper.configure()


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=3),
    st.decimals(allow_nan=False, places=2, max_value=10**6, min_value=-(10**6)),
    st.fractions(max_denominator=10),
)


@settings(max_examples=600, deadline=None)
@given(st.dictionaries(st.sampled_from(FIELDS), _values, max_size=4))
def test_any_config_is_either_valid_or_a_config_error(fields: dict[str, Any]) -> None:
    try:
        config = LeaseConfig(**fields)
    except ConfigError as exc:
        assert any(name in str(exc) for name in fields), str(exc)
        return
    valid(config)


@pytest.mark.parametrize(
    "make",
    [
        lambda: LeaseConfig(visibility_timeout=10**400),
        lambda: LeaseConfig(release_backoff=10**400),
        lambda: LeaseConfig(max_lease_duration=10**400),
    ],
    ids=["visibility_timeout", "release_backoff", "max_lease_duration"],
)
def test_regression_huge_int_config_raises_overflow_error(make: Callable[[], object]) -> None:
    """_seconds() calls float(value) on any int; 10**400 raises OverflowError, which
    is not a ValueError, so callers catching ConfigError miss it. The same happens
    in release(delay=10**400) via math.isfinite()."""
    with pytest.raises(ConfigError):
        make()


# ------------------------------------------------------------------ manager fixture


class World:
    """A manager on a ManualClock over a FaultyBackend, plus a second canary lease
    whose renewal proves the scheduler is still running after each error."""

    def __init__(self, **config: Any) -> None:
        self.clock = ManualClock()
        self.queue = MemoryQueue(30, clock=self.clock, rotate_receipts=True)
        self.faulty = FaultyBackend(self.queue, seed=1, clock=self.clock)
        self.reports: list[str] = []
        self.manager = LeaseManager(
            self.faulty,
            clock=self.clock,
            on_lost=lambda lease, reason: self.reports.append(reason),
            visibility_timeout=30,
            **config,
        )
        self.queue.send("canary")
        self.canary = self.manager.register(self.faulty.receive()[0])

    def lease(self) -> Lease:
        self.queue.send("job")
        return self.manager.register(self.faulty.receive()[0])

    def snapshot(self) -> dict[str, float]:
        stats = self.manager.stats().as_dict()
        for moving in ("extended", "extend_calls", "scheduler_lag_p50", "scheduler_lag_p99"):
            stats.pop(moving)
        stats.pop("extend_latency_p50")
        stats.pop("extend_latency_p99")
        return stats

    def scheduler_still_runs(self) -> None:
        before = self.canary.extensions
        self.clock.advance(25)
        assert self.canary.state is LeaseState.ACTIVE
        assert self.canary.extensions > before


def lost_lease(world: World) -> Lease:
    lease = world.lease()
    world.faulty.script("extend", "lost", message_id=lease.id)
    while lease.state is LeaseState.ACTIVE:
        world.clock.advance(1)
    return lease


def abandoned_lease(world: World) -> Lease:
    lease = world.lease()
    world.faulty.script("extend", "capped", message_id=lease.id)
    while lease.state is LeaseState.ACTIVE:
        world.clock.advance(1)
    return lease


# ------------------------------------------------------------------ wrong message types


@pytest.mark.parametrize(
    "bad",
    [None, "m-000001", b"raw", {"MessageId": "1", "ReceiptHandle": "x"}, 42, object()],
    ids=stable_id,
)
def test_wrong_message_types_are_refused_and_leave_no_trace(bad: object) -> None:
    world = World()
    before = world.snapshot()
    for call in (
        lambda: world.manager.register(bad),  # type: ignore[arg-type]
        lambda: world.manager.lease(bad).__enter__(),  # type: ignore[arg-type]
        lambda: leasekeeper.lease(bad),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError, match="Message"):
            call()
    assert world.snapshot() == before
    world.scheduler_still_runs()


def test_handles_records_and_leases_are_not_messages() -> None:
    world = World()
    lease = world.lease()
    before = world.snapshot()
    for bad in (lease, lease.message.handle, lease.message.raw, Handle("m-1", "r")):
        with pytest.raises(TypeError, match="Message"):
            world.manager.register(bad)  # type: ignore[arg-type]
    assert world.snapshot() == before
    world.scheduler_still_runs()


def test_a_message_from_something_that_is_not_a_backend_is_refused() -> None:
    world = World()
    before = world.snapshot()
    message = Message(
        id="x", body="b", receipt="r", backend=object(), received_at=1000.0, visibility_timeout=30
    )  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="not a leasekeeper backend"):
        world.manager.register(message)
    assert world.snapshot() == before
    world.scheduler_still_runs()


def test_a_message_from_a_backend_with_too_short_a_maximum_is_refused() -> None:
    world = World()
    small = MemoryQueue(10, clock=world.clock, max_visibility=10)
    small.send("job")
    before = world.snapshot()
    with pytest.raises(ConfigError, match="max_visibility"):
        world.manager.register(small.receive()[0])
    assert world.snapshot() == before
    world.scheduler_still_runs()


@pytest.mark.parametrize("visibility", [math.inf, math.nan], ids=["inf", "nan"])
def test_regression_register_accepts_a_non_finite_deadline(visibility: float) -> None:
    """adopt(raw, visibility_timeout=inf) makes visible_until inf: remaining >=
    minimal_life, so register() accepts it, and its due time (inf - threshold) never
    comes - the message reappears after its real timeout while the lease says
    ACTIVE and nobody is told. NaN slips through the same check (NaN < x is False)."""
    world = World()
    world.queue.send("job")
    message = world.faulty.receive()[0]
    with pytest.raises(ValueError, match="visibility_timeout"):  # as every backend's adopt
        world.faulty.adopt(message.raw, visibility_timeout=visibility)
    odd = Message(
        id=message.id,
        body=message.body,
        receipt=message.receipt,
        backend=message.backend,
        received_at=message.received_at,
        visibility_timeout=visibility,
    )
    with pytest.raises((ValueError, LeaseError)):
        world.manager.register(odd)


@pytest.mark.parametrize("max_batch", [0, -1, 2.5, "10"], ids=repr)
def test_regression_a_backend_with_a_bad_max_batch_is_accepted(max_batch: object) -> None:
    """_check_backend checks only the protocol's presence and max_visibility. With
    max_batch=-1 chunked() yields nothing: leases stay ACTIVE, never renewed, never
    reported. With 0, 2.5 or "10" the scheduler raises on every tick (on a real
    clock: scheduler_errors climbs for ever and the popped leases are dropped)."""
    world = World()
    odd = FaultyBackend(MemoryQueue(30, clock=world.clock), clock=world.clock)
    odd.max_batch = max_batch  # type: ignore[assignment]
    odd.inner.send("job")  # type: ignore[attr-defined]
    with pytest.raises((TypeError, ValueError)):
        world.manager.register(odd.receive()[0])


# ------------------------------------------------------------------ double operations

OPS = ("complete", "release", "release-later", "register")
START = ("active", "lost", "abandoned", "abandoned-lapsed", "closed-released", "closed-kept")


def start_in(world: World, start: str) -> Lease:
    if start == "active":
        return world.lease()
    if start == "lost":
        return lost_lease(world)
    if start == "abandoned":
        return abandoned_lease(world)
    if start == "abandoned-lapsed":
        lease = abandoned_lease(world)
        world.clock.advance(30)
        return lease
    lease = world.lease()
    world.manager.close(release=start == "closed-released")
    return lease


def expect(state: LeaseState, signalled: bool, op: str, lapsed: bool, closed: bool) -> Any:
    """The reference: (exception or None, state after) for ``op`` on such a lease."""
    if op == "register":
        if closed:
            return ManagerClosed, state
        return None, state  # only asked while ACTIVE (see below)
    if op == "complete":
        if state is LeaseState.ACTIVE or (state is LeaseState.ABANDONED and not lapsed):
            return None, LeaseState.COMPLETED
        if state is LeaseState.COMPLETED:
            return None, state
        if state is LeaseState.RELEASED and not signalled:
            return LeaseError, state
        return LeaseLost, state
    # release
    if state is LeaseState.COMPLETED:
        return LeaseError, state
    if state is LeaseState.ACTIVE:
        return None, LeaseState.RELEASED
    return None, state  # released already, or not ours: nothing to do


@pytest.mark.parametrize("start", START)
@pytest.mark.parametrize("ops", list(itertools.product(OPS, repeat=3)), ids="-".join)
def test_double_operations_in_any_order(start: str, ops: tuple[str, ...]) -> None:
    world = World(max_lease_duration=None)
    lease = start_in(world, start)
    closed = world.manager.closed
    for op in ops:
        state, signalled = lease.state, lease.is_lost
        lapsed = world.clock.now() >= lease.visible_until
        if op == "register" and state is not LeaseState.ACTIVE and not closed:
            continue  # registering a finished lease's message: see the core bug below
        raises, after = expect(state, signalled, op, lapsed, closed)
        before = world.snapshot()
        calls = dict(world.faulty.calls)
        try:
            if op == "complete":
                lease.complete()
            elif op == "release":
                lease.release()
            elif op == "release-later":
                lease.release(60)
            else:
                assert world.manager.register(lease.message) is lease
        except Exception as exc:
            assert raises is not None and isinstance(exc, raises), (op, state, exc)
            assert lease.message.receipt not in str(exc)
        else:
            assert raises is None, (op, state, "did not raise", raises)
        assert lease.state is after, (op, state, lease.state)
        if after is state:  # a refused or idempotent operation changes nothing
            assert world.snapshot() == before, (op, state)
            assert dict(world.faulty.calls) == calls, (op, state, "called the backend")
    if not closed:
        world.scheduler_still_runs()
    stats = world.manager.stats()
    assert stats.registered == 2
    assert stats.in_flight + stats.completed + stats.released + stats.lost + stats.abandoned >= 2


@pytest.mark.parametrize("finish", ["complete", "release"])
def test_regression_register_after_the_lease_finished(finish: str) -> None:
    """register() only looks at the lane's *active* leases. After complete() (the
    message is deleted) or release() the same Message registers again as a new
    lease; it is renewed with a dead receipt, comes back "lost: MessageNotExist" /
    "ReceiptHandleError", and on_lost fires for a message that was processed fine."""
    world = World()
    lease = world.lease()
    getattr(lease, finish)()
    again = world.manager.register(lease.message)
    world.clock.advance(60)
    assert again is lease or again.state is not LeaseState.LOST, again.reason
    assert world.reports == []


# ------------------------------------------------------------------ handlers after loss


def test_a_handler_that_returns_after_its_lease_was_lost_deletes_nothing() -> None:
    world = World()
    world.queue.send("job")
    message = world.faulty.receive()[0]
    world.faulty.script("extend", "lost", message_id=message.id)
    with pytest.raises(LeaseLost), world.manager.lease(message) as lease:
        world.clock.advance(25)  # the job runs; its lease is lost meanwhile
        assert lease.lost.is_set()
    assert world.queue.deleted_ids == []
    assert world.reports == [LostReason.REJECTED]

    @world.manager.leased
    def handler(message: Message) -> str:
        world.faulty.script("extend", "fatal", message_id=message.id)
        world.clock.advance(25)
        return "done"  # returns normally, unaware

    world.queue.send("job 2")
    with pytest.raises(LeaseLost, match="fatal"):
        handler(world.faulty.receive()[0])
    assert world.queue.deleted_ids == []
    world.scheduler_still_runs()


def test_a_handler_that_returns_after_abandonment_completes_only_while_invisible() -> None:
    world = World(max_lease_duration=60)
    world.queue.send("quick")
    world.queue.send("slow")
    quick, slow = world.faulty.receive(max_messages=2)
    with pytest.raises(LeaseLost, match="max_lease_duration"), world.manager.lease(slow):
        with world.manager.lease(quick):
            world.clock.advance(65)  # both abandoned at 60 s, still invisible
        assert world.queue.deleted_ids == [quick.id]  # so quick's delete was safe
        world.clock.advance(60)  # slow lapsed meanwhile: someone else may have it
    assert slow.id not in world.queue.deleted_ids


def test_a_handler_failing_after_its_lease_was_lost_releases_nothing() -> None:
    world = World()
    world.queue.send("job")
    message = world.faulty.receive()[0]
    world.faulty.script("extend", "lost", message_id=message.id)
    with pytest.raises(ZeroDivisionError), world.manager.lease(message):
        world.clock.advance(25)
        1 / 0  # noqa: B018
    assert world.faulty.calls["release"] == 0


# ------------------------------------------------------------------ malformed backends


def test_malformed_release_answers_at_close_still_end_every_lease() -> None:
    world = World()
    leases = [world.lease() for _ in range(3)]
    world.faulty.script("release", "malformed", "exception")
    world.manager.close()
    for lease in [world.canary, *leases]:
        assert lease.state is LeaseState.RELEASED and lease.lost.is_set()


@pytest.mark.parametrize("form", ["bad_kind"])
def test_an_unknown_outcome_kind_on_delete_is_malformed_and_retried(form: str) -> None:
    # Neither success nor failure: treated like any malformed answer (transient), so
    # the delete is tried again and goes through.
    world = World()
    faulty = FaultyBackend(world.queue, seed=1, clock=world.clock, malformed_forms=(form,))
    world.queue.send("job")
    lease = world.manager.register(faulty.receive()[0])
    faulty.script("delete", "malformed", message_id=lease.id)
    lease.complete()
    assert lease.state is LeaseState.COMPLETED
    assert world.queue.deleted_ids == [lease.id]
    assert faulty.injected("malformed", "delete") == 1


def test_regression_an_ok_with_a_non_string_receipt_corrupts_the_lease() -> None:
    """_call checks the answer's type and length but not each Outcome's fields: an
    "ok" carrying receipt=1234567 is stored as the lease's receipt, the next call is
    rejected by the queue and the lease is lost - a malformed answer turned into a
    loss instead of being treated as transient like the other malformed answers."""
    world = World()
    faulty = FaultyBackend(world.queue, seed=1, clock=world.clock, malformed_forms=("bad_receipt",))
    world.queue.send("job")
    lease = world.manager.register(faulty.receive()[0])
    faulty.script("extend", "malformed", message_id=lease.id)
    world.clock.advance(25)
    world.clock.advance(25)
    assert lease.state is LeaseState.ACTIVE, lease.reason
    lease.complete()


def test_regression_release_backoff_overflows_for_a_poison_message() -> None:
    """A message received 1025+ times with release_backoff=2 (a poison message on a
    queue without a dead-letter queue): 2.0 ** 1024 raises OverflowError in
    _release before the op lock is taken, so the lease stays ACTIVE and is renewed
    for ever - the handler gave up, yet the message never comes back. Even with
    release_delay=0. LeaseScope logs the error and swallows it."""
    world = World(release_delay=1, release_backoff=2)
    world.queue.send("poison")
    message = world.faulty.receive()[0]
    message.receive_count = 1100
    with pytest.raises(RuntimeError), world.manager.lease(message):
        raise RuntimeError("bad payload")
    assert world.manager.get(message) is None, "still leased after the handler gave up"


@pytest.mark.parametrize("timeout", ["5", [5]], ids=repr)
def test_regression_close_with_a_bad_timeout_leaves_leases_unreleased(timeout: object) -> None:
    """close() sets _closed before it computes clock.now() + timeout, so a bad
    timeout raises TypeError half-way: the scheduler is stopped, nothing is released,
    and a second close() returns at once because the manager is already closed."""
    world = World()
    lease = world.lease()
    with pytest.raises((TypeError, ValueError)):
        world.manager.close(timeout=timeout)  # type: ignore[arg-type]
    world.manager.close()
    assert lease.state is LeaseState.RELEASED
