"""The configuration matrix: every way users build a queue, against every renewer
and every entry point - not every cell, but every row and every column.

Rows (how the queue is built): a boto3 client with ``endpoint_url`` in code, keys
in code (none in the environment), keys from the environment, a profile of a
shared config file (chosen in code; or by AWS_PROFILE, its ``endpoint_url`` the
config file's), ``AWS_ENDPOINT_URL``, ``AWS_ENDPOINT_URL_SQS`` (over a wrong
``AWS_ENDPOINT_URL``), a proxy in front of the endpoint (the client talks to the
proxy, the queue URL names moto's host), a LocalStack-style URL (a host that does
not resolve: the calls go to the endpoint), a URL with no endpoint configured
anywhere (its own origin), and ``sqs://name``. Columns: ``LeaseManager.receive``,
``Worker``, ``AsyncWorker``, ``leasekeeper worker`` and Spark ``drain`` (local[2]);
and ``renewer="thread"``, ``"process"``, ``"auto"``.

In each cell a 3 s job at a 2 s visibility timeout runs once, the queue ends
empty, and the renewer that ran it is the one expected. Each cell is a process of
its own (tests/sqs/configuration_cell.py), with the environment the row gives it,
so the cells run side by side on the one moto server. MNS (the local server) and
Azure (Azurite) with credentials given in code run in this process.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.services import CHILD_ENV, REGION, make_client
from tests.sqs.configuration_cell import TIMING
from tests.sqs.fault_proxy import FaultProxyProcess

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
ACCOUNT = "123456789012"  # moto's
KEYS = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
ENV_KEYS = {k: v for k, v in CHILD_ENV.items() if k.startswith("AWS_") and "KEY" in k}
DEAD_ENDPOINT = "http://127.0.0.1:9"  # nothing listens: a call sent there fails
CELL_TIMEOUT = 180.0
SPARK_TIMEOUT = 400.0
SIDE_BY_SIDE = 6  # cells at once (each a process, and most a renewer process too)


@dataclass(frozen=True)
class Cell:
    row: str
    entry: str  # receive, worker, async, command, spark
    renewer: str  # thread, process, auto
    expected: str  # the renewer that runs it

    @property
    def name(self) -> str:
        return f"{self.row}-{self.entry}-{self.renewer}"


# Pairwise: every row, every entry point and every renewer at least once.
CELLS = [
    Cell("endpoint_in_code", "worker", "auto", "process"),
    Cell("keys_in_code", "async", "auto", "process"),
    Cell("keys_in_code", "receive", "process", "process"),
    Cell("keys_from_env", "receive", "thread", "thread"),
    Cell("profile_in_code", "worker", "process", "process"),
    Cell("profile_from_env", "command", "auto", "process"),
    Cell("aws_endpoint_url", "command", "thread", "thread"),
    Cell("aws_endpoint_url_sqs", "receive", "auto", "process"),
    Cell("proxy", "worker", "auto", "process"),
    Cell("proxy", "spark", "process", "process"),
    Cell("localstack_url", "command", "auto", "process"),
    Cell("localstack_url", "async", "thread", "thread"),
    Cell("no_endpoint", "command", "process", "process"),
    Cell("no_endpoint", "spark", "thread", "thread"),
    Cell("sqs_name", "worker", "thread", "thread"),
    Cell("sqs_name", "async", "process", "process"),
]


@dataclass
class Outcome:
    renewer: str
    runs: int
    left: tuple[int, int]  # visible, in flight
    proxied: int = 0  # visibility changes the cell's proxy forwarded
    output: str = ""


@dataclass
class Matrix:
    moto: str
    tmp: Path
    runs: Path
    environment: dict[str, str]  # os.environ as the main thread saw it
    admin: Any  # a boto3 client on moto, shared by the pool's threads
    results: dict[str, Future[Outcome]] = field(default_factory=dict)


def base_env(environment: dict[str, str], tmp: Path, runs: Path) -> dict[str, str]:
    """``environment`` without any AWS setting of the machine's (files included)."""
    env = {k: v for k, v in environment.items() if not k.startswith("AWS_")}
    env.update(
        PYTHONPATH=str(REPO),
        AWS_EC2_METADATA_DISABLED="true",
        AWS_CONFIG_FILE=str(tmp / "no-config"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp / "no-credentials"),
        MATRIX_RUNS=str(runs),
        LEASEKEEPER_RENEWER_LOG="WARNING",
    )
    return env


def write_profile(tmp: Path, moto: str) -> dict[str, str]:
    """A profile "matrix" in a shared config file (region, endpoint_url) and a
    credentials file (keys), in ``tmp``: the variables that point at them."""
    (tmp / "config").write_text(f"[profile matrix]\nregion = {REGION}\nendpoint_url = {moto}\n")
    (tmp / "credentials").write_text(
        "[matrix]\naws_access_key_id = testing\naws_secret_access_key = testing\n"
    )
    return {
        "AWS_CONFIG_FILE": str(tmp / "config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp / "credentials"),
    }


def arrange(
    cell: Cell, admin: Any, moto: str, tmp: Path, proxy: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """(what the cell runner builds, the environment it runs in) for ``cell``; the
    queue is made here (through ``admin``), with the cell's name as its one message."""
    queue = f"m-{cell.name.replace('_', '-')}-{uuid.uuid4().hex[:6]}"
    url: str = admin.create_queue(QueueName=queue, Attributes={"VisibilityTimeout": "2"})[
        "QueueUrl"
    ]
    admin.send_message(QueueUrl=url, MessageBody=cell.name)
    region = {"AWS_REGION": REGION}
    env: dict[str, str] = {}
    spec: dict[str, Any] = {"build": "connect", "url": url, "admin_url": url}
    client = {"endpoint_url": moto, "region_name": REGION}
    if cell.row == "endpoint_in_code":
        env = {**ENV_KEYS, **region}
        spec.update(build="client", client=client)
    elif cell.row == "keys_in_code":
        spec.update(build="client", client={**client, **KEYS})
    elif cell.row == "keys_from_env":
        env = {**ENV_KEYS, "AWS_DEFAULT_REGION": REGION}
        spec.update(build="client", client={"endpoint_url": moto})
    elif cell.row == "profile_in_code":
        env = write_profile(tmp, moto)
        spec.update(build="profile", profile="matrix")
    elif cell.row == "profile_from_env":
        env = {**write_profile(tmp, moto), "AWS_PROFILE": "matrix"}
    elif cell.row == "aws_endpoint_url":
        env = {**ENV_KEYS, **region, "AWS_ENDPOINT_URL": moto}
    elif cell.row == "aws_endpoint_url_sqs":
        env = {
            **ENV_KEYS,
            **region,
            "AWS_ENDPOINT_URL": DEAD_ENDPOINT,
            "AWS_ENDPOINT_URL_SQS": moto,
        }
    elif cell.row == "proxy":  # the client talks to the proxy; the URL names moto
        env = {**ENV_KEYS, **region}
        spec.update(build="client", client={"endpoint_url": proxy, "region_name": REGION})
    elif cell.row == "localstack_url":
        env = {**ENV_KEYS, **region, "AWS_ENDPOINT_URL": moto}
        spec["url"] = f"http://sqs.{REGION}.localhost.localstack.cloud:4566/{ACCOUNT}/{queue}"
    elif cell.row == "no_endpoint":
        env = {**ENV_KEYS, **region}
    elif cell.row == "sqs_name":
        env = {**ENV_KEYS, **region, "AWS_ENDPOINT_URL": moto}
        spec["url"] = f"sqs://{queue}"
    else:
        raise AssertionError(cell.row)
    spec.update(entry=cell.entry, renewer=cell.renewer)
    return spec, env


def run_cells(cells: list[Cell], found: Matrix) -> list[Outcome]:
    """Run ``cells`` in one process (one Spark session for the Spark cells; else
    one cell): a proxy for each proxy row, its counts read after.

    This runs in a pool thread while pytest goes on in the main one, setting and
    deleting PYTEST_CURRENT_TEST: nothing here may iterate ``os.environ`` (a key
    deleted meanwhile is a KeyError), so the environment is the fixture's snapshot
    and the one admin client was built in the main thread (building a boto3
    client reads every variable for proxies)."""
    moto, tmp, runs, admin = found.moto, found.tmp, found.runs, found.admin
    with contextlib.ExitStack() as stack:
        proxies = [
            stack.enter_context(FaultProxyProcess(moto, error_rate=0.0))
            if cell.row == "proxy"
            else _no_proxy()
            for cell in cells
        ]
        arranged = []
        for cell, proxy in zip(cells, proxies, strict=True):
            own = tmp / cell.name
            own.mkdir()
            arranged.append((*arrange(cell, admin, moto, own, proxy.url), own))
        env = {**base_env(found.environment, arranged[0][2], runs), **arranged[0][1]}
        output = _run(cells[0], [spec for spec, _, _ in arranged], env, arranged[0][2])
        proxied = [p.stats()["forwarded"].get("ChangeMessageVisibilityBatch", 0) for p in proxies]
    outcomes = []
    for index, (cell, (spec, _, _)) in enumerate(zip(cells, arranged, strict=True)):
        attributes = admin.get_queue_attributes(QueueUrl=spec["admin_url"], AttributeNames=["All"])[
            "Attributes"
        ]
        left = (
            int(attributes["ApproximateNumberOfMessages"]),
            int(attributes["ApproximateNumberOfMessagesNotVisible"]),
        )
        ran = runs.read_text().splitlines().count(cell.name) if runs.exists() else 0
        renewer = _renewer_of(cell, output, index)
        outcomes.append(Outcome(renewer, ran, left, proxied[index], output))
    return outcomes


class _no_proxy:
    url = ""

    def stats(self) -> dict[str, Any]:
        return {"forwarded": {}}


def _run(cell: Cell, specs: list[dict[str, Any]], env: dict[str, str], tmp: Path) -> str:
    spec = specs[0]
    if cell.entry == "command":
        flag = "--sqs" if spec["url"].startswith("http") else "--queue"
        args = [flag, spec["url"], "--until-idle", "2", "--status-every", "0"]
        args += ["--visibility-timeout", "2", "--timer-interval", "0.2", "--minimal-life", "0.5"]
        args += [] if cell.renewer == "auto" else ["--renewer", cell.renewer]
        command = [sys.executable, "-m", "leasekeeper", "worker"]
        command += ["tests.sqs.configuration_cell:handle", *args]
    else:
        if cell.entry == "spark":
            cells = [{**one, "output": str(tmp / f"{n}.out")} for n, one in enumerate(specs)]
            spec = {"entry": "spark", "cells": cells}
            env = {**env, **_spark_env()}
        command = [sys.executable, "-m", "tests.sqs.configuration_cell", json.dumps(spec)]
    done = subprocess.run(
        command,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=SPARK_TIMEOUT if cell.entry == "spark" else CELL_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"{cell.name}: exit {done.returncode}\n{done.stderr[-3000:]}"
    return done.stdout + "\n" + done.stderr


def _spark_env() -> dict[str, str]:
    from tests import toolchain

    home = toolchain.java_home()
    env = {"PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    return {**env, "JAVA_HOME": str(home)} if home is not None else env


def _renewer_of(cell: Cell, output: str, index: int) -> str:
    if cell.entry == "command":  # "Worker running ... renewer process" (INFO, stderr)
        said = [line for line in output.splitlines() if " running " in line and "renewer" in line]
        return said[0].rsplit("renewer ", 1)[1].strip() if said else "?"
    last = [line for line in output.splitlines() if line.startswith(("{", "[{"))][-1]
    answer = json.loads(last)
    return str((answer[index] if isinstance(answer, list) else answer)["renewer"])


@pytest.fixture(scope="module")
def matrix(
    moto_endpoint: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Matrix]:
    """Every selected cell started at once (SIDE_BY_SIDE at a time, Spark's first),
    each test waiting for its own."""
    tmp = tmp_path_factory.mktemp("configurations")
    found = Matrix(moto_endpoint, tmp, tmp / "runs", dict(os.environ), make_client(moto_endpoint))
    selected = {item.name for item in request.session.items}
    chosen = [c for c in CELLS if f"{RUN_CELL}[{c.name}]" in selected]
    # The Spark cells share one session (their rows give the same environment), the
    # thread renewer's first: a renewer process, once started, stays beside the
    # executor's Python worker for the session.
    spark = sorted((c for c in chosen if c.entry == "spark"), key=lambda c: c.renewer != "thread")
    batches = [spark] + [[c] for c in chosen if c.entry != "spark"]
    with ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        for batch in filter(None, batches):
            ran = pool.submit(run_cells, batch, found)
            for index, cell in enumerate(batch):
                found.results[cell.name] = _nth(ran, index)
        yield found


def _nth(batch: Future[list[Outcome]], index: int) -> Future[Outcome]:
    one: Future[Outcome] = Future()

    def done(ran: Future[list[Outcome]]) -> None:
        error = ran.exception()
        if error is not None:
            one.set_exception(error)
        else:
            one.set_result(ran.result()[index])

    batch.add_done_callback(done)
    return one


def test_every_row_column_and_renewer_is_covered() -> None:
    rows = {
        "endpoint_in_code",
        "keys_in_code",
        "keys_from_env",
        "profile_in_code",
        "profile_from_env",
        "aws_endpoint_url",
        "aws_endpoint_url_sqs",
        "proxy",
        "localstack_url",
        "no_endpoint",
        "sqs_name",
    }
    assert {c.row for c in CELLS} == rows
    assert {c.entry for c in CELLS} == {"receive", "worker", "async", "command", "spark"}
    assert {c.renewer for c in CELLS} == {"thread", "process", "auto"}


RUN_CELL = "test_a_long_job_runs_once_on_the_expected_renewer"


@pytest.mark.parametrize("cell", CELLS, ids=[c.name for c in CELLS])
def test_a_long_job_runs_once_on_the_expected_renewer(cell: Cell, matrix: Matrix) -> None:
    outcome = matrix.results[cell.name].result(timeout=SPARK_TIMEOUT + CELL_TIMEOUT)
    assert outcome.runs == 1, outcome.output[-3000:]
    assert outcome.left == (0, 0), outcome.output[-3000:]
    assert outcome.renewer == cell.expected, outcome.output[-3000:]
    assert "could not start" not in outcome.output, outcome.output[-3000:]
    if cell.row == "proxy" and cell.expected == "process":
        # The renewals went to the client's endpoint (the proxy), not the URL's host.
        assert outcome.proxied >= 1, outcome


@pytest.mark.parametrize("service", ["mns", "azure"])
def test_mns_and_azure_with_credentials_in_code_renew_in_the_renewer_process(
    service: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local MNS server and Azurite, their keys given in code only: the default
    worker renews in the renewer process, which is sent them; a 3 s job at a 2 s
    visibility timeout runs once and the queue ends empty."""
    from leasekeeper import Worker

    for variable in (
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "MNS_ACCESS_KEY_ID",
        "MNS_ACCESS_KEY_SECRET",
    ):
        monkeypatch.delenv(variable, raising=False)
    name = f"m-{service}-{uuid.uuid4().hex[:10]}"
    backend: Any
    if service == "mns":
        from leasekeeper.backends.mns import MNSBackend
        from tests.services import sdk_queue

        server = request.getfixturevalue("mns_server")
        server.create_queue(name, visibility_timeout=2)
        backend = MNSBackend(sdk_queue(server, name))
    else:
        from azure.storage.queue import QueueClient

        from leasekeeper.backends.azure import AzureQueueBackend

        client = QueueClient.from_connection_string(request.getfixturevalue("azurite"), name)
        client.create_queue()
        backend = AzureQueueBackend(client)
    backend.send("job")
    runs: list[str] = []

    def job(message: Any) -> None:
        runs.append(message.id)
        time.sleep(3.0)

    worker = Worker(backend, job, concurrency=2, wait_seconds=1, **TIMING)
    assert worker.manager.renewer.name == "process"
    stats = worker.run(until_idle=1.5)
    assert (len(runs), stats.completed, stats.lost) == (1, 1, 0)
    assert backend.receive(max_messages=10, wait_seconds=1, visibility_timeout=5) == []


def test_a_spec_carries_the_client_s_settings_and_none_of_its_secrets() -> None:
    """What the renewer process and Spark executors rebuild: the client's endpoint,
    region, retries, timeouts, pool and proxies. The keys and the proxy's password
    are in no spec, repr or pickle that can travel - only in the renewer process's
    own spec, which shows their names alone."""
    import pickle

    import boto3
    from botocore.config import Config

    from leasekeeper.backends.spec import PrivateSpec, renewal_spec, spec_of
    from leasekeeper.backends.sqs import SQSBackend

    client = boto3.client(
        "sqs",
        endpoint_url="http://proxy.example:8080",
        region_name="eu-west-3",
        aws_access_key_id="AKIDSECRETKEYID",
        aws_secret_access_key="very-secret",
        aws_session_token="session-secret",
        config=Config(
            retries={"mode": "adaptive", "max_attempts": 6},
            connect_timeout=3,
            read_timeout=25,
            max_pool_connections=40,
            proxies={"https": "http://user:proxy-secret@squid:3128"},
        ),
    )
    backend = SQSBackend(client, f"http://sqs.example:9324/{ACCOUNT}/jobs")
    spec = spec_of(backend)
    assert dict(spec.options) == {
        "connect_timeout": 3,
        "endpoint_url": "http://proxy.example:8080",
        "https_proxy": "http://user@squid:3128",
        "max_attempts": 7,
        "max_pool_connections": 40,
        "read_timeout": 25,
        "region": "eu-west-3",
        "retry_mode": "adaptive",
    }
    private = renewal_spec(backend)
    assert isinstance(private, PrivateSpec)
    for shown in (repr(spec), str(spec), pickle.dumps(spec), repr(private)):
        text = shown.decode("latin-1") if isinstance(shown, bytes) else shown
        for secret in ("AKIDSECRETKEYID", "very-secret", "session-secret", "proxy-secret"):
            assert secret not in text
    rebuilt = private.build().client  # type: ignore[attr-defined]
    assert rebuilt.meta.endpoint_url == "http://proxy.example:8080"
    assert rebuilt.meta.config.proxies == {"https": "http://user:proxy-secret@squid:3128"}
    assert rebuilt.meta.config.retries == {"mode": "adaptive", "total_max_attempts": 7}
    assert rebuilt.meta.config.max_pool_connections == 40
    frozen = rebuilt._request_signer._credentials.get_frozen_credentials()
    assert (frozen.access_key, frozen.token) == ("AKIDSECRETKEYID", "session-secret")
