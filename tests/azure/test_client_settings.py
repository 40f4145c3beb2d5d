"""An Azure queue client's own settings reach every client leasekeeper makes like
it (the thread renewer's per thread, the renewer process's): a proxy given in code
(``proxies=``, its password too) and ``connection_verify``. The account is reached
through a host only the proxy knows, so a renewer that went direct could not renew."""

from __future__ import annotations

from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from azure.core.exceptions import ServiceRequestError
from azure.storage.queue import QueueClient

from leasekeeper.backends.azure import AzureQueueBackend
from leasekeeper.backends.spec import renewal_spec
from tests.azure.settings import ACCOUNT, KEY
from tests.forward_proxy import Answer, ForwardProxy
from tests.helpers import renews_a_job
from tests.self_signed import self_signed

HIDDEN_HOST = "azurite.invalid"  # resolves nowhere: reached through the proxy only


def no_proxy_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("renewer", "password"), [("process", False), ("process", True), ("thread", False)]
)
def test_a_proxy_given_in_code_carries_the_renewals(
    azurite: str, queue_name: str, renewer: str, password: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both renewers renew through the client's proxy: the thread renewer's calls
    (on clients of its own per thread) and the renewer process's."""
    no_proxy_in_the_environment(monkeypatch)
    port = int(urlsplit(azurite.split("QueueEndpoint=")[1].rstrip(";")).port or 0)
    with ForwardProxy({HIDDEN_HOST: ("127.0.0.1", port)}) as proxy:
        proxy_url = proxy.url.replace("//", "//lk:s3cret@") if password else proxy.url
        client = QueueClient(
            f"http://{HIDDEN_HOST}:{port}/{ACCOUNT}",
            queue_name,
            credential={"account_name": ACCOUNT, "account_key": KEY},
            proxies={"http": proxy_url},
            connection_verify=False,
        )
        backend = AzureQueueBackend(client)
        options = dict(backend.spec().options)
        shown = proxy.url.replace("//", "//lk@") if password else proxy.url  # (no password)
        assert options["http_proxy"] == shown
        assert options["connection_verify"] is False
        assert "s3cret" not in repr(backend.spec()) + repr(renewal_spec(backend))
        updates_before = proxy.forwarded["PUT"]
        renews_a_job(backend, renewer, visibility_timeout=2)
        # Update Message is a PUT: the renewals went through the proxy.
        assert proxy.forwarded["PUT"] - updates_before >= 2
        assert client.get_queue_properties().approximate_message_count == 0


def test_the_hidden_host_cannot_be_reached_but_through_the_proxy(azurite: str) -> None:
    """What makes the test above able to fail."""
    from azure.core.exceptions import ServiceRequestError

    port = urlsplit(azurite.split("QueueEndpoint=")[1].rstrip(";")).port
    client: Any = QueueClient(
        f"http://{HIDDEN_HOST}:{port}/{ACCOUNT}",
        "any",
        credential={"account_name": ACCOUNT, "account_key": KEY},
        retry_total=0,
    )
    with pytest.raises(ServiceRequestError):
        client.get_queue_properties()


def test_a_sibling_queue_is_reached_through_the_same_proxy(
    azurite: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dead-letter queue (``sibling``) is made like the client it comes from."""
    no_proxy_in_the_environment(monkeypatch)
    port = int(urlsplit(azurite.split("QueueEndpoint=")[1].rstrip(";")).port or 0)
    with ForwardProxy({HIDDEN_HOST: ("127.0.0.1", port)}) as proxy:
        client = QueueClient(
            f"http://{HIDDEN_HOST}:{port}/{ACCOUNT}",
            queue_name,
            credential={"account_name": ACCOUNT, "account_key": KEY},
            proxies={"http": proxy.url},
        )
        sibling = AzureQueueBackend(client).sibling(f"{queue_name}-dead", create=True)
        sibling.send("dead")
        [message] = sibling.receive(max_messages=1, visibility_timeout=5)
        assert message.body == "dead"
        sibling.queue_client.delete_queue()


STACK_VERSION = "2019-02-02"  # the newest Queue service version an Azure Stack Hub takes


def stack_hub_refusal(headers: Message) -> Answer | None:
    """Azure Stack Hub's answer to a request naming a service version newer than
    its own: 400 InvalidHeaderValue. None for one it takes."""
    if str(headers.get("x-ms-version", "")) <= STACK_VERSION:
        return None
    body = (
        b'<?xml version="1.0" encoding="utf-8"?><Error><Code>InvalidHeaderValue</Code>'
        b"<Message>The value for one of the HTTP headers is not in the correct format."
        b"</Message><HeaderName>x-ms-version</HeaderName></Error>"
    )
    return 400, {"x-ms-error-code": "InvalidHeaderValue", "Content-Type": "application/xml"}, body


@pytest.mark.parametrize("renewer", ["process", "thread"])
def test_an_api_version_chosen_in_code_is_the_renewals_version(
    azurite: str, queue_name: str, renewer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client made for an older service (``api_version=``, as Azure Stack Hub and
    older emulators need) renews with that version in both renewers: the renewer
    process's client is made with it too (the spec carries it), so the service
    refuses none of the renewals."""
    no_proxy_in_the_environment(monkeypatch)
    port = int(urlsplit(azurite.split("QueueEndpoint=")[1].rstrip(";")).port or 0)
    route = {HIDDEN_HOST: ("127.0.0.1", port)}
    with ForwardProxy(route, answer_first=stack_hub_refusal) as stack:
        client = QueueClient(
            f"http://{HIDDEN_HOST}:{port}/{ACCOUNT}",
            queue_name,
            credential={"account_name": ACCOUNT, "account_key": KEY},
            proxies={"http": stack.url},
            api_version=STACK_VERSION,
        )
        backend = AzureQueueBackend(client)
        assert dict(backend.spec().options)["api_version"] == STACK_VERSION
        renews_a_job(backend, renewer, visibility_timeout=2)
        assert stack.refused == 0
        assert client.get_queue_properties().approximate_message_count == 0


def test_the_stack_refuses_the_sdk_s_own_version(
    azurite: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What lets the test above fail: a client left at the SDK's default version is
    refused there. Its spec names no version, so an executor keeps its own SDK's
    default."""
    from azure.core.exceptions import HttpResponseError

    no_proxy_in_the_environment(monkeypatch)
    port = int(urlsplit(azurite.split("QueueEndpoint=")[1].rstrip(";")).port or 0)
    with ForwardProxy({HIDDEN_HOST: ("127.0.0.1", port)}, answer_first=stack_hub_refusal) as stack:
        client = QueueClient(
            f"http://{HIDDEN_HOST}:{port}/{ACCOUNT}",
            queue_name,
            credential={"account_name": ACCOUNT, "account_key": KEY},
            proxies={"http": stack.url},
            retry_total=0,
        )
        assert "api_version" not in dict(AzureQueueBackend(client).spec().options)
        with pytest.raises(HttpResponseError, match="InvalidHeaderValue"):
            client.get_queue_properties()
        assert stack.refused == 1


@pytest.mark.parametrize("renewer", ["process", "thread"])
def test_a_client_certificate_the_account_asks_for_renews_in_both_renewers(
    azurite: str, queue_name: str, renewer: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway in front of the account terminates mutual TLS: the client's
    ``connection_cert`` (and ``connection_verify``, for the gateway's own
    certificate) reach the per-thread clients and the renewer process's."""
    no_proxy_in_the_environment(monkeypatch)
    port = int(urlsplit(azurite.split("QueueEndpoint=")[1].rstrip(";")).port or 0)
    cert, key = self_signed(tmp_path)
    (tmp_path / "client").mkdir()
    client_cert, client_key = self_signed(tmp_path / "client")
    route = {"": ("127.0.0.1", port)}  # every request: to Azurite
    with ForwardProxy(route, tls=(cert, key), client_ca=client_cert) as gateway:
        client = QueueClient(
            f"{gateway.url}/{ACCOUNT}",
            queue_name,
            credential={"account_name": ACCOUNT, "account_key": KEY},
            connection_verify=str(cert),
            connection_cert=(str(client_cert), str(client_key)),
        )
        backend = AzureQueueBackend(client)
        options = dict(backend.spec().options)
        assert (options["connection_cert"], options["connection_key"]) == (
            str(client_cert),
            str(client_key),
        )
        renews_a_job(backend, renewer, visibility_timeout=2)
        assert gateway.forwarded["PUT"] >= 2  # the renewals (Update Message)
        without = QueueClient(
            f"{gateway.url}/{ACCOUNT}",
            queue_name,
            credential={"account_name": ACCOUNT, "account_key": KEY},
            connection_verify=str(cert),
            retry_total=0,
        )
        with pytest.raises(ServiceRequestError):  # what lets this test fail
            without.get_queue_properties()
