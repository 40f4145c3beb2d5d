"""LeaseRecord.maker: the register hot path's constructor builds what __init__ builds."""

from __future__ import annotations

import pytest

from leasekeeper import Lease, WatchLease
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.record import LeaseRecord, LeaseState
from leasekeeper.renewers.process import RemoteLease


def slots(cls: type) -> list[str]:
    return [
        name
        for klass in cls.__mro__
        for name in getattr(klass, "__slots__", ())
        if name != "__weakref__"
    ]


@pytest.mark.parametrize("cls", [LeaseRecord, Lease, WatchLease])
def test_maker_sets_every_field_as_init_does(cls: type[LeaseRecord]) -> None:
    queue = MemoryQueue(30.0)
    queue.send("x")
    (message,) = queue.receive(1)
    owner = object()
    built = cls(owner, message, 12.5)
    made = cls.maker(owner)(message, 12.5)
    assert type(made) is cls
    unset = object()
    for name in slots(cls):
        # (progressed_at stays unset in both until the first progress())
        assert getattr(made, name, unset) == getattr(built, name, unset), name
    assert made.last_progress() == built.last_progress() == 12.5
    assert made.state is LeaseState.ACTIVE and made.owner is owner
    assert made.receipt == message.receipt and made.visible_until == message.visible_until


def test_maker_makes_a_new_free_record_each_call() -> None:
    queue = MemoryQueue(30.0)
    queue.send_many(["a", "b"])
    first, second = queue.receive(2)
    make = Lease.maker(None)
    one, two = make(first, 1.0), make(second, 2.0)
    assert one is not two and not one.busy and not two.busy
    assert (one.id, two.id) == (first.id, second.id)


def test_maker_refuses_a_class_with_fields_of_its_own() -> None:
    with pytest.raises(TypeError, match="adds fields"):
        RemoteLease.maker(None)
