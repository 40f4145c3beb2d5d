"""Groups: which held messages of a FIFO queue may start, driven with plain values."""

from __future__ import annotations

from leasekeeper.backends.forwarding import ForwardingBackend
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.receiving.groups import Groups, in_waves, is_ordered

A, B = ("q", "a"), ("q", "b")


def test_one_job_of_a_group_at_a_time_in_order() -> None:
    groups: Groups[str] = Groups()
    started = [
        job for key, job in [(A, "a1"), (A, "a2"), (B, "b1"), (A, "a3")] if groups.add(key, job)
    ]
    assert started == ["a1", "b1"]  # groups side by side, each one at a time
    assert (groups.waiting, groups.stalled(), groups.stalled("q"), len(groups)) == (2, 1, 1, 2)
    assert groups.done(A) == "a2"
    assert groups.done(A) == "a3"
    assert groups.stalled() == 0 and groups.waiting == 0
    assert groups.done(A) is None  # a3 done, nothing left: A is forgotten...
    assert not groups.started(A) and len(groups) == 1
    assert groups.add(A, "a4")  # ...so its next message starts at once


def test_jobs_of_no_group_always_start_and_touch_nothing() -> None:
    groups: Groups[str] = Groups()
    assert groups.add(None, "x") and groups.add(None, "y")
    assert groups.done(None) is None and groups.drop(None) == []
    assert (groups.waiting, len(groups), groups.let_go) == (0, 0, 0)


def test_a_dropped_group_hands_back_its_waiting_jobs_and_is_forgotten() -> None:
    groups: Groups[str] = Groups()
    for job in ("a1", "a2", "a3"):
        groups.add(A, job)
    groups.add(B, "b1")
    assert groups.drop(A) == ["a2", "a3"]
    # Nothing of A survives: not its waiting count, not the failure.
    assert (groups.waiting, groups.stalled(), groups.let_go) == (0, 0, 1)
    assert groups.add(A, "a2 again")  # the service hands A out anew: it starts at once
    assert groups.drop(A) == [] and groups.let_go == 2
    assert groups.drop(A) == [] and groups.let_go == 2  # not held: nothing to let go


def test_the_same_group_id_on_two_queues_is_two_groups() -> None:
    groups: Groups[str] = Groups()
    assert groups.add(("one", "g"), "1")
    assert groups.add(("two", "g"), "2")
    assert not groups.add(("two", "g"), "2b")
    assert (groups.stalled("one"), groups.stalled("two"), groups.held("one")) == (0, 1, 1)
    assert groups.waiting_jobs() == ["2b"]


def test_is_ordered_reads_fifo_through_wrappers() -> None:
    assert is_ordered(MemoryQueue(fifo=True))
    assert is_ordered(MemoryQueue(name="jobs.fifo"))
    assert not is_ordered(MemoryQueue())
    assert is_ordered(ForwardingBackend(MemoryQueue(fifo=True)))

    class Plugin:  # a backend of one's own opts in with one attribute
        fifo = True

    assert is_ordered(Plugin()) and not is_ordered(object())


def test_in_waves_puts_each_groups_nth_in_the_nth_wave() -> None:
    jobs = ["a1", "b1", "a2", "x", "a3", "b2", "y"]
    group = {"a": "a", "b": "b"}
    waves = in_waves(jobs, lambda job: group.get(job[0]))
    assert waves == [["a1", "b1", "x", "y"], ["a2", "b2"], ["a3"]]
    assert in_waves([], lambda job: None) == []
