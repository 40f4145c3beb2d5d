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

import contextlib
import ssl
from collections.abc import Mapping
from typing import Any

from leasekeeper.backends._credentials import (
    aws_configuration,
    aws_credentials_problem,
    azure_credentials_problem,
)
from leasekeeper.backends.azure_identity import REBUILT_CREDENTIALS, credential_options
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
    "mns_credentials_given",
    "mns_renewal_problem",
    "mns_secrets",
    "redis_renewal_problem",
    "redis_secrets",
    "redis_settings",
    "redis_tls_value",
    "sqs_credentials_problem",
    "sqs_secrets",
    "sqs_settings",
    "sqs_verify",
]

# Where botocore's own chain finds credentials: the renewer process, on this
# machine with this environment, finds refreshing ones of these kinds itself.
_AWS_CHAIN_METHODS = frozenset(
    {
        "env",
        "shared-credentials-file",
        "config-file",
        "assume-role",
        "assume-role-with-web-identity",
        "sso",
        "iam-role",
        "container-role",
        "custom-process",
        "boto-config",
        "ec2-credentials-file",
    }
)


def _proxies(proxies: object) -> dict[str, str]:
    """``http_proxy``/``https_proxy`` options of a proxies dict (password kept)."""
    if not isinstance(proxies, Mapping):
        return {}
    return {
        f"{scheme}_proxy": str(url)
        for scheme, url in proxies.items()
        if scheme in ("http", "https") and url
    }


def sqs_settings(client: Any) -> dict[str, Any]:
    """The factory options (``leasekeeper.backends.schemes.sqs``) that make a client
    like ``client``: endpoint, region, retry mode and attempts, timeouts, pool
    size, TLS verification and client certificate, proxies and their TLS settings.
    The proxies keep their password: a spec drops it (``public_options``),
    ``sqs_secrets`` sends it to the renewer process."""
    meta = getattr(client, "meta", None)
    config = getattr(meta, "config", None)
    retries = getattr(config, "retries", None)
    retries = retries if isinstance(retries, Mapping) else {}
    return {
        "region": getattr(meta, "region_name", None),
        "endpoint_url": getattr(meta, "endpoint_url", None),
        "retry_mode": retries.get("mode"),
        "max_attempts": retries.get("total_max_attempts"),
        "connect_timeout": getattr(config, "connect_timeout", None),
        "read_timeout": getattr(config, "read_timeout", None),
        "max_pool_connections": getattr(config, "max_pool_connections", None),
        "verify": _verify_setting(client),
        **_proxies(getattr(config, "proxies", None)),
        **_proxy_settings(getattr(config, "proxies_config", None)),
        **_certificate(getattr(config, "client_cert", None), "client_cert", CLIENT_KEY),
    }


# botocore's ``Config(proxies_config=...)``, one factory option each: the CA bundle
# and client certificate (and its key, where given apart) for a TLS proxy, and
# forwarding (``schemes.sqs`` gives them back).
PROXY_SETTINGS = ("proxy_ca_bundle", "proxy_client_cert", "proxy_use_forwarding_for_https")
PROXY_CLIENT_KEY = "proxy_client_key"
# botocore's ``Config(client_cert=...)``'s key, where it is a file of its own: the
# factory option beside ``client_cert`` (a certificate the endpoint asks for).
CLIENT_KEY = "client_key"
CONNECTION_KEY = "connection_key"  # the same for an Azure client's ``connection_cert``


def _proxy_settings(proxies_config: object) -> dict[str, Any]:
    """The factory options of botocore's ``proxies_config``: a TLS proxy's CA bundle
    and client certificate (a (certificate, key) pair as two options), forwarding."""
    if not isinstance(proxies_config, Mapping):
        return {}
    settings = {name: proxies_config.get(name) for name in PROXY_SETTINGS}
    cert = settings.pop("proxy_client_cert")
    return {**settings, **_certificate(cert, "proxy_client_cert", PROXY_CLIENT_KEY)}


def _certificate(cert: object, cert_name: str, key_name: str) -> dict[str, Any]:
    """A client certificate's factory options: ``{cert_name: path}``, or for a
    (certificate, key) pair, the key's path as ``key_name`` too."""
    if isinstance(cert, (tuple, list)) and len(cert) == 2:  # (cert, key)
        return {cert_name: cert[0], key_name: cert[1]}
    return {cert_name: cert} if isinstance(cert, str) else {}


def sqs_verify(client: Any) -> bool | str:
    """``client``'s TLS verification: False, True, or the CA bundle's path (botocore
    keeps it on the client's HTTP session)."""
    endpoint = getattr(client, "_endpoint", None)
    verify = getattr(getattr(endpoint, "http_session", None), "_verify", True)
    return verify if isinstance(verify, (bool, str)) else True


def _verify_setting(client: Any) -> bool | str | None:
    """The ``verify`` another process must be given to make ``client``'s calls: False,
    or a CA bundle other than the one its own configuration names (``AWS_CA_BUNDLE``,
    the config file's ``ca_bundle``, which it reads itself); None when it needs none
    (an ``http`` endpoint's client too)."""
    endpoint = str(getattr(getattr(client, "meta", None), "endpoint_url", ""))
    if not endpoint.startswith("https:"):
        return None
    verify = sqs_verify(client)
    if verify is False or not isinstance(verify, str):
        return False if verify is False else None
    import botocore.session

    own = botocore.session.get_session().get_config_variable("ca_bundle")
    return None if own == verify else verify


def _aws_credentials(client: Any) -> Any:
    # botocore keeps a client's credentials only on its request signer.
    return getattr(getattr(client, "_request_signer", None), "_credentials", None)


def _refreshes(credentials: object) -> bool:
    return callable(getattr(credentials, "refresh_needed", None))


def sqs_secrets(client: Any) -> dict[str, Any]:
    """What the renewer process needs to make ``client`` and cannot find itself:
    fixed keys (given in code, from a profile chosen in code...), a proxy's URL
    with its password. Refreshing credentials are not sent (they would expire)."""
    secrets: dict[str, Any] = {
        name: url for name, url in _proxies_of(client).items() if redact_url(url) != url
    }
    credentials = _aws_credentials(client)
    if credentials is not None and not _refreshes(credentials):
        frozen = credentials.get_frozen_credentials()
        secrets["aws_access_key_id"] = frozen.access_key
        secrets["aws_secret_access_key"] = frozen.secret_key
        if frozen.token:
            secrets["aws_session_token"] = frozen.token
    return secrets


def _proxies_of(client: Any) -> dict[str, str]:
    config = getattr(getattr(client, "meta", None), "config", None)
    return _proxies(getattr(config, "proxies", None))


def sqs_credentials_problem(client: Any) -> str | None:
    """Why the renewer process could not have ``client``'s credentials: they refresh
    through a provider built in this process (not one of botocore's chain), or
    through one its own chain would not find (a role assumed through a profile
    chosen in code); or, with none on the client, none in the environment either.
    None when it can."""
    credentials = _aws_credentials(client)
    if credentials is None:
        return aws_credentials_problem()
    if not _refreshes(credentials):
        return None  # sent to it (sqs_secrets)
    method = str(getattr(credentials, "method", "") or "")
    if method not in _AWS_CHAIN_METHODS:
        return (
            f"the client's AWS credentials refresh through a provider built in this process "
            f"({method or 'custom'}), which another process cannot rebuild"
        )
    return _chain_problem(credentials, method)


def _chain_problem(credentials: object, method: str) -> str | None:
    """Why the renewer process's own chain would not give it ``credentials``, which
    refresh through a ``method`` of botocore's chain. It builds them from the same
    environment and files as this process: only right when this process's chain
    finds them. A profile chosen in code (``boto3.Session(profile_name=...)``) that
    assumes a role is one it would not find: it would renew as whoever the default
    chain names."""
    import botocore.exceptions
    import botocore.session

    try:
        found = botocore.session.get_session().get_credentials()
    except botocore.exceptions.BotoCoreError as exc:
        return f"{type(exc).__name__}: {aws_configuration(exc)}"
    if found is None:
        return aws_credentials_problem()
    if _source_of(found) != _source_of(credentials):
        return (
            f"the client's AWS credentials ({method}) are not the ones this process's own "
            f"chain finds ({getattr(found, 'method', None) or 'others'}): a profile or role "
            "chosen in code, which the renewer process would not use (it would renew as "
            "another identity); name the profile in AWS_PROFILE for it to use the same"
        )
    return None


# What tells two refreshing credentials' sources apart: the role, SSO account or
# profile their fetcher was made for (botocore keeps them on it).
_SOURCE_FIELDS = ("_role_arn", "_start_url", "_account_id", "_role_name", "_profile_name")


def _source_of(credentials: object) -> tuple[object, ...]:
    """Where refreshing ``credentials`` come from, as far as it tells identities apart:
    their method, the function that refreshes them, the role, SSO account or profile
    its object was made for, and the text it closes over (a credential process's
    command). Two of the same role made at different times compare equal."""
    refresh = getattr(credentials, "_refresh_using", None)
    owner = getattr(refresh, "__self__", None)
    marks: list[object] = [getattr(credentials, "method", None)]
    marks.append(getattr(refresh, "__qualname__", type(refresh).__qualname__))
    marks.extend(str(getattr(owner, name, None)) for name in _SOURCE_FIELDS)
    for cell in getattr(refresh, "__closure__", None) or ():
        with contextlib.suppress(ValueError):  # (an empty cell)
            if isinstance(cell.cell_contents, str):
                marks.append(cell.cell_contents)
    return tuple(marks)


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
        **_certificate(transport.get("connection_cert"), "connection_cert", CONNECTION_KEY),
        **_proxies(transport.get("proxies")),
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
    proxies = _proxies(azure_transport_options(queue_client).get("proxies"))
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
