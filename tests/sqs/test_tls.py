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
from typing import Any, NamedTuple
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


def renews_in_the_renewer_process(backend: SQSBackend) -> None:
    """The one message of ``backend``'s queue, leased with 2 s timeouts: renewed
    twice by the renewer process, then completed."""
    manager = LeaseManager(
        backend, renewer="process", visibility_timeout=2, timer_interval=0.2, minimal_life=0.5
    )
    try:
        manager.start()
        [message] = backend.receive(max_messages=1, wait_seconds=5, visibility_timeout=2)
        renewed_twice_then_completed(manager, message)
    finally:
        manager.close()


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
    renews_in_the_renewer_process(backend)
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    assert attributes["ApproximateNumberOfMessages"] == "0"
    assert attributes["ApproximateNumberOfMessagesNotVisible"] == "0"


class TLSProxy(NamedTuple):
    proxy: ForwardProxy
    endpoint: str  # the SQS endpoint only the proxy reaches
    proxy_ca_bundle: str
    proxy_client_cert: tuple[str, str]  # (certificate, key)


@pytest.fixture
def tls_proxy(moto_endpoint: str, tmp_path: Path) -> Iterator[TLSProxy]:
    """A proxy reached over TLS, with a certificate of its own, that requires a
    client certificate, in front of moto under a host name only it resolves."""
    cert_path, key_path = self_signed(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert, client_key = self_signed(tmp_path / "client")
    moto = urlsplit(moto_endpoint)
    routes = {HIDDEN_HOST: (str(moto.hostname), int(moto.port or 80))}
    with ForwardProxy(routes, tls=(cert_path, key_path), client_ca=client_cert) as proxy:
        yield TLSProxy(
            proxy,
            f"http://{HIDDEN_HOST}:{moto.port}",
            str(cert_path),
            (str(client_cert), str(client_key)),
        )


def proxied_client(tls_proxy: TLSProxy, **proxies_config: Any) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=tls_proxy.endpoint,
        region_name=REGION,
        config=Config(
            proxies={"http": tls_proxy.proxy.url},
            proxies_config=proxies_config or None,
            retries={"mode": "standard", "max_attempts": 2},
            connect_timeout=2,
        ),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def test_a_tls_proxy_the_client_trusts_carries_the_renewer_process_s_calls(
    tls_proxy: TLSProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's ``proxies_config`` names the proxy's CA bundle and a client
    certificate (a (certificate, key) pair): the renewer process renews through
    the proxy, as the client does."""
    for name, value in CHILD_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.delenv(name, raising=False)
    client = proxied_client(
        tls_proxy,
        proxy_ca_bundle=tls_proxy.proxy_ca_bundle,
        proxy_client_cert=tls_proxy.proxy_client_cert,
    )
    url = client.create_queue(QueueName="behind-a-tls-proxy")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="job")
    backend = SQSBackend(client, url)
    options = dict(backend.spec().options)
    assert options["proxy_ca_bundle"] == tls_proxy.proxy_ca_bundle
    given = (options["proxy_client_cert"], options["proxy_client_key"])
    assert given == tls_proxy.proxy_client_cert
    renews_in_the_renewer_process(backend)
    # create, send, receive, two renewals and the delete, all through the proxy
    assert tls_proxy.proxy.forwarded["POST"] >= 5


@pytest.mark.filterwarnings("ignore:Unverified HTTPS request")  # (no bundle: as asked)
def test_the_tls_proxy_refuses_a_client_without_its_certificate(tls_proxy: TLSProxy) -> None:
    """What makes the test above able to fail: the proxy's own settings missing, a
    client (the renewer process's, made without them) gets nowhere."""
    import botocore.exceptions

    with pytest.raises(botocore.exceptions.BotoCoreError):
        proxied_client(tls_proxy).list_queues()
    assert tls_proxy.proxy.forwarded["POST"] == 0


class MutualTLS(NamedTuple):
    gateway: ForwardProxy  # in front of moto: TLS, and a client certificate required
    ca: str  # the gateway's certificate, for the client's verify=
    client_cert: tuple[str, str]  # (certificate, key) files it accepts


@pytest.fixture
def mutual_tls(moto_endpoint: str, tmp_path: Path) -> Iterator[MutualTLS]:
    """An endpoint that asks for a client certificate (a gateway terminating mutual
    TLS in front of moto), as private SQS-compatible endpoints may."""
    cert_path, key_path = self_signed(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert, client_key = self_signed(tmp_path / "client")
    moto = urlsplit(moto_endpoint)
    route = {"": (str(moto.hostname), int(moto.port or 80))}  # every request: to moto
    with ForwardProxy(route, tls=(cert_path, key_path), client_ca=client_cert) as gateway:
        yield MutualTLS(gateway, str(cert_path), (str(client_cert), str(client_key)))


def mutual_tls_client(mutual_tls: MutualTLS, client_cert: Any) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "sqs",
        endpoint_url=mutual_tls.gateway.url,
        region_name=REGION,
        verify=mutual_tls.ca,
        config=Config(client_cert=client_cert, retries={"mode": "standard", "max_attempts": 2}),
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.mark.parametrize("form", ["pair", "one file"])
def test_a_client_certificate_the_endpoint_asks_for_renews_in_the_renewer_process(
    mutual_tls: MutualTLS, form: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The client's ``client_cert`` (a (certificate, key) pair, or one file holding
    both) reaches the renewer process, which shows it to the endpoint."""
    for name, value in CHILD_ENV.items():
        monkeypatch.setenv(name, value)
    cert, key = mutual_tls.client_cert
    given: Any = mutual_tls.client_cert
    if form == "one file":
        given = str(tmp_path / "both.pem")
        Path(given).write_text(Path(cert).read_text() + Path(key).read_text())
    client = mutual_tls_client(mutual_tls, given)
    url = client.create_queue(QueueName=f"mutual-tls-{form.replace(' ', '-')}")["QueueUrl"]
    client.send_message(QueueUrl=url, MessageBody="job")
    backend = SQSBackend(client, url)
    options = dict(backend.spec().options)
    spec_cert = (options["client_cert"], options.get("client_key"))
    assert spec_cert == ((cert, key) if form == "pair" else (given, None))
    renews_in_the_renewer_process(backend)
    # create, send, receive, two renewals and the delete, all shown the certificate
    assert mutual_tls.gateway.forwarded["POST"] >= 5


def test_the_endpoint_refuses_a_client_without_the_certificate(mutual_tls: MutualTLS) -> None:
    """What makes the test above able to fail: a client without ``client_cert`` (the
    renewer process's, made from a spec without it) gets nowhere."""
    import botocore.exceptions

    with pytest.raises(botocore.exceptions.BotoCoreError):
        mutual_tls_client(mutual_tls, None).list_queues()
    assert mutual_tls.gateway.forwarded["POST"] == 0
