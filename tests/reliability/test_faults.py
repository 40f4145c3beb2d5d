"""FaultyBackend itself: each fault does what it says, counts it, and is reproducible."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import pytest

from leasekeeper import Backend, Handle, LeaseManager, Outcome
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.errors import ReceiveError
from leasekeeper.testing import FaultEvent, Faults, FaultyBackend, InjectedError, ManualClock
from leasekeeper.testing.faults import DEFAULT_MALFORMED_FORMS
from tests.helpers import ScriptedBackend
from tests.reliability.invariants import QueueSpy


def setup(
    n: int = 3, **kwargs: Any
) -> tuple[ManualClock, MemoryQueue, FaultyBackend, list[Handle]]:
    clock = ManualClock()
    queue = MemoryQueue(30, clock=clock, rotate_receipts=kwargs.pop("rotate", False))
    faulty = FaultyBackend(queue, clock=clock, **kwargs)
    for i in range(n):
        queue.send(f"job {i}")
    handles = [m.handle for m in faulty.receive(max_messages=n)]
    return clock, queue, faulty, handles


# ------------------------------------------------------------------ configuration


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"retry": 1.5}, ValueError),
        ({"lost": -0.1}, ValueError),
        ({"fatal": float("nan")}, ValueError),
        ({"retry": "0.1"}, TypeError),
        ({"hang": True}, TypeError),
        ({"latency": -1}, ValueError),
        ({"latency": float("inf")}, ValueError),
        ({"retry": 0.6, "lost": 0.6}, ValueError),
        ({"exception": 0.5, "malformed": 0.6}, ValueError),
        ({"spike": 0.1}, ValueError),
    ],
)
def test_bad_fault_rates_are_refused(fields: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        Faults(**fields)


def test_faults_that_do_not_apply_are_refused() -> None:
    _clock, _queue, faulty, _ = setup()
    with pytest.raises(ValueError, match="extend only"):
        faulty.set_faults("delete", Faults(capped=0.1))
    with pytest.raises(ValueError, match="receive"):
        faulty.set_faults("receive", Faults(stale=0.1))
    with pytest.raises(ValueError, match="unknown operation"):
        faulty.set_faults("purge", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown fault"):
        faulty.script("extend", "gremlins")
    with pytest.raises(TypeError, match="leasekeeper backend"):
        FaultyBackend(object())  # type: ignore[arg-type]
    plain = ScriptedBackend(MemoryQueue(30))  # neither rotating nor a MemoryQueue
    with pytest.raises(ValueError, match="stale"):
        FaultyBackend(plain, extend=Faults(stale=0.1))  # type: ignore[arg-type]


def test_it_is_a_backend_and_forwards_its_limits() -> None:
    queue = MemoryQueue(30, max_batch=7, max_visibility=600, rotate_receipts=True)
    faulty = FaultyBackend(queue)
    assert isinstance(faulty, Backend)
    assert (faulty.max_batch, faulty.max_visibility, faulty.rotates_receipts) == (7, 600, True)
    queue.send("job")
    message = faulty.receive()[0]
    assert message.backend is faulty
    assert faulty.adopt(message.raw).backend is faulty
    LeaseManager(faulty, visibility_timeout=600).close()


# ------------------------------------------------------------------ each fault


@pytest.mark.parametrize(
    ("kind", "detail"),
    [
        ("retry", "InternalError"),
        ("lost", "MessageNotExist (injected)"),
        ("fatal", "QueueNotExist (injected)"),
        ("capped", "beyond the limit (injected)"),
    ],
)
def test_per_entry_faults_answer_without_reaching_the_queue(kind: str, detail: str) -> None:
    _clock, queue, faulty, handles = setup(extend=Faults(**{kind: 1.0}))
    outcomes = faulty.extend(handles, 30)
    assert outcomes == [Outcome(kind, detail=detail)] * 3  # type: ignore[arg-type]
    assert queue.calls["extend"] == 0
    assert faulty.injected(kind) == faulty.affected(kind) == 3
    assert faulty.counts == {f"extend.{kind}": 3}
    assert [e.message_ids for e in faulty.events] == [(h.message_id,) for h in handles]


def test_throttling_answers_every_entry_of_the_call() -> None:
    _clock, queue, faulty, handles = setup(delete=Faults(throttle=1.0))
    assert faulty.delete(handles) == [Outcome("retry", detail="Throttling")] * 3
    assert (faulty.injected("throttle"), faulty.affected("throttle")) == (1, 3)
    assert len(queue) == 3


def test_exceptions_are_of_unexpected_types_and_hold_no_receipt() -> None:
    _clock, _queue, faulty, handles = setup(extend=Faults(exception=1.0), seed=4)
    seen: set[type[BaseException]] = set()
    for _ in range(40):
        with pytest.raises(Exception) as raised:
            faulty.extend(handles, 30)
        seen.add(type(raised.value))
        assert all(h.receipt not in str(raised.value) for h in handles)
    assert seen >= {ConnectionResetError, TimeoutError, RuntimeError, ValueError, KeyError}
    assert faulty.injected("exception") == 40


def test_receive_faults_raise_or_drop() -> None:
    clock = ManualClock()
    queue = MemoryQueue(30, clock=clock)
    faulty = FaultyBackend(queue, clock=clock)
    queue.send("job")
    for kind in ("retry", "throttle", "fatal"):
        faulty.script("receive", kind)
        with pytest.raises(ReceiveError) as raised:  # what every backend's receive raises
            faulty.receive()
        assert isinstance(raised.value, InjectedError) and raised.value.fault == kind
        assert raised.value.retryable is (kind != "fatal")
        assert raised.value.kind == ("fatal" if kind == "fatal" else "retry")
    faulty.script("receive", "lost")
    assert faulty.receive() == []  # the queue handed it out; the answer was lost
    assert queue.visible_count() == 0 and queue.receive_counts == {"m-000001": 1}
    clock.advance(30)
    assert [m.id for m in faulty.receive()] == ["m-000001"]  # back after its timeout


@pytest.mark.parametrize("form", [*DEFAULT_MALFORMED_FORMS, "bad_receipt"])
def test_malformed_answers(form: str) -> None:
    _clock, queue, faulty, handles = setup(extend=Faults(malformed=1.0), malformed_forms=(form,))
    answer: Any = faulty.extend(handles, 30)
    well_formed = (
        isinstance(answer, list)
        and len(answer) == 3
        and all(isinstance(o, Outcome) and o.kind in ("ok", "retry", "lost") for o in answer)
        and all(o.receipt is None or isinstance(o.receipt, str) for o in answer)
    )
    assert not well_formed
    assert queue.calls["extend"] == 0


@pytest.mark.parametrize("rotate", [False, True])
def test_stale_receipts_are_rejected_by_the_queue_itself(rotate: bool) -> None:
    _clock, _queue, faulty, handles = setup(n=1, rotate=rotate)
    faulty.script("extend", "stale")
    (outcome,) = faulty.extend(handles, 30)
    assert outcome.kind == "ok"  # the extend itself went through
    current = Handle(handles[0].message_id, outcome.receipt or handles[0].receipt)
    assert faulty.extend([current], 30)[0].kind == "lost"  # ... but the receipt died
    assert faulty.injected("stale") == 1
    assert faulty.answers == {"extend.ok": 1, "extend.lost": 1}


@pytest.mark.parametrize("rotate", [False, True])
def test_a_receipt_already_stale_is_not_made_stale_twice(rotate: bool) -> None:
    # Found by the soak matrix: an extend made the receipt stale, then a "stale" draw
    # on the delete counted a second injection the queue could only reject once.
    _clock, _queue, faulty, handles = setup(n=1, rotate=rotate)
    faulty.script("extend", "stale")
    (outcome,) = faulty.extend(handles, 30)
    current = Handle(handles[0].message_id, outcome.receipt or handles[0].receipt)
    faulty.script("delete", "stale")
    assert faulty.delete([current])[0].kind == "lost"
    assert faulty.injected("stale") == 1 == faulty.answers["delete.lost"]


def test_stale_through_a_rotating_backend_swallows_the_new_receipt() -> None:
    inner = ScriptedBackend(MemoryQueue(30, rotate_receipts=True))
    faulty = FaultyBackend(inner, extend=Faults(stale=1.0))  # type: ignore[arg-type]
    inner.inner.send("job")
    handle = faulty.receive()[0].handle
    assert faulty.extend([handle], 30) == [Outcome("ok")]  # no new receipt handed back
    faulty.set_faults("extend", None)
    assert faulty.extend([handle], 30)[0].kind == "lost"
    with pytest.raises(ValueError, match="on demand"):
        faulty.set_faults("delete", Faults(stale=0.5))


def test_stale_before_a_delete_and_through_a_spy() -> None:
    clock = ManualClock()
    queue = MemoryQueue(30, clock=clock)
    faulty = FaultyBackend(QueueSpy(queue), clock=clock)  # uses the spy's rotate_receipt
    queue.send("job")
    handle = faulty.receive()[0].handle
    faulty.script("delete", "stale")
    assert faulty.delete([handle])[0].kind == "lost"
    assert len(queue) == 1


def test_targeted_scripts_hit_only_their_message() -> None:
    _clock, _queue, faulty, handles = setup()
    target = handles[1].message_id
    faulty.script("extend", "lost", Outcome("capped", detail="x"), message_id=target)
    assert [o.kind for o in faulty.extend(handles, 30)] == ["ok", "lost", "ok"]
    assert [o.kind for o in faulty.extend(handles[1:2], 30)] == ["capped"]
    # An injected loss never reached the queue: the receipt still works.
    assert [o.kind for o in faulty.extend(handles, 30)] == ["ok", "ok", "ok"]
    faulty.script("extend", "exception", message_id=target)
    with pytest.raises(Exception, match="injected"):
        faulty.extend(handles, 30)  # a whole-call fault fails the call it lands in
    faulty.script("extend", "lost", "lost", message_id=target)
    assert faulty.pending("extend") == 2
    assert faulty.clear_script() == 2


def test_the_same_seed_gives_the_same_faults() -> None:
    def run(seed: int) -> list[FaultEvent]:
        _clock, _queue, faulty, handles = setup(
            n=10,
            seed=seed,
            extend=Faults(retry=0.2, lost=0.1, throttle=0.1, malformed=0.1, exception=0.1),
        )
        for _ in range(30):
            with contextlib.suppress(Exception):
                faulty.extend(handles, 30)
        return [e._replace(at=0.0) for e in faulty.events]

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_enabled_false_and_set_faults_turn_faults_off() -> None:
    _clock, _queue, faulty, handles = setup(extend=Faults(lost=1.0))
    faulty.enabled = False
    assert all(o.kind == "ok" for o in faulty.extend(handles, 30))
    faulty.enabled = True
    faulty.set_faults("extend", {"retry": 1.0})
    assert all(o.kind == "retry" for o in faulty.extend(handles, 30))
    assert faulty.faults("extend") == Faults(retry=1.0)


# ------------------------------------------------------------------ time


def test_latency_on_a_manual_clock_moves_time_instead_of_sleeping() -> None:
    clock, _queue, faulty, handles = setup(extend=Faults(latency=2.5, spike=1.0, spike_latency=10))
    before, started = clock.now(), time.monotonic()
    faulty.extend(handles, 30)
    assert clock.now() - before == pytest.approx(12.5)
    assert time.monotonic() - started < 1.0
    assert faulty.added_latency["extend"] == pytest.approx(12.5)
    assert (faulty.injected("latency"), faulty.injected("spike")) == (1, 1)


def test_latency_on_a_real_clock_sleeps_and_close_cuts_it_short() -> None:
    queue = MemoryQueue(30)
    faulty = FaultyBackend(queue, extend=Faults(latency=0.2))
    queue.send("job")
    handles = [faulty.receive()[0].handle]
    started = time.monotonic()
    faulty.extend(handles, 30)
    assert time.monotonic() - started >= 0.19
    faulty.set_faults("extend", Faults(latency=30))
    threading.Timer(0.2, faulty.close).start()
    started = time.monotonic()
    faulty.extend(handles, 30)
    assert time.monotonic() - started < 10


def test_a_hang_blocks_until_released_then_goes_through() -> None:
    _clock, _queue, faulty, handles = setup(n=1)
    faulty.script("extend", "hang", "hang")
    answers: list[Any] = []
    caller = threading.Thread(target=lambda: answers.append(faulty.extend(handles, 30)))
    caller.start()
    assert faulty.wait_for_hangs(1, timeout=5)
    assert faulty.hanging == 1 and answers == []
    faulty.release_hangs()
    caller.join(5)
    assert answers == [[Outcome("ok")]] and faulty.hanging == 0
    # The second hang ends with close(): the call gives up like a socket timeout.
    errors: list[BaseException] = []

    def call() -> None:
        try:
            faulty.extend(handles, 30)
        except TimeoutError as exc:
            errors.append(exc)

    caller = threading.Thread(target=call)
    caller.start()
    assert faulty.wait_for_hangs(1, timeout=5)
    faulty.close()
    caller.join(5)
    assert len(errors) == 1 and faulty.injected("hang") == 2


def test_a_hang_limit_times_out() -> None:
    _clock, _queue, faulty, handles = setup(n=1, hang_limit=0.1)
    faulty.script("extend", "hang")
    with pytest.raises(TimeoutError, match="timed out"):
        faulty.extend(handles, 30)


# ------------------------------------------------------------------ secrets


def test_nothing_it_shows_or_logs_holds_a_receipt(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="leasekeeper.testing.faults")
    _clock, _queue, faulty, handles = setup(
        rotate=True, extend=Faults(retry=0.3, lost=0.2, stale=0.2, malformed=0.1), seed=2
    )
    for _ in range(10):
        faulty.extend(handles, 30)
    blob = "\n".join([caplog.text, repr(faulty), repr(list(faulty.events)), repr(faulty.counts)])
    assert "injected" in caplog.text
    assert all(h.receipt not in blob for h in handles)
