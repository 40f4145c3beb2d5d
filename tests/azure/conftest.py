"""Azurite (the Azure Storage emulator) for the Azure backend's tests.

The session's one Azurite queue service (``azurite``, from tests/services.py:
a free 127.0.0.1 port, a temporary --location) and a fresh queue per test.
Azurite comes from ./node_modules (``make test`` installs it with npm); if it or
Node.js is missing the fixture fails - these tests are never skipped.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from azure.storage.queue import QueueClient

from leasekeeper.backends.azure import AzureQueueBackend


@pytest.fixture
def queue_name(azurite: str) -> Iterator[str]:
    """A fresh, empty queue for one test; deleted afterwards."""
    name = f"lk-{uuid.uuid4().hex[:20]}"
    admin = QueueClient.from_connection_string(azurite, name)
    admin.create_queue()
    yield name
    with contextlib.suppress(Exception):
        admin.delete_queue()
    admin.close()


@pytest.fixture
def queue_client(azurite: str, queue_name: str) -> Iterator[QueueClient]:
    client = QueueClient.from_connection_string(azurite, queue_name)
    yield client
    client.close()


@pytest.fixture
def backend(queue_client: QueueClient) -> Iterator[AzureQueueBackend]:
    made = AzureQueueBackend(queue_client)
    yield made
    made.close()


@pytest.fixture
def other_consumer(azurite: str, queue_name: str) -> Iterator[AzureQueueBackend]:
    """A second, independent consumer of the same queue (its own client)."""
    client = QueueClient.from_connection_string(azurite, queue_name)
    made = AzureQueueBackend(client)
    yield made
    made.close()
    client.close()
