"""Fixtures for the SQS backend tests: a moto server, clients and throw-away queues.

moto runs as a ``python -m moto.server`` **subprocess** on 127.0.0.1 and a free
port, started once per session: a separate process, as the real service is, so
the server's request handling never competes with the lease scheduler for this
process's GIL. If it cannot start, every test that needs it fails (never skips).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config

REGION = "us-east-1"
# Environment for processes (worker scripts) that talk to the moto server.
CHILD_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}
_STARTUP_TIMEOUT = 30.0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def make_client(endpoint: str, **config: Any) -> Any:
    """A real boto3 SQS client on the moto server, with dummy credentials."""
    settings: dict[str, Any] = {
        "retries": {"max_attempts": 2, "mode": "standard"},
        "connect_timeout": 2,
        "read_timeout": 30,
    }
    settings.update(config)
    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        config=Config(**settings),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def count_calls(client: Any) -> Counter[str]:
    """Count the client's API calls by operation name (through boto3's event hooks)."""
    calls: Counter[str] = Counter()

    def before_call(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    client.meta.events.register("before-call.sqs.*", before_call)
    return calls


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    log_path = Path(tmp_path_factory.mktemp("moto")) / "moto_server.log"
    env = {**os.environ, **CHILD_ENV}
    with log_path.open("wb") as log_file:
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
            )
        except OSError as exc:
            pytest.fail(f"could not start moto's server: {exc}")
    endpoint = f"http://127.0.0.1:{port}"
    probe = make_client(endpoint, retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2)
    deadline = time.monotonic() + _STARTUP_TIMEOUT
    last_error: Exception | None = None
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"moto's server exited with {proc.returncode} before answering:\n"
                    + log_path.read_text(errors="replace")[-4000:]
                )
            try:
                probe.list_queues()
                break
            except Exception as exc:
                last_error = exc
            if time.monotonic() > deadline:
                pytest.fail(
                    f"moto's server did not answer on {endpoint} within {_STARTUP_TIMEOUT:g}s "
                    f"(last error: {last_error!r}):\n"
                    + log_path.read_text(errors="replace")[-4000:]
                )
            time.sleep(0.05)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


@pytest.fixture
def sqs_client(moto_endpoint: str) -> Any:
    return make_client(moto_endpoint)


@pytest.fixture
def make_queue(moto_endpoint: str) -> Iterator[Callable[..., str]]:
    """``make_queue(visibility_timeout=2, fifo=False) -> queue URL``; deleted afterwards."""
    admin = make_client(moto_endpoint)
    made: list[str] = []

    def make(visibility_timeout: int = 2, *, fifo: bool = False) -> str:
        name = f"lk-{uuid.uuid4().hex[:12]}"
        attributes = {"VisibilityTimeout": str(visibility_timeout)}
        if fifo:
            name += ".fifo"
            attributes["FifoQueue"] = "true"
            attributes["ContentBasedDeduplication"] = "true"
        url: str = admin.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        made.append(url)
        return url

    yield make
    for url in made:
        # The server may be gone at the very end; nothing outlives it.
        with contextlib.suppress(Exception):
            admin.delete_queue(QueueUrl=url)
