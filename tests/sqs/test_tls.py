"""An SQS endpoint over TLS whose certificate only the user's client trusts: moto
serving HTTPS with a certificate made here, which no CA bundle on the machine
holds. A client given ``verify=<that certificate>`` or ``verify=False`` renews in
the renewer process as it does in a thread: on the lean path (the ``standard``
retry mode) and on the client's (``legacy``), which the renewer process rebuilds
from the spec."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from leasekeeper import LeaseManager
from leasekeeper.backends.sqs import SQSBackend
from tests.forward_proxy import ForwardProxy
from tests.helpers import renewed_twice_then_completed
from tests.self_signed import self_signed
from tests.services import CHILD_ENV, MOTO_SERIAL, REGION, free_port

STARTUP_TIMEOUT = 30.0
HIDDEN_HOST = "sqs.invalid"  # resolves nowhere: reached through the proxy only


def tls_client(endpoint: str, verify: bool | str, mode: str = "standard") -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=REGION,
        verify=verify,
        config=Config(retries={"mode": mode, "max_attempts": 2}, connect_timeout=2),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture(scope="module")
def tls_moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """moto over HTTPS with a self-signed certificate: (endpoint, certificate)."""
    directory = tmp_path_factory.mktemp("tls")
    cert_path, key_path = self_signed(directory)
    port = free_port()
    log_path = directory / "moto_server.log"
    tls = ["-c", str(cert_path), "-k", str(key_path)]
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, str(MOTO_SERIAL), "-H", "127.0.0.1", "-p", str(port), *tls],
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **CHILD_ENV},
        )
    endpoint = f"https://127.0.0.1:{port}"
    probe = tls_client(endpoint, str(cert_path))
    deadline = time.monotonic() + STARTUP_TIMEOUT
    try:
        while True:
            try:
                probe.list_queues()
                break
            except Exception as exc:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(
                        f"moto over TLS did not answer ({exc!r}):\n"
                        + log_path.read_text(errors="replace")[-4000:]
                    )
            time.sleep(0.05)
        yield endpoint, cert_path
    finally:
        proc.terminate()
        proc.wait(10)


def test_the_machine_s_own_bundles_do_not_trust_the_endpoint(
    tls_moto: tuple[str, Path],
) -> None:
    """What makes the other tests able to fail: without the client's own setting,
    a client here (the renewer process's, made from the environment) is refused."""
    import botocore.exceptions

    endpoint, _ = tls_moto
    with pytest.raises(botocore.exceptions.SSLError):
        tls_client(endpoint, True).list_queues()


@pytest.mark.parametrize("mode", ["standard", "legacy"])
@pytest.mark.parametrize("trust", ["certificate", "none"])
def test_a_client_s_own_tls_verification_renews_in_the_renewer_process(
    tls_moto: tuple[str, Path], trust: str, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, cert_path = tls_moto
    for name, value in CHILD_ENV.items():
        monkeypatch.setenv(name, value)
    verify: bool | str = str(cert_path) if trust == "certificate" else False
    warnings.filterwarnings("ignore", message="Unverified HTTPS request")
    client = tls_client(endpoint, verify, mode)
    url = client.create_queue(QueueName=f"tls-{trust}-{mode}")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="job")
    backend = SQSBackend(client, url)
    assert dict(backend.spec().options).get("verify") == verify  # for the renewer process
    manager = LeaseManager(
        backend, renewer="process", visibility_timeout=2, timer_interval=0.2, minimal_life=0.5
    )
    try:
        manager.start()
        [message] = backend.receive(max_messages=1, wait_seconds=5, visibility_timeout=2)
        renewed_twice_then_completed(manager, message)
    finally:
        manager.close()
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"


def test_a_tls_proxy_the_client_trusts_carries_the_renewer_process_s_calls(
    moto_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A proxy reached over TLS that requires a client certificate, given in the
    client's ``proxies_config`` (``proxy_client_cert``, a (certificate, key) pair,
    and ``proxy_ca_bundle``), in front of an endpoint only the proxy can reach: the
    renewer process renews through it, as the client does."""
    import boto3
    from botocore.config import Config

    for name, value in CHILD_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    cert_path, key_path = self_signed(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert, client_key = self_signed(tmp_path / "client")
    moto = urlsplit(moto_endpoint)
    routes = {HIDDEN_HOST: (str(moto.hostname), int(moto.port or 80))}
    with ForwardProxy(routes, tls=(cert_path, key_path), client_ca=client_cert) as proxy:
        client = boto3.client(
            "sqs",
            endpoint_url=f"http://{HIDDEN_HOST}:{moto.port}",
            region_name=REGION,
            config=Config(
                proxies={"http": proxy.url},
                proxies_config={
                    "proxy_ca_bundle": str(cert_path),
                    "proxy_client_cert": (str(client_cert), str(client_key)),
                },
                retries={"mode": "standard", "max_attempts": 2},
                connect_timeout=2,
            ),
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        url = client.create_queue(QueueName="behind-a-tls-proxy")["QueueUrl"]
        client.send_message(QueueUrl=url, MessageBody="job")
        backend = SQSBackend(client, url)
        options = dict(backend.spec().options)
        assert options["proxy_ca_bundle"] == str(cert_path)
        assert (options["proxy_client_cert"], options["proxy_client_key"]) == (
            str(client_cert),
            str(client_key),
        )
        manager = LeaseManager(
            backend, renewer="process", visibility_timeout=2, timer_interval=0.2, minimal_life=0.5
        )
        try:
            manager.start()
            [message] = backend.receive(max_messages=1, wait_seconds=5, visibility_timeout=2)
            renewed_twice_then_completed(manager, message)
        finally:
            manager.close()
        assert proxy.forwarded["POST"] >= 5  # create, send, receive, 2 renewals (and delete)


@pytest.mark.filterwarnings("ignore:Unverified HTTPS request")  # (no bundle: as asked)
def test_the_tls_proxy_refuses_a_client_without_its_certificate(
    moto_endpoint: str, tmp_path: Path
) -> None:
    """What makes the test above able to fail: the proxy's own settings missing, a
    client (the renewer process's, made without them) gets nowhere."""
    import boto3
    import botocore.exceptions
    from botocore.config import Config

    cert_path, key_path = self_signed(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert, _ = self_signed(tmp_path / "client")
    moto = urlsplit(moto_endpoint)
    routes = {HIDDEN_HOST: (str(moto.hostname), int(moto.port or 80))}
    with ForwardProxy(routes, tls=(cert_path, key_path), client_ca=client_cert) as proxy:
        client = boto3.client(
            "sqs",
            endpoint_url=f"http://{HIDDEN_HOST}:{moto.port}",
            region_name=REGION,
            config=Config(proxies={"http": proxy.url}, retries={"max_attempts": 1}),
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        with pytest.raises(botocore.exceptions.BotoCoreError):
            client.list_queues()
        assert proxy.forwarded["POST"] == 0
