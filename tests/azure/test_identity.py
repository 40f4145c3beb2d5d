"""An azure-identity credential built in code renews in the renewer process as the
same identity: a ``ManagedIdentityCredential(client_id=...)`` (a user-assigned
identity) is made again there with its client id, not replaced by the default
chain's identity. One built with settings the other process would not make the
same keeps the workers on the thread renewer, with the credential itself.

The machine is modelled as Azure runs it: Azurite checks OAuth tokens (``--oauth
basic``, which needs HTTPS) and an App Service managed identity endpoint
(``IDENTITY_ENDPOINT``, which azure-identity reads) issues them. That endpoint
knows one identity, user-assigned, as a VM or App Service given only such an
identity does: a request without its client id is refused, so a renewer that
fell back to the default chain could not renew.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from azure.storage.queue import QueueClient, QueueServiceClient

from azure import identity
from leasekeeper import LeaseManager
from leasekeeper.backends.azure import AzureQueueBackend
from leasekeeper.backends.azure_identity import credential_options, identity_of
from leasekeeper.backends.schemes import azure as azure_factory
from leasekeeper.errors import ConfigError
from tests.azure.settings import ACCOUNT, KEY
from tests.helpers import (
    Served,
    renewed_twice_then_completed,
    runs_three_jobs_in_a_thread_and_warns,
)
from tests.self_signed import self_signed
from tests.services import azurite_answers, free_port, running_azurite

WORKER_IDENTITY = "11111111-2222-3333-4444-555555555555"  # the machine's one identity


def _jwt(claims: dict[str, Any]) -> str:
    """An unsigned token: Azurite's basic OAuth checks its claims, not a signature."""

    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part(claims)}.unsigned"


class IdentityEndpoint(Served):
    """App Service's managed identity endpoint for a machine whose only identity is
    user-assigned: tokens for ``WORKER_IDENTITY``'s client id, a refusal otherwise.
    ``asked`` lists the client id of every request (None: none given)."""

    def __init__(self) -> None:
        self.asked: list[str | None] = []
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlsplit(self.path).query)
                client_id = query.get("client_id", [None])[0]
                endpoint.asked.append(client_id)
                if client_id != WORKER_IDENTITY or not self.headers.get("X-IDENTITY-HEADER"):
                    status, answer = 400, {"error": "invalid_request"}
                else:
                    now = int(time.time())
                    token = _jwt(
                        {
                            "aud": "https://storage.azure.com",
                            "iss": "https://sts.windows.net/tenant/",
                            "iat": now - 60,
                            "nbf": now - 60,
                            "exp": now + 3600,
                            "appid": client_id,
                        }
                    )
                    status, answer = (
                        200,
                        {
                            "access_token": token,
                            "expires_on": str(now + 3600),
                            "resource": query.get("resource", [""])[0],
                            "token_type": "Bearer",
                            "client_id": client_id,
                        },
                    )
                body = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_port}/msi/token"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="identity-endpoint", daemon=True
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def oauth_azurite(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """Azurite over HTTPS, taking OAuth tokens: (its account URL, its certificate)."""
    location = tmp_path_factory.mktemp("azurite-oauth")
    cert, key = self_signed(location)
    port = free_port()
    account_url = f"https://127.0.0.1:{port}/{ACCOUNT}"

    def answers() -> bool:
        return azurite_answers(
            QueueServiceClient(
                account_url,
                credential={"account_name": ACCOUNT, "account_key": KEY},
                connection_verify=str(cert),
                retry_total=0,
            )
        )

    options = ("--oauth", "basic", "--cert", str(cert), "--key", str(key))
    with running_azurite(location, port, answers, *options):
        yield account_url, cert


@pytest.fixture
def identity_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[IdentityEndpoint]:
    """The machine's managed identity, and no other credential in the environment
    (the renewer process inherits it)."""
    for name in (
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_CLIENT_ID",
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_SECRET",
        "AZURE_FEDERATED_TOKEN_FILE",
        "MSI_ENDPOINT",
        "MSI_SECRET",
    ):
        monkeypatch.delenv(name, raising=False)
    with IdentityEndpoint() as endpoint:
        monkeypatch.setenv("IDENTITY_ENDPOINT", endpoint.url)
        monkeypatch.setenv("IDENTITY_HEADER", "identity-header")
        yield endpoint


def queue_with(
    oauth_azurite: tuple[str, Path], credential: object, jobs: int = 1
) -> tuple[QueueClient, str]:
    account_url, cert = oauth_azurite
    name = f"identity-{time.monotonic_ns()}"
    client = QueueClient(account_url, name, credential=credential, connection_verify=str(cert))
    client.create_queue()
    for number in range(jobs):
        client.send_message(f"job {number}")
    return client, name


USER_ASSIGNED = {
    "ManagedIdentityCredential": lambda: identity.ManagedIdentityCredential(
        client_id=WORKER_IDENTITY
    ),
    "DefaultAzureCredential": lambda: identity.DefaultAzureCredential(
        managed_identity_client_id=WORKER_IDENTITY
    ),
}


@pytest.mark.parametrize("kind", sorted(USER_ASSIGNED))
def test_a_user_assigned_identity_renews_in_the_renewer_process(
    oauth_azurite: tuple[str, Path], identity_endpoint: IdentityEndpoint, kind: str
) -> None:
    """The renewer process makes the credential again with its client id: it renews
    the lease twice as the same identity, and never asks for the default one."""
    client, _ = queue_with(oauth_azurite, USER_ASSIGNED[kind]())
    backend = AzureQueueBackend(client)
    options = dict(backend.spec().options)
    assert (options["credential"], options["client_id"]) == (kind, WORKER_IDENTITY)
    assert backend.credentials_problem() is None
    manager = LeaseManager(
        backend, renewer="process", visibility_timeout=2, timer_interval=0.2, minimal_life=0.5
    )
    try:
        manager.start()
        asked_before = len(identity_endpoint.asked)
        [message] = backend.receive(max_messages=1, visibility_timeout=2)
        renewed_twice_then_completed(manager, message)
    finally:
        manager.close()
    # The renewer process asked for a token of its own, for the same identity.
    assert identity_endpoint.asked[asked_before:].count(WORKER_IDENTITY) >= 1
    assert None not in identity_endpoint.asked
    assert client.get_queue_properties().approximate_message_count == 0


def test_the_default_chain_here_is_not_that_identity(
    oauth_azurite: tuple[str, Path], identity_endpoint: IdentityEndpoint
) -> None:
    """What lets the test above fail: the environment's default identity (what the
    renewer process used before) gets no token, and so no queue."""
    from azure.core.exceptions import ClientAuthenticationError

    account_url, cert = oauth_azurite
    client = QueueClient(
        account_url,
        "any-queue",
        credential=identity.ManagedIdentityCredential(),
        connection_verify=str(cert),
        retry_total=0,
    )
    with pytest.raises(ClientAuthenticationError):
        client.get_queue_properties()
    assert identity_endpoint.asked and set(identity_endpoint.asked) == {None}


def test_a_credential_given_settings_in_code_renews_in_a_thread(
    oauth_azurite: tuple[str, Path],
    identity_endpoint: IdentityEndpoint,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A credential built with a setting another process would not make the same
    (here: a chain without the CLI) is not named in the spec: ``renewer="process"``
    refuses it, and the default worker renews in a thread with the credential
    itself, completing every job and saying why once."""
    credential = identity.DefaultAzureCredential(
        managed_identity_client_id=WORKER_IDENTITY, exclude_cli_credential=True
    )
    client, _ = queue_with(oauth_azurite, credential, jobs=3)
    backend = AzureQueueBackend(client)
    assert "credential" not in dict(backend.spec().options)
    problem = backend.credentials_problem()
    assert problem is not None and "DefaultAzureCredential given settings in code" in problem
    with pytest.raises(ConfigError, match="another identity"):
        LeaseManager(backend, renewer="process").start()

    warning = runs_three_jobs_in_a_thread_and_warns(backend, caplog)
    assert "another identity" in warning
    assert client.get_queue_properties().approximate_message_count == 0


# What a spec names, for credentials built as users build them (no service needed).
NAMED = [
    (identity.ManagedIdentityCredential, {"credential": "ManagedIdentityCredential"}),
    (
        lambda: identity.ManagedIdentityCredential(client_id="abc"),
        {"credential": "ManagedIdentityCredential", "client_id": "abc"},
    ),
    (identity.DefaultAzureCredential, {"credential": "DefaultAzureCredential"}),
    (identity.EnvironmentCredential, {"credential": "EnvironmentCredential"}),
    (identity.AzureCliCredential, {"credential": "AzureCliCredential"}),
    (lambda: identity.AzureCliCredential(tenant_id="another-tenant"), None),
    (lambda: identity.DefaultAzureCredential(exclude_environment_credential=True), None),
    (lambda: identity.DefaultAzureCredential(workload_identity_client_id="abc"), None),
    (
        lambda: identity.ManagedIdentityCredential(identity_config={"mi_res_id": "/sub/x"}),
        None,
    ),
    (lambda: identity.ClientSecretCredential("tenant", "client", "s3cret"), None),
]


@pytest.mark.parametrize(("make", "named"), NAMED)
def test_a_spec_names_a_credential_only_where_another_process_makes_it_the_same(
    make: Any, named: dict[str, str] | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_CLIENT_SECRET"):
        monkeypatch.delenv(name, raising=False)
    assert credential_options(make()) == named


def test_the_environment_s_client_id_is_the_default_chain_s_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With AZURE_CLIENT_ID set, the default chain finds that identity itself: a
    spec need not carry it. A managed identity credential does not read it, so
    one made for that client id in code still carries it."""
    monkeypatch.setenv("AZURE_CLIENT_ID", "abc")
    made = identity.DefaultAzureCredential(managed_identity_client_id="abc")
    assert credential_options(made) == {"credential": "DefaultAzureCredential"}
    managed = identity.ManagedIdentityCredential(client_id="abc")
    assert credential_options(managed) == {
        "credential": "ManagedIdentityCredential",
        "client_id": "abc",
    }


def test_the_factory_makes_the_credential_a_spec_names_over_the_environment_s_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The other process's side: ``credential`` and ``client_id`` make the same
    identity, before an account key the environment holds (the worker's client
    did not use it)."""
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", KEY)
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    backend = azure_factory(
        "azure://acct/jobs", credential="ManagedIdentityCredential", client_id="abc"
    )
    made = backend.queue_client.credential
    assert identity_of(made) == identity_of(identity.ManagedIdentityCredential(client_id="abc"))
    assert dict(backend.spec().options)["client_id"] == "abc"


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"credential": "ClientSecretCredential"}, "not one of azure-identity's credentials"),
        ({"client_id": "abc"}, "none is named"),
        (
            {"credential": "AzureCliCredential", "client_id": "abc"},
            "AzureCliCredential takes no client_id",
        ),
    ],
)
def test_the_factory_refuses_a_credential_it_cannot_make(
    options: dict[str, str], error: str
) -> None:
    with pytest.raises(ValueError, match=error):
        azure_factory("azure://acct/jobs", **options)
