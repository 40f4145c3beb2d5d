"""The client the user built, read so another process can build it again.

A backend's ``spec()`` carries its client's settings (``*_settings``): the
endpoint, region, retries, timeouts, pool size and proxies of a boto3 client, the
endpoint and HTTPS of an MNS one, the account URL, retries and timeouts of an Azure
queue client. Their secrets (``*_secrets``: keys given in code, a proxy's password)
never go in a spec: they go only to the renewer process, over its private socket
(``leasekeeper.backends.spec.renewal_spec``). Credentials that process cannot be
given or find itself - a refreshing provider built in code - are a
``*_credentials_problem``: the workers renew in a thread then.

Every function reads the SDK objects through their attributes (it imports no
SDK). Some settings live only in an SDK's private fields; they are read with
``getattr`` and a default, so an SDK that moves them loses the setting, not the
queue.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from typing import Any

from leasekeeper.backends.azure_identity import REBUILT_CREDENTIALS, credential_options
from leasekeeper.backends.environment import azure_credentials_problem
from leasekeeper.backends.urls import redact_url

__all__ = [
    "CLIENT_KEY",
    "CONNECTION_KEY",
    "PROXY_CLIENT_KEY",
    "PROXY_SETTINGS",
    "REDIS_TLS_SETTINGS",
    "azure_credentials_given",
    "azure_renewal_problem",
    "azure_secrets",
    "azure_settings",
    "azure_transport_options",
    "certificate_options",
    "mns_credentials_given",
    "mns_renewal_problem",
    "mns_secrets",
    "proxy_options",
    "redis_renewal_problem",
    "redis_secrets",
    "redis_settings",
    "redis_tls_value",
]


def proxy_options(proxies: object) -> dict[str, str]:
    """``http_proxy``/``https_proxy`` options of a proxies dict (password kept)."""
    if not isinstance(proxies, Mapping):
        return {}
    return {
        f"{scheme}_proxy": str(url)
        for scheme, url in proxies.items()
        if scheme in ("http", "https") and url
    }


# botocore's ``Config(proxies_config=...)``, one factory option each: the CA bundle
# and client certificate (and its key, where given apart) for a TLS proxy, and
# forwarding (``leasekeeper.backends.sqs.scheme`` gives them back).
PROXY_SETTINGS = ("proxy_ca_bundle", "proxy_client_cert", "proxy_use_forwarding_for_https")
PROXY_CLIENT_KEY = "proxy_client_key"
# botocore's ``Config(client_cert=...)``'s key, where it is a file of its own: the
# factory option beside ``client_cert`` (a certificate the endpoint asks for).
CLIENT_KEY = "client_key"
CONNECTION_KEY = "connection_key"  # the same for an Azure client's ``connection_cert``


def certificate_options(cert: object, cert_name: str, key_name: str) -> dict[str, Any]:
    """A client certificate's factory options: ``{cert_name: path}``, or for a
    (certificate, key) pair, the key's path as ``key_name`` too."""
    if isinstance(cert, (tuple, list)) and len(cert) == 2:  # (cert, key)
        return {cert_name: cert[0], key_name: cert[1]}
    return {cert_name: cert} if isinstance(cert, str) else {}


def mns_credentials_given(provider: Any) -> tuple[str, str, str] | None:
    """The (key id, secret, token) of a static MNS credentials provider, else None
    (a provider of another kind refreshes: it cannot be sent)."""
    if type(provider).__name__ != "StaticCredentialsProvider":
        return None
    credentials = provider.get_credentials()
    return (
        credentials.get_access_key_id(),
        credentials.get_access_key_secret(),
        credentials.get_security_token() or "",
    )


def mns_renewal_problem(provider: Any) -> str | None:
    """Why the renewer process could not have the MNS keys of ``provider``: they
    come from a provider built in this process (a refreshing one); None for keys."""
    if mns_credentials_given(provider) is not None:
        return None
    return (
        f"the MNS credentials come from a provider built in this process "
        f"({type(provider).__name__}), which another process cannot rebuild"
    )


def mns_secrets(provider: Any) -> dict[str, Any]:
    """The MNS factory's secret options for the keys ``provider`` holds."""
    given = mns_credentials_given(provider)
    if given is None:
        return {}
    key_id, secret, token = given
    return {
        "access_key_id": key_id,
        "access_key_secret": secret,
        **({"security_token": token} if token else {}),
    }


def azure_settings(queue_client: Any) -> dict[str, Any]:
    """The Azure factory's options for the queue client's retries, timeouts, proxies
    given in code (with their password: a spec drops it, ``azure_secrets`` sends it
    to the renewer process), TLS verification and API version (when not the
    defaults) and its
    azure-identity credential (its class, and a user-assigned identity's client id:
    ``leasekeeper.backends.azure_identity``)."""
    config = getattr(queue_client, "_config", None)
    retry = getattr(config, "retry_policy", None)
    connection = getattr(getattr(config, "transport", None), "connection_config", None)
    transport = azure_transport_options(queue_client)
    return {
        "retry_total": getattr(retry, "total_retries", None),
        "connection_timeout": getattr(connection, "timeout", None),
        "read_timeout": getattr(connection, "read_timeout", None),
        "connection_verify": transport.get("connection_verify"),
        "api_version": _api_version_given(queue_client),
        **certificate_options(transport.get("connection_cert"), "connection_cert", CONNECTION_KEY),
        **proxy_options(transport.get("proxies")),
        **(credential_options(getattr(queue_client, "credential", None)) or {}),
    }


def _api_version_given(queue_client: Any) -> str | None:
    """The client's service API version where it was chosen in code (an older one
    for Azure Stack Hub or an emulator), None where it is the SDK's default: a spec
    pins only what the user pinned, so an executor with a newer SDK keeps its own."""
    chosen = getattr(queue_client, "api_version", None)
    if not isinstance(chosen, str):
        return None
    try:
        from azure.storage.queue._serialize import get_api_version
    except ImportError:  # an SDK that moved it: the version is always carried
        return chosen
    return None if chosen == get_api_version(None) else chosen


def azure_transport_options(queue_client: Any) -> dict[str, Any]:
    """The ``QueueClient`` keywords that make another client reach the service as
    ``queue_client`` does: its ``proxies``, its ``connection_verify`` (False or a
    CA bundle's path) and its ``connection_cert`` (a client certificate: a file, or
    a (certificate, key) pair), where they are not the defaults. azure-core keeps
    them on the client's proxy policy and transport."""
    config = getattr(queue_client, "_config", None)
    proxies = getattr(getattr(config, "proxy_policy", None), "proxies", None)
    connection = getattr(getattr(config, "transport", None), "connection_config", None)
    verify = getattr(connection, "verify", True)
    cert = getattr(connection, "cert", None)
    options: dict[str, Any] = {}
    if isinstance(proxies, Mapping) and proxies:
        options["proxies"] = dict(proxies)
    if verify is False or isinstance(verify, str):
        options["connection_verify"] = verify
    if isinstance(cert, str) or (isinstance(cert, (tuple, list)) and len(cert) == 2):
        options["connection_cert"] = cert if isinstance(cert, str) else tuple(cert)
    return options


def azure_credentials_given(queue_client: Any) -> dict[str, Any] | None:
    """The Azure factory's secret options for the queue client's credential: an
    account key (given as such or in a connection string), a SAS token (in its URL
    or as an AzureSasCredential); ``{}`` for none, or for an azure-identity
    credential the other process makes one like (``azure_settings`` names it);
    None for one it cannot have."""
    credential = getattr(queue_client, "credential", None)
    key = getattr(credential, "account_key", None)
    if isinstance(key, str) and key:
        return {"account_key": key}
    signature = getattr(credential, "signature", None)
    if isinstance(signature, str) and signature:
        return {"sas_token": signature}
    sas = str(getattr(queue_client, "url", "")).partition("?")[2]
    if sas:
        return {"sas_token": sas}
    if credential is None or credential_options(credential) is not None:
        return {}
    return None


def azure_renewal_problem(queue_client: Any, account_url: str) -> str | None:
    """Why another process could not have the queue client's credential: one built
    in this process that cannot be sent (a custom token credential) or made the
    same there (azure-identity's, given other settings in code), or none given and
    none in the environment. None when it can."""
    given = azure_credentials_given(queue_client)
    credential = getattr(queue_client, "credential", None)
    kind = type(credential).__name__
    if given is None and kind in REBUILT_CREDENTIALS:
        return (
            f"the Azure credential is a {kind} given settings in code that another "
            "process's would not have (a tenant, a resource id, a credential left out...): "
            "it would renew as another identity; make it from the environment "
            "(AZURE_CLIENT_ID, AZURE_TENANT_ID...) or with a client id only"
        )
    if given is None:
        return (
            f"the Azure credential is a {kind} built in this process, which another "
            "process cannot rebuild"
        )
    if given or credential is not None:
        return None  # a key or SAS token sent to it, or a credential the spec names
    return azure_credentials_problem(account_url)


def azure_secrets(queue_client: Any) -> dict[str, Any]:
    """The queue client's key or SAS token, and its proxies' URLs with a password:
    what the renewer process needs and cannot find itself."""
    proxies = proxy_options(azure_transport_options(queue_client).get("proxies"))
    secret_proxies = {name: url for name, url in proxies.items() if redact_url(url) != url}
    return {**(azure_credentials_given(queue_client) or {}), **secret_proxies}


# redis-py's TLS settings another process's client needs to reach the server as the
# client does: the CA it trusts, the certificate it shows, its checks. (The key's
# password, ``ssl_password``, is a secret: ``redis_secrets``.)
REDIS_TLS_SETTINGS = (
    "ssl_ca_certs",
    "ssl_ca_path",
    "ssl_ca_data",
    "ssl_certfile",
    "ssl_keyfile",
    "ssl_cert_reqs",
    "ssl_check_hostname",
    "ssl_ciphers",
    "ssl_min_version",
    "ssl_include_verify_flags",
    "ssl_exclude_verify_flags",
)
_CERT_REQS = {0: "none", 1: "optional", 2: "required"}  # ssl.VerifyMode's, by value
_VERIFY_FLAG_LISTS = ("ssl_include_verify_flags", "ssl_exclude_verify_flags")
# Checks by OCSP: its context is an object of this process, and the renewer process
# left without them would accept a revoked certificate the worker refuses.
_REDIS_OCSP_SETTINGS = (
    "ssl_validate_ocsp",
    "ssl_validate_ocsp_stapled",
    "ssl_ocsp_context",
    "ssl_ocsp_expected_cert",
)
_REDIS_CONNECTIONS = ("Connection", "SSLConnection", "UnixDomainSocketConnection")
_REDIS_POOLS = ("ConnectionPool", "BlockingConnectionPool")


def redis_settings(client: Any) -> dict[str, Any]:
    """The Redis factory's options for what the client's URL cannot say: its unix
    socket (``unix_socket_path``) and its TLS settings given in code."""
    kwargs = _redis_connection_kwargs(client)
    settings: dict[str, Any] = {}
    if isinstance(kwargs.get("path"), str):
        settings["unix_socket_path"] = kwargs["path"]
    for name in REDIS_TLS_SETTINGS:
        value = _redis_tls_text(name, kwargs.get(name))
        if isinstance(value, (str, bool)):
            settings[name] = value
    return settings


def _redis_tls_text(name: str, value: Any) -> Any:
    """A TLS setting as a spec carries it: an enum by its name (``ssl_min_version``
    "TLSv1_3"), a list of verify flags as their names joined by commas."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if name == "ssl_cert_reqs" and isinstance(value, int):
        return _CERT_REQS.get(int(value))
    if name == "ssl_min_version" and isinstance(value, ssl.TLSVersion):
        return value.name
    if name in _VERIFY_FLAG_LISTS and isinstance(value, (list, tuple)):
        named = [flag for flag in ssl.VerifyFlags if flag and any(flag & v for v in value)]
        return ",".join(str(flag.name) for flag in named)
    return None


def redis_tls_value(name: str, text: Any) -> Any:
    """A TLS setting from a spec, as redis-py takes it: ``_redis_tls_text`` undone."""
    if not isinstance(text, str):
        return text
    try:
        if name == "ssl_min_version":
            return ssl.TLSVersion[text]
        if name in _VERIFY_FLAG_LISTS:
            return [ssl.VerifyFlags[flag] for flag in text.split(",") if flag]
    except KeyError as unknown:
        raise ValueError(f"{name}: {unknown.args[0]!r} is not one of ssl's names") from None
    return text


def redis_secrets(client: Any) -> dict[str, Any]:
    """The client's password and its key file's password: for the renewer process."""
    kwargs = _redis_connection_kwargs(client)
    return {name: kwargs[name] for name in ("password", "ssl_password") if kwargs.get(name)}


def redis_renewal_problem(client: Any) -> str | None:
    """Why another process could not connect as the Redis client does: credentials
    from a provider built in this process (a token that refreshes), checks by OCSP,
    a connection or pool class of its own (Sentinel's...). None when it can."""
    pool = getattr(client, "connection_pool", None)
    kwargs = _redis_connection_kwargs(client)
    provider = kwargs.get("credential_provider")
    connection = getattr(getattr(pool, "connection_class", None), "__name__", "")
    if provider is not None:
        return (
            f"the Redis client's credentials come from a {type(provider).__name__} built in "
            "this process, which another process cannot rebuild"
        )
    ocsp = [name for name in _REDIS_OCSP_SETTINGS if kwargs.get(name)]
    if ocsp:
        return (
            f"the Redis client checks its server's certificate by OCSP ({', '.join(ocsp)}), "
            "which the renewer process would not do"
        )
    if connection not in _REDIS_CONNECTIONS or type(pool).__name__ not in _REDIS_POOLS:
        return (
            f"the Redis client connects through a {type(pool).__name__} of "
            f"{connection or 'unknown'} connections, which a URL cannot describe"
        )
    return None


def _redis_connection_kwargs(client: Any) -> Mapping[str, Any]:
    kwargs = getattr(getattr(client, "connection_pool", None), "connection_kwargs", None)
    return kwargs if isinstance(kwargs, Mapping) else {}
