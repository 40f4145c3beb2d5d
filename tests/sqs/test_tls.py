"""An SQS endpoint over TLS whose certificate only the user's client trusts: moto
serving HTTPS with a certificate made here, which no CA bundle on the machine
holds. A client given ``verify=<that certificate>`` or ``verify=False`` renews in
the renewer process as it does in a thread: on the lean path (the ``standard``
retry mode) and on the client's (``legacy``), which the renewer process rebuilds
from the spec."""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leasekeeper import LeaseManager
from leasekeeper.backends.sqs import SQSBackend
from tests.helpers import renewed_twice_then_completed
from tests.services import CHILD_ENV, MOTO_SERIAL, REGION, free_port

STARTUP_TIMEOUT = 30.0


def self_signed(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 signed by its own key: (certificate, key) files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


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
