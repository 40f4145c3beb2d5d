"""Queues by URL: ``leasekeeper.connect`` and the ``leasekeeper.backends`` entry points.

Every built-in scheme against its local service; the errors a wrong URL gets;
where an SQS client takes its region from; and a third party's scheme, declared by
a package's entry point (a dist-info put on ``sys.path``: what ``pip install``
leaves behind), working through ``connect``, through ``spec().build()`` in another
process, and under the process renewer - with no code of it in leasekeeper.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import leasekeeper
from leasekeeper import Backend, ConfigError, LeaseManager, LeaseState, Worker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.backends.registry import ENTRY_POINT_GROUP, URLSpec, installed_schemes
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.backends.urls import OWN_SCHEMES
from tests.azure.settings import ACCOUNT
from tests.plugin import write_plugin
from tests.renewer.test_process import alive
from tests.services import MNSServer, make_client

REPO = Path(__file__).resolve().parents[2]


def round_trip(backend: Backend, body: str) -> None:
    """Send ``body`` through ``backend``, receive it back, delete it."""
    backend.send(body)  # type: ignore[attr-defined]
    got: list[leasekeeper.Message] = []
    for _ in range(20):
        got = backend.receive(wait_seconds=1, visibility_timeout=30)
        if got:
            break
    [message] = got
    assert message.body == body and message.backend is backend
    assert backend.delete([message.handle])[0].kind == "ok"


# ---------------------------------------------------------------- the built-in schemes


def _sqs_by_url(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    endpoint: str = request.getfixturevalue("moto_endpoint")
    url = make_client(endpoint).create_queue(QueueName=f"connect-{uuid.uuid4().hex[:8]}")
    return url["QueueUrl"], {"endpoint_url": endpoint}


def _sqs_by_name(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    endpoint: str = request.getfixturevalue("moto_endpoint")
    name = f"connect-{uuid.uuid4().hex[:8]}"
    make_client(endpoint).create_queue(QueueName=name)
    request.getfixturevalue("monkeypatch").setenv("AWS_ENDPOINT_URL", endpoint)
    return f"sqs://{name}", {}


def _mns(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    server: MNSServer = request.getfixturevalue("mns_server")
    name = f"connect-{uuid.uuid4().hex[:8]}"
    server.create_queue(name)
    return f"mns://127.0.0.1:{server.port}/{name}?secure=false", {}


def _azure(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    from azure.storage.queue import QueueClient

    conn: str = request.getfixturevalue("azurite")
    name = f"connect-{uuid.uuid4().hex[:8]}"
    QueueClient.from_connection_string(conn, name).create_queue()
    # the connection string in the environment names the account of the URL
    request.getfixturevalue("monkeypatch").setenv("AZURE_STORAGE_CONNECTION_STRING", conn)
    return f"azure://{ACCOUNT}/{name}", {}


def _redis(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    url: str = request.getfixturevalue("redis_url")
    return f"{url}?stream=connect-{uuid.uuid4().hex[:8]}&group=g", {"visibility_timeout": 30}


def _memory(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return f"memory://connect-{uuid.uuid4().hex[:8]}", {}


SCHEMES: dict[str, Callable[[pytest.FixtureRequest], tuple[str, dict[str, Any]]]] = {
    "sqs-https": _sqs_by_url,
    "sqs-name": _sqs_by_name,
    "mns": _mns,
    "azure": _azure,
    "redis": _redis,
    "memory": _memory,
}


@pytest.mark.usefixtures("service_env")
@pytest.mark.parametrize("scheme", list(SCHEMES))
def test_each_built_in_scheme_through_connect(scheme: str, request: pytest.FixtureRequest) -> None:
    url, options = SCHEMES[scheme](request)
    backend = leasekeeper.connect(url, **options)
    round_trip(backend, f"by {scheme}")
    if isinstance(backend, MemoryQueue):  # one queue a name, in this process only
        assert leasekeeper.connect(url) is backend
        with pytest.raises(leasekeeper.ConfigError, match="cannot be rebuilt"):
            backend.spec()
        return
    spec = backend.spec()  # type: ignore[attr-defined]
    assert spec == URLSpec.of(url, options)  # connect remembered the URL
    round_trip(pickle.loads(pickle.dumps(spec)).build(), "rebuilt")


def test_leasekeepers_own_schemes_are_entry_points() -> None:
    schemes = installed_schemes()
    for scheme in ("mns", "azure", "memory", "redis"):
        assert schemes[scheme].value.startswith("leasekeeper.backends.schemes:"), scheme
    # SQS's factory is its package's own, as a plug-in backend's is
    for scheme in ("sqs", "https", "http"):
        assert schemes[scheme].value == "leasekeeper.backends.sqs.scheme:sqs", scheme
    # What counts where the metadata is missing (a vendored copy) is what the
    # installed package declares, scheme for scheme.
    from importlib.metadata import distribution

    declared = {
        entry.name: entry.value
        for entry in distribution("leasekeeper").entry_points
        if entry.group == ENTRY_POINT_GROUP
    }
    assert declared == dict(OWN_SCHEMES)


# ---------------------------------------------------------------- wrong URLs


@pytest.mark.parametrize(
    ("url", "match"),
    [
        ("no scheme here", "'no scheme here' is not a queue URL"),
        ("ftp://host/q", r"'ftp'.*installed schemes: .*azure.*memory.*redis.*sqs"),
        ("https://example.com/jobs", "not an SQS queue URL: http.s.://host.*<account>/<name>"),
        ("sqs://", "sqs://<queue name>"),
        ("https://sqs.eu-west-1.amazonaws.com/jobs", "<account>/<name>"),
        ("mns://host.example", "mns://<endpoint-host>/<queue>"),
        ("azure://account", "azure://<account>/<queue>"),
        ("memory://", "memory://<name>"),
        ("redis://localhost:6379/0", "names no stream"),
        ("redis://localhost:notaport/0?stream=s", "is not a queue URL"),
    ],
)
def test_a_wrong_url_is_a_value_error_naming_it(url: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        leasekeeper.connect(url)


@pytest.mark.parametrize(
    "url",
    [
        "sqs://AKIDEXAMPLE:s3cr3t-key@jobs",
        "mns://id:s3cr3t-key@host.example/jobs",
        "azure://acct:s3cr3t-key@acct/jobs",
    ],
)
def test_credentials_in_a_cloud_url_are_refused_unquoted(url: str) -> None:
    with pytest.raises(ValueError, match="credentials do not go in") as raised:
        leasekeeper.connect(url)
    assert "s3cr3t-key" not in str(raised.value)


def test_a_redis_password_stays_out_of_specs_reprs_and_logs(
    redis_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    import redis

    admin = redis.Redis.from_url(redis_url)
    admin.config_set("requirepass", "s3cr3t-pw")
    try:
        caplog.set_level(logging.DEBUG)
        authed = redis_url.replace("redis://", "redis://:s3cr3t-pw@")
        backend = leasekeeper.connect(f"{authed}?stream=pw-{uuid.uuid4().hex[:8]}")
        round_trip(backend, "with a password")
        spec = backend.spec()  # type: ignore[attr-defined]
        shown = repr(spec) + repr(backend) + caplog.text
        assert "s3cr3t-pw" not in shown and b"s3cr3t-pw" not in pickle.dumps(spec)
        # another process takes the password from its environment
        monkeypatch.setenv("REDIS_PASSWORD", "s3cr3t-pw")
        round_trip(spec.build(), "rebuilt with the environment's password")
    finally:
        redis.Redis.from_url(redis_url, password="s3cr3t-pw").config_set("requirepass", "")
        admin.close()


# ---------------------------------------------------------------- SQS regions and endpoints

AWS_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs"


@pytest.mark.parametrize(
    ("url", "options", "env", "region"),
    [
        (AWS_URL, {"region": "ap-south-1"}, {"AWS_REGION": "us-west-2"}, "ap-south-1"),
        (AWS_URL, {}, {"AWS_REGION": "us-west-2"}, "eu-west-1"),  # the URL's own
        ("http://127.0.0.1:1/1/q", {"endpoint_url": "http://127.0.0.1:1"}, {}, "us-east-1"),
        (
            "http://127.0.0.1:1/1/q",
            {},
            {"AWS_ENDPOINT_URL": "http://127.0.0.1:1", "AWS_REGION": "us-west-2"},
            "us-west-2",
        ),
        (
            "http://127.0.0.1:1/1/q",
            {"endpoint_url": "http://127.0.0.1:1"},
            {"AWS_DEFAULT_REGION": "ca-central-1"},
            "ca-central-1",
        ),
    ],
)
def test_where_an_sqs_client_takes_its_region_and_endpoint(
    url: str,
    options: dict[str, Any],
    env: dict[str, str],
    region: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # the SDK's configuration
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    backend = leasekeeper.connect(url, **options)
    assert isinstance(backend, SQSBackend) and backend.queue_url == url
    assert backend.client.meta.region_name == region
    endpoint = options.get("endpoint_url") or env.get("AWS_ENDPOINT_URL")
    if endpoint:
        assert backend.client.meta.endpoint_url == endpoint


def test_a_localstack_url_names_its_region_when_nothing_else_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """LocalStack 3 hands out ``sqs.<region>.localhost.localstack.cloud`` URLs: with
    the endpoint configured and no region anywhere, the URL's region is taken (it
    was a NoRegionError); the calls go to the endpoint, the URL is a parameter."""
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))  # no region there
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://localhost:4566")
    url = "http://sqs.eu-central-1.localhost.localstack.cloud:4566/000000000000/jobs"
    backend = leasekeeper.connect(url)
    assert isinstance(backend, SQSBackend) and backend.queue_url == url
    assert backend.client.meta.region_name == "eu-central-1"
    assert backend.client.meta.endpoint_url == "http://localhost:4566"
    monkeypatch.setenv("AWS_REGION", "us-west-2")  # a region given wins over the host's
    assert leasekeeper.connect(url).client.meta.region_name == "us-west-2"


# ---------------------------------------------------------------- a third party's scheme


@pytest.fixture
def plugin(tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The package ``relay_plugin`` as ``pip install`` leaves it (tests/plugin.py),
    on ``sys.path`` and on ``PYTHONPATH`` for the processes started meanwhile."""
    where = write_plugin(tmp_path)
    monkeypatch.syspath_prepend(str(where))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(where), str(REPO)]))
    monkeypatch.setenv("RELAY_REDIS_URL", redis_url)
    return where


def test_a_third_partys_scheme_through_connect_specs_and_the_process_renewer(
    plugin: Path,
) -> None:
    assert installed_schemes()["relay"].value == "relay_plugin:factory"
    stream = f"relay-{uuid.uuid4().hex[:8]}"
    backend = leasekeeper.connect(f"relay://{stream}", visibility_timeout=2)
    assert type(backend).__name__ == "RelayBackend"
    spec = backend.spec()  # type: ignore[attr-defined]
    assert spec == URLSpec(f"relay://{stream}", (("visibility_timeout", 2),))
    # another process builds it from the spec alone, and gets the message
    backend.send("to another process")  # type: ignore[attr-defined]
    code = (
        "import pickle, sys; backend = pickle.loads(sys.stdin.buffer.read()).build(); "
        "[m] = backend.receive(wait_seconds=5); print(type(backend).__name__, m.body); "
        "assert backend.delete([m.handle])[0].kind == 'ok'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=pickle.dumps(spec),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.stdout.decode().split() == ["RelayBackend", "to", "another", "process"], done
    # and the process renewer renews its leases there
    with LeaseManager(
        backend, renewer="process", visibility_timeout=2, timer_interval=0.25, minimal_life=0.5
    ) as manager:
        manager.stats()
        backend.send("renewed elsewhere")  # type: ignore[attr-defined]
        [message] = backend.receive(wait_seconds=5)
        lease = manager.register(message)
        other = leasekeeper.connect(f"relay://{stream}", consumer="other", visibility_timeout=2)
        for _ in range(5):  # two and a half timeouts
            assert other.receive(wait_seconds=1) == []
        assert lease.state is LeaseState.ACTIVE and lease.extensions >= 2
        lease.complete()


def test_a_renewer_that_cannot_build_what_this_process_could_says_why_before_any_receive(
    plugin: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A plug-in whose factory fails in the renewer process (its variable is gone from
    the environment the renewer inherits): ``renewer="process"`` raises ConfigError
    with the reason from the constructor - nothing received, nothing registered,
    nothing lost, and no other renewer started to fail again - while ``"auto"`` runs
    the same backend on the thread renewer."""
    stream = f"relay-{uuid.uuid4().hex[:8]}"
    backend = leasekeeper.connect(f"relay://{stream}", visibility_timeout=5)
    backend.send("left alone")  # type: ignore[attr-defined]
    monkeypatch.delenv("RELAY_REDIS_URL")
    with caplog.at_level(logging.ERROR, logger="leasekeeper"):
        with pytest.raises(ConfigError, match="could not start: KeyError: 'RELAY_REDIS_URL'"):
            LeaseManager(backend, renewer="process", visibility_timeout=5)
        with pytest.raises(ConfigError, match="RELAY_REDIS_URL"):
            Worker(backend, lambda message: None, renewer="process", visibility_timeout=5)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors and all("RELAY_REDIS_URL" in error for error in errors)
    ran: list[str] = []  # the message is there at once: nothing received it
    worker = Worker(backend, lambda message: ran.append(message.body), visibility_timeout=5)
    assert worker.manager.renewer.name == "thread"  # "auto": the thread renewer
    assert worker.run(until_idle=1).completed == 1
    assert ran == ["left alone"]


WORKER_KILLED_WHILE_ITS_RENEWER_BUILDS = """
import os, sys
import leasekeeper
from leasekeeper import LeaseManager

backend = leasekeeper.connect(sys.argv[1], visibility_timeout=30)
os.environ["RELAY_BUILD_SECONDS"] = "3"  # the renewer's build, not this one's
print("constructing", flush=True)
manager = LeaseManager(backend, renewer="process", visibility_timeout=30)
print("constructed", flush=True)
sys.stdin.read()  # until killed
"""


def children_of(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    found.append(int(entry.name))
    return found


def test_a_worker_killed_while_its_renewer_builds_leaves_no_renewer_and_loses_nothing(
    plugin: Path,
) -> None:
    """The worker's LeaseManager returns once its renewer serves, so nothing is
    received or registered while the renewer builds its backend (3 s). A worker
    SIGKILLed meanwhile leaves no renewer process behind, and its queue's messages
    are all there for the next consumer at once."""
    stream = f"relay-{uuid.uuid4().hex[:8]}"
    url = f"relay://{stream}"
    backend = leasekeeper.connect(url, visibility_timeout=30)
    for body in ("a", "b", "c"):
        backend.send(body)  # type: ignore[attr-defined]
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER_KILLED_WHILE_ITS_RENEWER_BUILDS, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None
        assert worker.stdout.readline().split() == ["constructing"]
        renewers: list[int] = []
        deadline = time.monotonic() + 10
        while not renewers and time.monotonic() < deadline:
            renewers = children_of(worker.pid)
            time.sleep(0.05)
        [renewer] = renewers
        worker.kill()
        worker.wait()
        other = leasekeeper.connect(url, consumer="other", visibility_timeout=30)
        got = other.receive(max_messages=3, wait_seconds=5)
        assert sorted(m.body for m in got) == ["a", "b", "c"]
        deadline = time.monotonic() + 10
        while alive(renewer) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not alive(renewer), "the renewer outlived its worker"
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
