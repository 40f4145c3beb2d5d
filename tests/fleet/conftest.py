"""What the fleet tests share: the local stand-in clouds, and an SQS queue on moto
where a renewer process finds its credentials (as a worker in production does)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.fleet.clouds import CloudServer
from tests.services import CHILD_ENV, make_client


@pytest.fixture
def cloud() -> Iterator[CloudServer]:
    server = CloudServer()
    yield server
    server.close()


@pytest.fixture
def sqs_queue(moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh SQS queue on moto, with moto's dummy credentials in the environment."""
    for name, value in CHILD_ENV.items():
        monkeypatch.setenv(name, value)
    admin = make_client(moto_endpoint)
    url: str = admin.create_queue(
        QueueName=f"fleet-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "30"}
    )["QueueUrl"]
    yield url
    admin.delete_queue(QueueUrl=url)
