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

Each imports its backend's SDK when called, so this module needs none. Credentials
never come from a URL (Redis's password aside, which no spec or repr shows): each
factory says where it takes them from, in the process that calls it.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from leasekeeper.backends._credentials import (
    AZURE_CONNECTION,
    aws_configuration,
    azure_default_credential,
    missing_variables,
    mns_no_credentials,
)
from leasekeeper.backends.rebuild import (
    CLIENT_KEY,
    PROXY_CLIENT_KEY,
    PROXY_SETTINGS,
    REDIS_TLS_SETTINGS,
    redis_tls_value,
)
from leasekeeper.backends.shared import host_port
from leasekeeper.backends.urls import parse_url
from leasekeeper.clock import Clock
from leasekeeper.errors import ConfigError, ReceiveError, ReceiveErrorKind

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from leasekeeper.backends.azure import AzureQueueBackend
    from leasekeeper.backends.memory import MemoryQueue
    from leasekeeper.backends.mns import MNSBackend
    from leasekeeper.backends.redis import RedisStreamsBackend
    from leasekeeper.backends.sqs import SQSBackend

__all__ = [
    "aws_region_of",
    "azure",
    "configured_endpoint",
    "memory",
    "mns",
    "redis",
    "sqs",
    "sqs_endpoint",
]

# https://sqs.<region>.amazonaws.com[.cn]/<account>/<name> (and sqs-fips., and the
# legacy <region>.queue.amazonaws.com): the region is the host's.
_AWS_HOST = re.compile(
    r"^(?:sqs(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?|([a-z0-9-]+)\.queue\.amazonaws\.com)$"
)
# sqs.<region>.<any host>: a region named the way AWS's hosts name it (LocalStack's
# sqs.us-east-1.localhost.localstack.cloud).
_REGION_IN_HOST = re.compile(r"^sqs\.([a-z]{2}(?:-[a-z]+)+-\d+)\.")
_FALSE = ("false", "0", "no")


def aws_region_of(host: str) -> str | None:
    """The region of an SQS endpoint host of AWS's, or None for any other host."""
    match = _AWS_HOST.match(host.lower())
    return None if match is None else match.group(1) or match.group(2)


def configured_endpoint(service: str = "sqs") -> str | None:
    """The endpoint botocore would give a client of ``service`` from this process's
    configuration, as boto3 resolves it: ``AWS_ENDPOINT_URL_<SERVICE>``, then
    ``AWS_ENDPOINT_URL``, then the shared config file's ``endpoint_url`` (the
    profile's ``services`` section, then its own); None when none is configured
    (or ``AWS_IGNORE_CONFIGURED_ENDPOINT_URLS`` says to ignore them)."""
    import botocore.session
    from botocore.configprovider import ConfiguredEndpointProvider

    session = botocore.session.get_session()
    if session.get_config_variable("ignore_configured_endpoint_urls"):
        return None
    found = ConfiguredEndpointProvider(
        full_config=session.full_config,
        scoped_config=session.get_scoped_config(),
        client_name=service,
    ).provide()
    return str(found) if found else None


def sqs_endpoint(
    queue_url: str | None, endpoint_url: str | None = None
) -> tuple[str | None, str | None]:
    """(endpoint, region of the URL) for a client of the queue at ``queue_url``
    (None: a queue by name): ``endpoint_url``, else the configured one
    (``configured_endpoint``), else - for an AWS-shaped URL - None (botocore's
    regional endpoint), else the URL's own origin."""
    url_region = None
    if queue_url is not None:
        parts = urlsplit(queue_url)
        url_region = aws_region_of(parts.hostname or "") if parts.scheme == "https" else None
    endpoint = endpoint_url or configured_endpoint()
    if endpoint is None and queue_url is not None and url_region is None:
        endpoint = _origin(queue_url)
    return endpoint, url_region


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"


def sqs(
    url: str,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    client_retries: bool = False,
    max_lease_age: float | None = None,
    clock: Clock | None = None,
    fast_path: bool = True,
    verify: bool | str | None = None,
    defer_client: bool = False,
    **client_options: Any,
) -> SQSBackend:
    """SQS: any ``http(s)://host[:port]/<account>/<name>`` is a queue by its URL;
    ``sqs://<name>`` a queue by its name (GetQueueUrl). The URL is a parameter of
    the calls, which go to the endpoint: ``endpoint_url``, else
    ``AWS_ENDPOINT_URL_SQS``, else ``AWS_ENDPOINT_URL``, else the shared config
    file's ``endpoint_url`` (as botocore resolves it), else - for
    ``https://sqs.<region>.amazonaws.com/...`` - that region's endpoint, else the
    URL's own origin (a local stand-in: ElasticMQ, moto, LocalStack).

    The region: ``region``, else an AWS URL's, else ``AWS_REGION``, else
    ``AWS_DEFAULT_REGION``, else the shared config file's; for a URL that is its
    own endpoint (none configured), us-east-1 when none is set (a local stand-in
    takes any).
    Credentials come from boto3's chain (environment, shared files, instance
    role), never the URL; ``aws_access_key_id``, ``aws_secret_access_key`` and
    ``aws_session_token`` given here are used and never put in the spec.

    The client's settings (``SQSBackend.spec()`` carries a client's own):
    ``retry_mode``, ``max_attempts`` (all attempts, the first included),
    ``connect_timeout`` (default 5 s), ``read_timeout`` (default 30 s),
    ``max_pool_connections``, ``http_proxy`` and ``https_proxy``; a TLS proxy's
    ``proxy_ca_bundle``, ``proxy_client_cert`` (and ``proxy_client_key``, where the
    key is a file of its own) and ``proxy_use_forwarding_for_https``.
    ``verify``: the client's TLS verification (False, or a CA bundle's path);
    ``client_cert`` (and ``client_key``): the certificate it shows an endpoint that
    asks for one.
    ``client_retries``, ``max_lease_age`` and ``fast_path``: ``SQSBackend``'s.

    ``defer_client`` (the renewer process's, from its worker): with fixed keys given,
    an endpoint and a region, no proxy and the ``standard`` retry mode, the hot
    calls go the lean path (``leasekeeper.backends.sqs_http``) and the boto3 client
    is made only when another call needs it - so renewing imports no botocore.
    """
    # leasekeeper's module before the SDK's: without it, its ImportError names the extra
    from leasekeeper.backends.sqs import SQSBackend, classify_exception, unreachable

    parsed = parse_url(
        url,
        what="an SQS queue URL",
        credentials_from="boto3 takes them from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
        "its shared files or an instance role",
    )
    queue_url: str | None = None
    if parsed.scheme == "sqs":
        if not parsed.host or parsed.path:
            raise ValueError(f"{parsed.text!r} is not an SQS queue URL: sqs://<queue name>")
    elif parsed.scheme not in ("http", "https") or not parsed.host or len(parsed.path) != 2:
        raise ValueError(
            f"{parsed.text!r} is not an SQS queue URL: http(s)://host[:port]/<account>/<name>"
        )
    else:
        queue_url = url.strip().split("?", 1)[0]
    unknown = sorted(set(client_options) - _SQS_CLIENT_OPTIONS)
    if unknown:
        raise TypeError(f"sqs(): unexpected option(s) {', '.join(unknown)}")
    configured = endpoint_url or configured_endpoint()
    endpoint, url_region = sqs_endpoint(queue_url, configured)
    region = region or url_region or os.environ.get("AWS_REGION") or None
    if region is None and queue_url is not None:
        # A stand-in's URL that names a region (LocalStack's
        # sqs.<region>.localhost.localstack.cloud) gives it when nothing else does.
        named = _REGION_IN_HOST.match(urlsplit(queue_url).hostname or "")
        region = _default_region() or (named.group(1) if named else None)
    if region is None and configured is None and endpoint is not None:  # the URL's origin
        region = "us-east-1"  # a local stand-in takes any
    where: dict[str, Any] = {"region_name": region, "endpoint_url": endpoint}
    if verify is not None:
        where["verify"] = verify
    client: Any
    if defer_client and fast_path and queue_url is not None and _deferrable(where, client_options):
        client = _deferred_client(where, client_options)
    else:
        client = _made_client(where, client_options)
    if queue_url is None:
        try:
            queue_url = client.get_queue_url(QueueName=parsed.host)["QueueUrl"]
        except Exception as exc:
            kind, detail = classify_exception(exc)
            fatal: ReceiveErrorKind = "fatal" if kind == "fatal" else "retry"
            if fatal == "retry" and unreachable(exc):
                address = host_port(str(getattr(client.meta, "endpoint_url", "") or ""))
                detail = f"could not reach {address} ({detail})"
            raise ReceiveError(fatal, detail, operation="GetQueueUrl", service="SQS") from exc
    return SQSBackend(
        client,
        queue_url,
        clock=clock,
        client_retries=client_retries,
        max_lease_age=max_lease_age,
        fast_path=fast_path,
    )


_SQS_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
_SQS_CLIENT_OPTIONS = frozenset(
    {
        *_SQS_KEYS,
        "retry_mode",
        "max_attempts",
        "connect_timeout",
        "read_timeout",
        "max_pool_connections",
        "http_proxy",
        "https_proxy",
        *PROXY_SETTINGS,
        PROXY_CLIENT_KEY,
        "client_cert",
        CLIENT_KEY,
    }
)


def _made_client(where: dict[str, Any], options: dict[str, Any]) -> SQSClient:
    from botocore.exceptions import NoRegionError

    try:
        return sqs_client(**where, **_sqs_config(options))
    except NoRegionError as exc:  # say which variables, and where on a cluster
        raise ConfigError(f"NoRegionError: {aws_configuration(exc)}") from exc


def _deferrable(where: dict[str, Any], options: dict[str, Any]) -> bool:
    """Can the lean path make the calls alone: fixed keys, an endpoint and a region,
    no proxy, the ``standard`` retry mode?"""
    return bool(
        where["region_name"]
        and where["endpoint_url"]
        and options.get("aws_access_key_id")
        and options.get("aws_secret_access_key")
        and not (options.get("http_proxy") or options.get("https_proxy"))
        and not options.get("client_cert")  # (the lean path presents none)
        and (options.get("retry_mode") or "standard") == "standard"
    )


def _deferred_client(where: dict[str, Any], options: dict[str, Any]) -> Any:
    """The client ``_made_client`` makes, made on first use; the lean path's route and
    keys are the ones that client would have (``_sqs_config``'s defaults)."""
    from leasekeeper.backends.sqs import MAX_WAIT_SECONDS
    from leasekeeper.backends.sqs_http import DeferredClient, Route, StaticCredentials

    route = Route(
        endpoint=str(where["endpoint_url"]),
        region=str(where["region_name"]),
        connect_timeout=options.get("connect_timeout") or 5,
        read_timeout=options.get("read_timeout") or MAX_WAIT_SECONDS + 10,
        max_pool_connections=int(options.get("max_pool_connections") or 10),
        max_attempts=options.get("max_attempts") or None,
        verify=where.get("verify", True),
    )
    keys = StaticCredentials(
        options["aws_access_key_id"],
        options["aws_secret_access_key"],
        options.get("aws_session_token") or None,
    )
    return DeferredClient(lambda: _made_client(where, options), route, keys)


def _default_region() -> str | None:
    """The region botocore finds without being given one (AWS_DEFAULT_REGION, the
    shared config file), or None."""
    import botocore.session

    region = botocore.session.get_session().get_config_variable("region")
    return str(region) if region else None


def _sqs_config(options: dict[str, Any]) -> dict[str, Any]:
    """``sqs_client`` keyword arguments for the factory's client options."""
    from botocore.config import Config

    from leasekeeper.backends.sqs import MAX_WAIT_SECONDS

    settings: dict[str, Any] = {
        "connect_timeout": options.get("connect_timeout") or 5,
        "read_timeout": options.get("read_timeout") or MAX_WAIT_SECONDS + 10,
    }
    retries = {
        key: options[name]
        for key, name in (("mode", "retry_mode"), ("total_max_attempts", "max_attempts"))
        if options.get(name) is not None
    }
    if retries:
        settings["retries"] = retries
    if options.get("max_pool_connections"):
        settings["max_pool_connections"] = options["max_pool_connections"]
    proxies = {
        scheme: options[f"{scheme}_proxy"]
        for scheme in ("http", "https")
        if options.get(f"{scheme}_proxy")
    }
    if proxies:
        settings["proxies"] = proxies
    proxies_config = {name: options[name] for name in PROXY_SETTINGS if options.get(name)}
    if options.get(PROXY_CLIENT_KEY) and proxies_config.get("proxy_client_cert"):
        proxies_config["proxy_client_cert"] = (
            proxies_config["proxy_client_cert"],
            options[PROXY_CLIENT_KEY],
        )
    if proxies_config:
        settings["proxies_config"] = proxies_config
    if options.get("client_cert"):
        cert = options["client_cert"]
        settings["client_cert"] = (cert, options[CLIENT_KEY]) if options.get(CLIENT_KEY) else cert
    keys = {name: options[name] for name in _SQS_KEYS if options.get(name)}
    return {"config": Config(**settings), **keys}


def sqs_client(**options: Any) -> SQSClient:
    """``boto3.client("sqs", **options)`` where this process uses boto3 already (its
    default session, a profile set up in code, is honoured), else the same client
    made by botocore alone: a process that never imports boto3 - the renewer
    process - starts a tenth of a second sooner."""
    boto3 = sys.modules.get("boto3")
    if boto3 is not None:
        client: SQSClient = boto3.client("sqs", **options)
        return client
    import botocore.session

    made: SQSClient = botocore.session.get_session().create_client("sqs", **options)  # type: ignore[assignment]
    return made


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
