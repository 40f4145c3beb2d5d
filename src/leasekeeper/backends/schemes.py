"""The URL schemes leasekeeper installs: one factory ``(url, **options) -> Backend``
per service, registered in the entry-point group ``leasekeeper.backends`` by
leasekeeper's own ``pyproject.toml``, exactly as another package registers its own:

========================================================  ==========================
``https://sqs.<region>.amazonaws.com/<account>/<name>``,  ``sqs`` (also ``https``,
``sqs://<name>``                                          ``http``)
``mns://<endpoint-host>/<queue>``                         ``mns``
``azure://<account>/<queue>``, ``azure:///<queue>``       ``azure``
``memory://<name>``                                       ``memory``
``redis://host:port/db?stream=S&group=G``                 ``redis``, ``rediss``
========================================================  ==========================

Each imports its backend's SDK when called, so this module needs none. SQS's is
its package's own (``leasekeeper.backends.sqs.scheme``), as a plug-in's would be;
``sqs`` here calls it, for code that named it here. Credentials
never come from a URL (Redis's password aside, which no spec or repr shows): each
factory says where it takes them from, in the process that calls it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from leasekeeper.backends.environment import (
    AZURE_CONNECTION,
    azure_default_credential,
    missing_variables,
    mns_no_credentials,
)
from leasekeeper.backends.rebuild import REDIS_TLS_SETTINGS, redis_tls_value
from leasekeeper.backends.urls import parse_url
from leasekeeper.clock import Clock
from leasekeeper.errors import ConfigError

if TYPE_CHECKING:
    from leasekeeper.backends.azure import AzureQueueBackend
    from leasekeeper.backends.memory import MemoryQueue
    from leasekeeper.backends.mns import MNSBackend
    from leasekeeper.backends.redis import RedisStreamsBackend
    from leasekeeper.backends.sqs import SQSBackend

__all__ = [
    "azure",
    "memory",
    "mns",
    "redis",
    "sqs",
]

_FALSE = ("false", "0", "no")


def sqs(url: str, **options: Any) -> SQSBackend:
    """SQS: ``leasekeeper.backends.sqs.scheme.sqs`` (its options are documented
    there), imported when called: the scheme of ``sqs://``, ``https://`` and
    ``http://`` URLs."""
    from leasekeeper.backends.sqs.scheme import sqs as factory

    return factory(url, **options)


def mns(
    url: str,
    *,
    secure: bool | None = None,
    queue_visibility_timeout: float | None = None,
    max_lease_age: float | None = None,
    clock: Clock | None = None,
    access_key_id: str | None = None,
    access_key_secret: str | None = None,
    security_token: str | None = None,
) -> MNSBackend:
    """Aliyun MNS: ``mns://<endpoint-host>/<queue>``, over https (``secure=False``, or
    ``?secure=false`` in the URL: http, for a local server). Credentials:
    ``access_key_id``, ``access_key_secret`` and ``security_token`` (never put in
    the spec), else this process's environment: ``MNS_ACCESS_KEY_ID``,
    ``MNS_ACCESS_KEY_SECRET`` and optionally ``MNS_SECURITY_TOKEN``. The other
    options: ``MNSBackend``'s."""
    from leasekeeper.backends.mns import MNSBackend

    parsed = parse_url(
        url,
        what="an MNS queue URL",
        credentials_from="set MNS_ACCESS_KEY_ID and MNS_ACCESS_KEY_SECRET",
    )
    if not parsed.host or len(parsed.path) != 1:
        raise ValueError(f"{parsed.text!r} is not an MNS queue URL: mns://<endpoint-host>/<queue>")
    from mns.account import Account

    if secure is None:
        secure = parsed.query.get("secure", "true").lower() not in _FALSE
    access_id = access_key_id or os.environ.get("MNS_ACCESS_KEY_ID")
    access_key = access_key_secret or os.environ.get("MNS_ACCESS_KEY_SECRET")
    if not access_id or not access_key:
        raise ConfigError(mns_no_credentials())
    if access_key_id is None:
        security_token = os.environ.get("MNS_SECURITY_TOKEN")
    host = parsed.host if parsed.port is None else f"{parsed.host}:{parsed.port}"
    account = Account(
        f"{'https' if secure else 'http'}://{host}", access_id, access_key, security_token or ""
    )
    return MNSBackend(
        account.get_queue(parsed.path[0]),
        clock=clock,
        queue_visibility_timeout=queue_visibility_timeout,
        max_lease_age=max_lease_age,
    )


def _connection_account(conn: str) -> str | None:
    """The AccountName a connection string names (devstoreaccount1 for the
    development storage shortcut), or None."""
    fields = dict(part.split("=", 1) for part in conn.split(";") if "=" in part)
    if fields.get("UseDevelopmentStorage", "").lower() == "true":
        return "devstoreaccount1"
    return fields.get("AccountName")


def azure(
    url: str,
    *,
    account_url: str | None = None,
    connection_string: str | None = None,
    expiry_margin: float | None = None,
    max_lease_age: float | None = None,
    clock: Clock | None = None,
    account_key: str | None = None,
    sas_token: str | None = None,
    retry_total: int | None = None,
    connection_timeout: float | None = None,
    read_timeout: float | None = None,
    http_proxy: str | None = None,
    https_proxy: str | None = None,
    connection_verify: bool | str | None = None,
    credential: str | None = None,
    client_id: str | None = None,
    api_version: str | None = None,
    connection_cert: str | None = None,
    connection_key: str | None = None,
) -> AzureQueueBackend:
    """Azure Storage Queue: ``azure://<account>/<queue>``, or ``azure:///<queue>`` for
    the account of ``AZURE_STORAGE_CONNECTION_STRING``.

    The client: ``connection_string`` (one without a secret: it travels in the
    spec), else ``AZURE_STORAGE_CONNECTION_STRING`` when it names this account (or
    no account is given), else ``account_url`` (default
    ``https://<account>.queue.core.windows.net``; Azurite and sovereign clouds differ)
    with the credential from ``AZURE_STORAGE_SAS_TOKEN`` or
    ``AZURE_STORAGE_ACCOUNT_KEY``, else that connection string, else
    ``azure.identity.DefaultAzureCredential``. ``account_key`` or ``sas_token``
    given here come first (and are never put in the spec). ``retry_total``,
    ``connection_timeout``, ``read_timeout``, ``http_proxy``, ``https_proxy`` and
    ``connection_verify`` (False, or a CA bundle's path), ``api_version`` (the
    service version its requests name) and ``connection_cert`` (a client
    certificate, with ``connection_key`` where the key is a file of its own): the
    queue client's.
    ``credential`` names an azure-identity credential to use instead of the
    environment's key or connection string (``DefaultAzureCredential``,
    ``ManagedIdentityCredential``, ``WorkloadIdentityCredential``,
    ``EnvironmentCredential``, ``AzureCliCredential``), made with the user-assigned
    identity ``client_id`` where one is given: a spec names the credential the
    client was built with.
    """
    from leasekeeper.backends.azure import AzureQueueBackend
    from leasekeeper.backends.spec import SECRET_KEYS

    token = None if credential is None else _azure_token_credential(credential, client_id)
    if client_id is not None and credential is None:
        raise ValueError(
            "client_id is a user-assigned identity's for the credential named by "
            "credential=, and none is named"
        )

    parsed = parse_url(
        url,
        what="an Azure queue URL",
        credentials_from="set AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_SAS_TOKEN "
        "or AZURE_STORAGE_ACCOUNT_KEY",
    )
    if len(parsed.path) != 1 or parsed.query:
        raise ValueError(f"{parsed.text!r} is not an Azure queue URL: azure://<account>/<queue>")
    if connection_string is not None and any(k in connection_string.lower() for k in SECRET_KEYS):
        raise ValueError(
            "connection_string holds a secret, which a spec would carry: set "
            "AZURE_STORAGE_CONNECTION_STRING in the environment instead"
        )
    from azure.storage.queue import QueueClient

    queue, account = parsed.path[0], parsed.host or None
    settings: dict[str, Any] = {
        name: value
        for name, value in (
            ("retry_total", retry_total),
            ("connection_timeout", connection_timeout),
            ("read_timeout", read_timeout),
            ("connection_verify", connection_verify),
            ("api_version", api_version),
        )
        if value is not None
    }
    proxies = {scheme: url for scheme, url in (("http", http_proxy), ("https", https_proxy)) if url}
    if proxies:
        settings["proxies"] = proxies
    if connection_cert:
        settings["connection_cert"] = (
            (connection_cert, connection_key) if connection_key else connection_cert
        )
    env_conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    conn = connection_string
    matches = env_conn and (account is None or _connection_account(env_conn) in (account, None))
    given = account_key or sas_token
    if conn is None and account_url is None and matches and not given and token is None:
        conn = env_conn
    if conn is not None:
        if token is not None and not given:
            settings["credential"] = token
        client = QueueClient.from_connection_string(conn, queue, **settings)
    else:
        if account_url is None and account is None:
            raise ConfigError(
                missing_variables(
                    f"{parsed.text!r} names no account (azure://<account>/<queue>) and this "
                    "process has no connection string",
                    [AZURE_CONNECTION],
                )
            )
        account_url = account_url or f"https://{account}.queue.core.windows.net"
        secret: Any = sas_token or None
        from_env = not given and token is None  # a credential named comes before them
        key = account_key or (os.environ.get("AZURE_STORAGE_ACCOUNT_KEY") if from_env else None)
        if secret is None and not key and from_env:
            secret = os.environ.get("AZURE_STORAGE_SAS_TOKEN") or None
        if secret is None and key:
            name = account or account_url.split("//", 1)[-1].split(".", 1)[0]
            secret = {"account_name": name, "account_key": key}
        if secret is None and env_conn and from_env:
            client = QueueClient.from_connection_string(env_conn, queue, **settings)
        else:
            if secret is None:  # a ConfigError naming the variables without azure-identity
                secret = token if token is not None else azure_default_credential(account_url)
            client = QueueClient(account_url, queue, credential=secret, **settings)
    margin: dict[str, Any] = {} if expiry_margin is None else {"expiry_margin": expiry_margin}
    return AzureQueueBackend(client, clock=clock, max_lease_age=max_lease_age, **margin)


def _azure_token_credential(name: str, client_id: str | None) -> Any:
    """azure-identity's credential ``name`` (one of ``REBUILT_CREDENTIALS``), for
    the user-assigned identity ``client_id`` where given."""
    from leasekeeper.backends.azure_identity import REBUILT_CREDENTIALS, make_credential

    if name not in REBUILT_CREDENTIALS:
        raise ValueError(
            f"credential={name!r} is not one of azure-identity's credentials a queue URL "
            f"can name: {', '.join(sorted(REBUILT_CREDENTIALS))}"
        )
    try:
        import azure.identity
    except ImportError:
        raise ConfigError(
            f"credential={name!r} names an azure-identity credential, and azure-identity "
            "is not installed here: pip install azure-identity"
        ) from None
    return make_credential(getattr(azure.identity, name), client_id)


def memory(url: str, **options: Any) -> MemoryQueue:
    """``memory://<name>``: the process-wide MemoryQueue of that name, made with
    ``options`` (``MemoryQueue``'s) on first use. It lives in this process only: no
    spec, no other process can reach it."""
    from leasekeeper.backends.memory import named_queue

    parsed = parse_url(url, what="a memory queue URL")
    if not parsed.host or parsed.path or parsed.query or parsed.username:
        raise ValueError(f"{parsed.text!r} is not a memory queue URL: memory://<name>")
    return named_queue(parsed.host, **options)


def redis(
    url: str,
    *,
    stream: str | None = None,
    group: str | None = None,
    consumer: str | None = None,
    visibility_timeout: float = 30.0,
    clock: Clock | None = None,
    password: str | None = None,
    unix_socket_path: str | None = None,
    ssl_password: str | None = None,
    **tls: Any,
) -> RedisStreamsBackend:
    """Redis Streams: ``redis://[user:password@]host:port/db?stream=S&group=G``
    (``rediss://`` over TLS; ``stream``, ``group``, ``consumer`` and
    ``visibility_timeout`` in the query or as options; the group defaults to
    "leasekeeper"). The password: ``password`` (never put in the spec), else the
    URL's, else ``REDIS_PASSWORD`` (and ``REDIS_USERNAME``) from the environment,
    if set: a spec carries none.
    Other query parameters are redis-py's connection options. ``consumer``,
    ``visibility_timeout``: ``RedisStreamsBackend``'s. ``unix_socket_path``: the
    server's unix socket, instead of the URL's host and port. redis-py's TLS
    options (``ssl_ca_certs``, ``ssl_certfile``, ``ssl_keyfile``,
    ``ssl_cert_reqs``...: ``rebuild.REDIS_TLS_SETTINGS``) and ``ssl_password`` (the
    key's, never put in the spec) are the client's."""
    from leasekeeper.backends.redis import DEFAULT_GROUP, RedisStreamsBackend

    unknown = sorted(set(tls) - set(REDIS_TLS_SETTINGS))
    if unknown:
        raise TypeError(f"redis(): unexpected option(s) {', '.join(unknown)}")
    parsed = parse_url(url, what="a Redis Streams URL")
    stream = stream or parsed.query.get("stream")
    if not stream:
        raise ValueError(f"{parsed.text!r} names no stream: redis://host:port/db?stream=S&group=G")
    import redis as redis_py

    ours = ("stream", "group", "consumer", "visibility_timeout")
    base, _, query = url.partition("?")
    kept = "&".join(p for p in query.split("&") if p.split("=")[0] not in ours)
    if "visibility_timeout" in parsed.query:  # a command line names its queue by URL alone
        visibility_timeout = float(parsed.query["visibility_timeout"])
    options: dict[str, Any] = {"socket_timeout": 10.0}
    options.update((name, redis_tls_value(name, value)) for name, value in tls.items())
    if ssl_password:
        options["ssl_password"] = ssl_password
    if unix_socket_path:  # redis-py's own URL for it: unix://[user@]/path?db=N
        user = f"{quote(parsed.username, safe='')}@" if parsed.username else ""
        db = parsed.path[0] if parsed.path else "0"
        base = f"unix://{user}{unix_socket_path}?db={db}"
        if parsed.password and not password:
            options["password"] = parsed.password
    if password:
        options["password"] = password
    elif not parsed.password and os.environ.get("REDIS_PASSWORD"):
        options["password"] = os.environ["REDIS_PASSWORD"]
        options["username"] = os.environ.get("REDIS_USERNAME") or None
    joiner = "&" if "?" in base else "?"
    client = redis_py.Redis.from_url(base + (f"{joiner}{kept}" if kept else ""), **options)
    return RedisStreamsBackend(
        client,
        stream,
        group or parsed.query.get("group") or DEFAULT_GROUP,
        consumer=consumer or parsed.query.get("consumer"),
        visibility_timeout=visibility_timeout,
        clock=clock,
    )
