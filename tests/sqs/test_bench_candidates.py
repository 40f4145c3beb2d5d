"""The lean path's candidates that measure 14 compares (benchmarks/sqs_candidates.py)
each make a real call on moto: the benchmark breaks here, not in ``make bench``."""

from __future__ import annotations

import uuid

from benchmarks.sqs_candidates import candidates

from tests.services import make_client


def test_every_candidate_receives_what_the_client_receives(moto_endpoint: str) -> None:
    client = make_client(moto_endpoint)
    url = client.create_queue(QueueName=f"candidates-{uuid.uuid4().hex[:8]}")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="one")
    receive = {"QueueUrl": url, "MaxNumberOfMessages": 10, "VisibilityTimeout": 0}
    found = candidates(client)
    assert "boto3 client" in found and len(found) >= 4
    for name, call in found.items():
        answer = call("ReceiveMessage", receive)
        bodies = [message["Body"] for message in answer.get("Messages", [])]
        assert bodies == ["one"], name
