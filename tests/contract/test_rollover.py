"""A rollover on every backend: the continuation carries the job on (issue 24).

The handler saves a checkpoint and raises ``Rollover`` inside ``with
manager.lease(message):``; the next receive is the continuation: the same body
(an envelope, where the service carries no attributes, is taken off before the
handler sees it), the original's own attributes, the checkpoint as
``lease.resumed`` and ``lease.lineage`` one hop on; the original is gone. On a
FIFO queue the continuation keeps its message group.
"""

from __future__ import annotations

import uuid

from leasekeeper import LeaseManager, Rollover
from leasekeeper.backends.base import Sender
from tests.contract.conftest import HIDDEN, Subject
from tests.contract.test_contract import receive_n
from tests.services import make_client

ATTRIBUTE = "leasekeeper-continuation"


def test_a_rollover_hands_the_job_on(subject: Subject) -> None:
    backend = subject.backend
    assert isinstance(backend, Sender)
    own = {"origin": "contract"} if backend.carries_attributes else {}
    first = backend.send("the job's body", own)
    manager = LeaseManager(
        backend, clock=subject.clock, renewer="thread", on_cap="rollover", visibility_timeout=HIDDEN
    )
    try:
        [message] = receive_n(subject, 1)
        with manager.lease(message) as held:
            assert (held.lineage, held.resumed) == ((first, 0), None)
            held.checkpoint({"rows": 1200, "cursor": "ab/cd", "ok": True})
            raise Rollover
        [continuation] = receive_n(subject, 1)
        with manager.lease(continuation) as nxt:
            assert nxt.id != first and nxt.message.body == "the job's body"
            assert {k: v for k, v in nxt.message.attributes.items() if k != ATTRIBUTE} == own
            # The lineage travels as an attribute where the service carries them, in an
            # envelope (taken off: the body above is the original's) where it cannot.
            assert (ATTRIBUTE in nxt.message.attributes) == backend.carries_attributes
            assert nxt.resumed == {"rows": 1200, "cursor": "ab/cd", "ok": True}
            assert nxt.lineage == (first, 1)
        assert backend.receive(visibility_timeout=HIDDEN) == []  # the original is gone
        stats = manager.stats()
        assert (stats.rolled_over, stats.completed, stats.lost) == (1, 2, 0)
    finally:
        manager.close()


def test_a_fifo_continuation_keeps_its_message_group(moto_endpoint: str) -> None:
    from leasekeeper.backends.sqs import SQSBackend

    admin = make_client(moto_endpoint)
    url: str = admin.create_queue(
        QueueName=f"rollover-{uuid.uuid4().hex[:12]}.fifo",
        Attributes={"FifoQueue": "true", "VisibilityTimeout": str(int(HIDDEN))},
    )["QueueUrl"]
    backend = SQSBackend(make_client(moto_endpoint), url)
    manager = LeaseManager(backend, renewer="thread", on_cap="rollover")
    try:
        backend.send("ordered", group_id="customer-7")
        [held] = manager.receive(wait_seconds=1)
        with held:
            raise Rollover
        [nxt] = manager.receive(wait_seconds=1)
        assert nxt.message.raw["Attributes"]["MessageGroupId"] == "customer-7"
        assert nxt.lineage.hop == 1 and nxt.message.body == "ordered"
        nxt.complete()
    finally:
        manager.close()
        admin.delete_queue(QueueUrl=url)
