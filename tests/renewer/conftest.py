"""Leases in both renewer modes, on backends a renewer process can rebuild.

``leasing`` is parametrised over the cloud backends' local services (SQS on moto,
MNS on the local server, Azure on Azurite, from the contract suite's subjects)
and over ``renewer="thread"``/``"process"``. The renewer process builds its backend
from ``backend.spec()`` and takes its credentials from the environment, as it would
in production: the fixture puts the local services' dummy credentials there.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from leasekeeper import Lease, LeaseManager
from leasekeeper.backends.azure import AzureQueueBackend
from tests.azure.settings import KEY as AZURITE_KEY
from tests.contract.conftest import Subject, made_subject
from tests.services import CHILD_ENV, MNS_ACCESS_ID, MNS_ACCESS_KEY, make_client

CLOUD = ("sqs-moto", "mns-local", "azure-azurite")
RENEWERS = ("thread", "process")

# Short enough that a test sees renewals within seconds, long enough for a loaded
# machine: renewed when 2 s of the 4 s remain.
TIMING: dict[str, Any] = {
    "visibility_timeout": 4.0,
    "extend_threshold": 2.0,
    "timer_interval": 0.5,
    "minimal_life": 1.0,
}


@dataclass
class Leasing:
    subject: Subject
    manager: LeaseManager
    renewer: str
    lost: list[tuple[Lease, str]] = field(default_factory=list)

    def receive(self, n: int = 1, visibility: float = 4.0) -> list[Any]:
        got: list[Any] = []
        for _ in range(50):
            got += self.subject.backend.receive(
                max_messages=n - len(got), wait_seconds=1, visibility_timeout=visibility
            )
            if len(got) == n:
                return got
        raise AssertionError(f"received {len(got)} of {n}")


@pytest.fixture
def renewer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local services' dummy credentials, where a renewer process finds them."""
    for name, value in CHILD_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MNS_ACCESS_KEY_ID", MNS_ACCESS_ID)
    monkeypatch.setenv("MNS_ACCESS_KEY_SECRET", MNS_ACCESS_KEY)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY)
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_SAS_TOKEN", raising=False)


@pytest.fixture
def queue_url(moto_endpoint: str, renewer_env: None) -> Iterator[str]:
    """A fresh SQS queue on moto (30 s visibility timeout), deleted afterwards."""
    admin = make_client(moto_endpoint)
    url: str = admin.create_queue(
        QueueName=f"renewer-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "30"}
    )["QueueUrl"]
    yield url
    admin.delete_queue(QueueUrl=url)


@pytest.fixture(params=[(s, r) for s in CLOUD for r in RENEWERS], ids=lambda p: f"{p[0]}-{p[1]}")
def leasing(request: pytest.FixtureRequest, renewer_env: None) -> Iterator[Leasing]:
    name, renewer = request.param
    with made_subject(name, request) as made:
        subject = made
        if renewer == "process" and isinstance(made.backend, AzureQueueBackend):
            # The subject's client_factory (its fault transports) is code a renewer
            # process cannot call: such a backend renews in a thread. Leased in a
            # process, the queue is the same one without it.
            plain = AzureQueueBackend(made.backend.queue_client)
            subject = dataclasses.replace(made, backend=plain, faults=None)
            made.cleanup.append(plain.close)
        lost: list[tuple[Lease, str]] = []
        manager = LeaseManager(
            subject.backend,
            renewer=renewer,
            on_lost=lambda lease, reason: lost.append((lease, reason)),
            **TIMING,
        )
        try:
            yield Leasing(subject, manager, renewer, lost)
        finally:
            manager.close()
