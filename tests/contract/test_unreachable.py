"""A service that cannot be reached, on every backend: the error names the endpoint
(host and port) and never a credential; it is retryable; and a worker's run, or the
``leasekeeper worker`` command, ends within a bounded time when the queue never
answered (docs/guide.md, "When a service cannot be reached").

Each backend is built on its real SDK, aimed at a port of this machine on which
nothing listens: the connection is refused, as with a typo in a port or an emulator
not started.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import leasekeeper
from leasekeeper import ReceiveError
from tests.azure.settings import KEY as AZURITE_KEY
from tests.azure.settings import connection_string
from tests.services import CHILD_ENV, free_port

#: Secrets each backend is given: none may appear in an error.
SQS_SECRET = "not-a-real-secret-but-a-secret"
MNS_SECRET = "mns-key-secret-do-not-show"
REDIS_PASSWORD = "redis-pass-do-not-show"


def sqs(port: int) -> Any:
    return leasekeeper.connect(
        f"http://127.0.0.1:{port}/000000000000/jobs",
        region="us-east-1",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key=SQS_SECRET,
    )


def mns(port: int) -> Any:
    from mns.account import Account

    from leasekeeper.backends.mns import MNSBackend

    queue = Account(f"http://127.0.0.1:{port}", "test-id", MNS_SECRET).get_queue("jobs")
    return MNSBackend(queue, queue_visibility_timeout=30)


def azure(port: int) -> Any:
    from azure.storage.queue import QueueClient

    from leasekeeper.backends.azure import AzureQueueBackend

    return AzureQueueBackend(QueueClient.from_connection_string(connection_string(port), "jobs"))


def redis(port: int) -> Any:
    return leasekeeper.connect(f"redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/0?stream=jobs")


BACKENDS: dict[str, Callable[[int], Any]] = {"sqs": sqs, "mns": mns, "azure": azure, "redis": redis}
SECRETS = (SQS_SECRET, MNS_SECRET, AZURITE_KEY, REDIS_PASSWORD)


@pytest.mark.parametrize("service", list(BACKENDS))
def test_the_error_names_the_endpoint_and_no_credential(service: str) -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ReceiveError) as raised:  # Redis: at connect, the others' receive
        backend = BACKENDS[service](port)
        backend.receive(max_messages=1, wait_seconds=0)
    error = raised.value
    assert error.retryable
    assert f"could not reach 127.0.0.1:{port} (" in str(error), str(error)
    assert not any(secret in str(error) for secret in SECRETS)
    # One attempt, not the SDK's retries (Azure's waited a minute and a half).
    assert time.monotonic() - started < 15


def command_for(service: str, port: int) -> tuple[list[str], dict[str, str]]:
    """``leasekeeper worker`` on ``service`` at ``port``, and its environment."""
    env = {**CHILD_ENV, "AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": SQS_SECRET}
    env["AWS_REGION"] = "us-east-1"
    queue = {
        "sqs": ["--sqs", f"http://127.0.0.1:{port}/000000000000/jobs"],
        "sqs-by-name": ["--queue", "sqs://jobs", "--endpoint-url", f"http://127.0.0.1:{port}"],
        "mns": ["--mns", f"http://127.0.0.1:{port}", "jobs"],
        "azure": ["--azure", "jobs"],
        "redis": ["--queue", f"redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/0?stream=jobs"],
    }[service]
    env["MNS_ACCESS_KEY_ID"], env["MNS_ACCESS_KEY_SECRET"] = "test-id", MNS_SECRET
    env["AZURE_STORAGE_CONNECTION_STRING"] = connection_string(port)
    return queue, env


@pytest.mark.parametrize("service", ["sqs", "sqs-by-name", "mns", "azure", "redis"])
def test_the_command_ends_non_zero_in_bounded_time_naming_host_and_port(
    service: str, tmp_path: Path
) -> None:
    """The issue's check: ``--until-idle 3`` on an endpoint nobody listens on ends
    non-zero within 45 s, naming host:port (it retried for ever on ``--sqs``)."""
    (tmp_path / "jobs.py").write_text("def handle(message):\n    pass\n")
    port = free_port()
    queue, env = command_for(service, port)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "leasekeeper", "worker", "jobs:handle", *queue, "--until-idle", "3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    took = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    assert took < 45
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("leasekeeper worker: error: cannot reach the queue "), last
    assert f"could not reach 127.0.0.1:{port} (" in last and "(tried for 3s)" in last
    assert not any(secret in result.stderr for secret in SECRETS)


def receive_at_module_level(backend: Any) -> Any:
    return leasekeeper.receive(backend, max_messages=1, wait_seconds=0)


def receive_from_a_manager(backend: Any) -> Any:
    with leasekeeper.LeaseManager(backend, renewer="thread") as manager:
        return manager.receive(max_messages=1, wait_seconds=0)


def receive_in_asyncio(backend: Any) -> Any:
    import asyncio

    from leasekeeper import aio

    async def main() -> Any:
        with leasekeeper.LeaseManager(backend, renewer="thread") as manager:
            return await aio.receive(manager, max_messages=1, wait_seconds=0)

    return asyncio.run(main())


ONE_CALL_RECEIVES: dict[str, Callable[[Any], Any]] = {
    "leasekeeper.receive": receive_at_module_level,
    "LeaseManager.receive": receive_from_a_manager,
    "aio.receive": receive_in_asyncio,
}


@pytest.mark.parametrize("form", list(ONE_CALL_RECEIVES))
@pytest.mark.parametrize("service", list(BACKENDS))
def test_a_one_call_receive_raises_at_once_naming_the_endpoint(service: str, form: str) -> None:
    """The receives a program calls itself make one attempt and raise: the program
    decides whether to try again (docs/guide.md, "When a service cannot be reached")."""
    port = free_port()
    started = time.monotonic()
    with pytest.raises(ReceiveError) as raised:  # Redis: at connect
        ONE_CALL_RECEIVES[form](BACKENDS[service](port))
    assert raised.value.retryable
    assert f"could not reach 127.0.0.1:{port} (" in str(raised.value), str(raised.value)
    assert not any(secret in str(raised.value) for secret in SECRETS)
    assert time.monotonic() - started < 15
