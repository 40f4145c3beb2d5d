"""A Redis client built in code renews in the renewer process as it does in a
thread: one that reaches its server by a unix socket, one that speaks TLS to a
server whose certificate only it trusts and shows a client certificate. The
renewer process makes its own client from ``backend.spec()``, which carries what
a ``redis://`` URL cannot say; a client whose credentials come from a provider
built in code, or that checks certificates by OCSP, keeps the workers on the
thread renewer."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

import redis
from leasekeeper import ConfigError, LeaseManager
from leasekeeper.backends.rebuild import redis_renewal_problem, redis_secrets, redis_settings
from leasekeeper.backends.redis import RedisStreamsBackend
from leasekeeper.backends.spec import public_options
from tests.helpers import renews_a_job
from tests.self_signed import issued_by_a_private_ca, self_signed
from tests.services import RedisServer
from tests.tls_terminator import TLSTerminator

pytestmark = [pytest.mark.realtime]


@pytest.fixture
def stream(redis_url: str) -> Iterator[str]:
    name = f"settings-{uuid.uuid4().hex[:12]}"
    yield name
    admin = redis.Redis.from_url(redis_url)
    admin.delete(name)
    admin.close()


@pytest.mark.parametrize("renewer", ["process", "thread"])
def test_a_client_on_the_server_s_unix_socket_renews_there(
    redis_server: RedisServer, stream: str, renewer: str
) -> None:
    """The spec names the socket, so the renewer process reaches the same server
    (its URL alone would say localhost:6379, where no server, or another, listens)."""
    client = redis.Redis(unix_socket_path=redis_server.socket)
    backend = RedisStreamsBackend(client, stream, "g", visibility_timeout=2)
    assert dict(backend.spec().options)["unix_socket_path"] == redis_server.socket
    renews_a_job(backend, renewer)
    assert client.xlen(stream) == 0


class TLSFront:
    def __init__(self, front: TLSTerminator, ca: Path, client_cert: tuple[Path, Path]) -> None:
        self.front, self.ca, self.client_cert = front, ca, client_cert


@pytest.fixture
def tls_front(redis_url: str, tmp_path: Path) -> Iterator[TLSFront]:
    """The server behind a TLS front end with a certificate no bundle trusts, which
    asks for a client certificate (as a managed Redis with mutual TLS does)."""
    cert, key = self_signed(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert = self_signed(tmp_path / "client")
    port = int(urlsplit(redis_url).port or 0)
    with TLSTerminator(("127.0.0.1", port), (cert, key), client_ca=client_cert[0]) as front:
        yield TLSFront(front, cert, client_cert)


def tls_client(tls_front: TLSFront, **settings: Any) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=tls_front.front.port, ssl=True, socket_timeout=5, **settings
    )


@pytest.mark.parametrize("renewer", ["process", "thread"])
def test_a_client_s_own_tls_settings_renew_in_the_renewer_process(
    tls_front: TLSFront, stream: str, renewer: str
) -> None:
    """The client trusts the front end's certificate (``ssl_ca_certs``) and shows its
    own (``ssl_certfile``, ``ssl_keyfile``): the spec carries all three."""
    cert, key = tls_front.client_cert
    client = tls_client(
        tls_front, ssl_ca_certs=str(tls_front.ca), ssl_certfile=str(cert), ssl_keyfile=str(key)
    )
    backend = RedisStreamsBackend(client, stream, "g", visibility_timeout=2)
    options = dict(backend.spec().options)
    assert backend.spec().url.startswith("rediss://")
    carried = (options["ssl_ca_certs"], options["ssl_certfile"], options["ssl_keyfile"])
    assert carried == (str(tls_front.ca), str(cert), str(key))
    renews_a_job(backend, renewer)
    assert client.xlen(stream) == 0


def test_the_front_end_refuses_a_client_without_those_settings(tls_front: TLSFront) -> None:
    """What lets the test above fail: without the CA, or without the certificate,
    no connection is made."""
    with pytest.raises(redis.exceptions.ConnectionError):
        tls_client(tls_front).ping()  # the machine's bundles do not trust it
    with pytest.raises(redis.exceptions.ConnectionError):
        tls_client(tls_front, ssl_ca_certs=str(tls_front.ca)).ping()  # no certificate
    assert tls_front.front.accepted == 0


@pytest.fixture
def pinned_front(redis_url: str, tmp_path: Path) -> Iterator[tuple[TLSTerminator, Path]]:
    """The server behind a TLS front end whose certificate a private CA issued and
    threw away: a client trusts it only by pinning the certificate itself."""
    cert, key = issued_by_a_private_ca(tmp_path)
    port = int(urlsplit(redis_url).port or 0)
    with TLSTerminator(("127.0.0.1", port), (cert, key)) as front:
        yield front, cert


def pinning_client(front: TLSTerminator, cert: Path, **settings: Any) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1",
        port=front.port,
        ssl=True,
        socket_timeout=5,
        ssl_ca_certs=str(cert),
        **settings,
    )


@pytest.mark.parametrize("renewer", ["process", "thread"])
def test_a_pinned_certificate_renews_in_the_renewer_process(
    pinned_front: tuple[TLSTerminator, Path], stream: str, renewer: str
) -> None:
    """The client trusts the server's own certificate (``VERIFY_X509_PARTIAL_CHAIN``
    among its verify flags) and asks for TLS 1.2 at least: the spec names both, so
    the renewer process's client trusts it too."""
    front, cert = pinned_front
    client = pinning_client(
        front,
        cert,
        ssl_include_verify_flags=[ssl.VERIFY_X509_PARTIAL_CHAIN],
        ssl_min_version=ssl.TLSVersion.TLSv1_2,
    )
    backend = RedisStreamsBackend(client, stream, "g", visibility_timeout=2)
    options = dict(backend.spec().options)
    assert options["ssl_include_verify_flags"] == "VERIFY_X509_PARTIAL_CHAIN"
    assert options["ssl_min_version"] == "TLSv1_2"
    renews_a_job(backend, renewer)
    assert client.xlen(stream) == 0


def test_without_the_flag_the_pinned_certificate_is_refused(
    pinned_front: tuple[TLSTerminator, Path],
) -> None:
    """What lets the test above fail: the same client without the flag gets nowhere."""
    front, cert = pinned_front
    with pytest.raises(redis.exceptions.ConnectionError, match="certificate verify failed"):
        pinning_client(front, cert).ping()
    assert front.accepted == 0


def test_the_renewer_s_client_gets_the_tls_enums_back(
    pinned_front: tuple[TLSTerminator, Path], stream: str
) -> None:
    """A spec holds names; the client the renewer process builds from it holds what
    redis-py was given (a combined flag split into its members), and connects."""
    front, cert = pinned_front
    client = pinning_client(
        front,
        cert,
        ssl_min_version=ssl.TLSVersion.TLSv1_3,
        ssl_include_verify_flags=[ssl.VERIFY_X509_PARTIAL_CHAIN],
        ssl_exclude_verify_flags=[ssl.VERIFY_X509_STRICT | ssl.VERIFY_CRL_CHECK_LEAF],
    )
    spec = RedisStreamsBackend(client, stream, "g").spec()
    assert dict(spec.options)["ssl_exclude_verify_flags"] == (
        "VERIFY_CRL_CHECK_LEAF,VERIFY_X509_STRICT"
    )
    rebuilt = spec.build()
    assert isinstance(rebuilt, RedisStreamsBackend)
    kwargs = rebuilt.client.connection_pool.connection_kwargs
    assert kwargs["ssl_min_version"] is ssl.TLSVersion.TLSv1_3
    assert kwargs["ssl_exclude_verify_flags"] == [
        ssl.VerifyFlags.VERIFY_CRL_CHECK_LEAF,
        ssl.VerifyFlags.VERIFY_X509_STRICT,
    ]
    assert rebuilt.client.ping()
    rebuilt.client.close()
    with pytest.raises(ValueError, match="'TLSv9' is not one of ssl's names"):
        type(spec)(spec.url, (*spec.options, ("ssl_min_version", "TLSv9"))).build()


@pytest.mark.parametrize(
    "setting",
    [
        {"ssl_validate_ocsp": True},
        {"ssl_validate_ocsp_stapled": True},
        {"ssl_ocsp_expected_cert": "-----BEGIN CERTIFICATE-----"},
    ],
)
def test_checks_by_ocsp_are_a_renewal_problem(setting: dict[str, Any]) -> None:
    """A renewer process would not check the server's certificate by OCSP as the
    client does (it would accept a revoked one), so the client's backend names it
    as its renewal problem: ``renewer="process"`` refuses, ``auto`` renews in a
    thread (both as for the credential provider below)."""
    client = redis.Redis(ssl=True, **setting)
    problem = redis_renewal_problem(client)
    assert problem is not None and f"by OCSP ({next(iter(setting))})" in problem
    assert redis_renewal_problem(redis.Redis(ssl=True)) is None


def test_a_key_s_password_reaches_only_the_renewer_process() -> None:
    """``ssl_password`` (an encrypted key's) is a secret: sent to the renewer
    process, never put in a spec."""
    client = redis.Redis(ssl=True, ssl_keyfile="/k.pem", ssl_certfile="/c.pem", ssl_password="pw")
    assert "ssl_password" not in redis_settings(client)
    assert redis_secrets(client) == {"ssl_password": "pw"}
    assert "ssl_password" not in public_options({**redis_settings(client), "ssl_password": "pw"})


class RotatingToken(redis.CredentialProvider):
    """A provider whose credentials refresh (an IAM or Entra ID token)."""

    def get_credentials(self) -> tuple[str, str]:
        return ("worker", "token")


def test_credentials_from_a_provider_built_in_code_keep_the_renewals_in_a_thread(
    redis_server: RedisServer, stream: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The server knows the provider's user: the client works, the renewer process
    could not make the provider, so ``renewer="process"`` refuses and ``auto``
    renews in a thread, saying why."""
    admin = redis.Redis.from_url(redis_server.url)
    admin.acl_setuser("worker", enabled=True, passwords=["+token"], keys=["*"], commands=["+@all"])
    try:
        token = RotatingToken()
        client = redis.Redis(unix_socket_path=redis_server.socket, credential_provider=token)
        backend = RedisStreamsBackend(client, stream, "g", visibility_timeout=2)
        problem = backend.credentials_problem()
        assert problem is not None and "RotatingToken built in this process" in problem
        with pytest.raises(ConfigError, match="RotatingToken"):
            LeaseManager(backend, renewer="process", visibility_timeout=2, minimal_life=0.5).start()
        with caplog.at_level("WARNING", logger="leasekeeper"):
            renews_a_job(backend, "auto")
        assert any("RotatingToken" in r.getMessage() for r in caplog.records)
    finally:
        admin.acl_deluser("worker")
        admin.close()
