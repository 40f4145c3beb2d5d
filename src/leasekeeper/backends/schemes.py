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

from leasekeeper.backends._credentials import (
    AZURE_CONNECTION,
    aws_configuration,
    azure_default_credential,
    missing_variables,
    mns_no_credentials,
)
from leasekeeper.backends.registry import parse_url
from leasekeeper.clock import Clock
from leasekeeper.errors import ConfigError, ReceiveError, ReceiveErrorKind

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

    from leasekeeper.backends.azure import AzureQueueBackend
    from leasekeeper.backends.memory import MemoryQueue
    from leasekeeper.backends.mns import MNSBackend
    from leasekeeper.backends.redis import RedisStreamsBackend
    from leasekeeper.backends.sqs import SQSBackend

__all__ = ["aws_region_of", "azure", "memory", "mns", "redis", "sqs"]

# https://sqs.<region>.amazonaws.com[.cn]/<account>/<name> (and sqs-fips., and the
# legacy <region>.queue.amazonaws.com): the region is the host's.
_AWS_HOST = re.compile(
    r"^(?:sqs(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?|([a-z0-9-]+)\.queue\.amazonaws\.com)$"
)
_FALSE = ("false", "0", "no")


def aws_region_of(host: str) -> str | None:
    """The region of an SQS endpoint host of AWS's, or None for any other host."""
    match = _AWS_HOST.match(host.lower())
    return None if match is None else match.group(1) or match.group(2)


def _host_of(url: str) -> str:
    return url.split("://", 1)[-1].split("/", 1)[0].lower()


def sqs(
    url: str,
    *,
    region: str | None = None,
    endpoint_url: str | None = None,
    client_retries: bool = False,
    max_lease_age: float | None = None,
    clock: Clock | None = None,
    fast_path: bool = True,
) -> SQSBackend:
    """SQS: ``https://sqs.<region>.amazonaws.com/<account>/<name>`` is a queue by its
    URL; ``sqs://<name>`` a queue by its name (GetQueueUrl). Another ``http(s)://``
    URL is taken only when its host is the endpoint's: ``endpoint_url``, else
    ``AWS_ENDPOINT_URL_SQS``, else ``AWS_ENDPOINT_URL`` (a local stand-in, a VPC
    endpoint); any other is a
    ValueError. The region: ``region``, else the URL's, else ``AWS_REGION``, else
    ``AWS_DEFAULT_REGION``, else the SDK's configuration. Credentials come from
    boto3's chain (environment, shared files, instance role), never the URL.
    ``client_retries``, ``max_lease_age`` and ``fast_path``: ``SQSBackend``'s.
    """
    # leasekeeper's module before the SDK's: without it, its ImportError names the extra
    from leasekeeper.backends.sqs import MAX_WAIT_SECONDS, SQSBackend, classify_exception

    parsed = parse_url(
        url,
        what="an SQS queue URL",
        credentials_from="boto3 takes them from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
        "its shared files or an instance role",
    )
    from botocore.config import Config

    endpoint = (  # botocore's order: the service's own variable first
        endpoint_url
        or os.environ.get("AWS_ENDPOINT_URL_SQS")
        or os.environ.get("AWS_ENDPOINT_URL")
        or None
    )
    url_region: str | None = None
    queue_url: str | None = None
    if parsed.scheme == "sqs":
        if not parsed.host or parsed.path:
            raise ValueError(f"{parsed.text!r} is not an SQS queue URL: sqs://<queue name>")
    else:
        url_region = aws_region_of(parsed.host) if parsed.scheme == "https" else None
        own = endpoint is not None and _host_of(endpoint) == _host_of(url)
        if url_region is None and not own:
            raise ValueError(
                f"{parsed.text!r} is not an SQS queue URL: its host is no SQS endpoint "
                "(https://sqs.<region>.amazonaws.com/<account>/<name>; for another "
                "endpoint, pass endpoint_url= or set AWS_ENDPOINT_URL)"
            )
        if len(parsed.path) != 2:
            raise ValueError(f"{parsed.text!r} is not an SQS queue URL: .../<account>/<name>")
        queue_url = url.split("?", 1)[0]
    from botocore.exceptions import NoRegionError

    try:
        client = sqs_client(
            # None: AWS_DEFAULT_REGION, then the shared configuration
            region_name=region or url_region or os.environ.get("AWS_REGION") or None,
            endpoint_url=endpoint,
            config=Config(connect_timeout=5, read_timeout=MAX_WAIT_SECONDS + 10),
        )
    except NoRegionError as exc:  # say which variables, and where on a cluster
        raise ConfigError(f"NoRegionError: {aws_configuration(exc)}") from exc
    if queue_url is None:
        try:
            queue_url = client.get_queue_url(QueueName=parsed.host)["QueueUrl"]
        except Exception as exc:
            kind, detail = classify_exception(exc)
            fatal: ReceiveErrorKind = "fatal" if kind == "fatal" else "retry"
            raise ReceiveError(fatal, detail, operation="GetQueueUrl", service="SQS") from exc
    return SQSBackend(
        client,
        queue_url,
        clock=clock,
        client_retries=client_retries,
        max_lease_age=max_lease_age,
        fast_path=fast_path,
    )


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
) -> MNSBackend:
    """Aliyun MNS: ``mns://<endpoint-host>/<queue>``, over https (``secure=False``, or
    ``?secure=false`` in the URL: http, for a local server). Credentials from this
    process's environment: ``MNS_ACCESS_KEY_ID``, ``MNS_ACCESS_KEY_SECRET`` and
    optionally ``MNS_SECURITY_TOKEN``. The other options: ``MNSBackend``'s."""
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
    access_id = os.environ.get("MNS_ACCESS_KEY_ID")
    access_key = os.environ.get("MNS_ACCESS_KEY_SECRET")
    if not access_id or not access_key:
        raise ConfigError(mns_no_credentials())
    host = parsed.host if parsed.port is None else f"{parsed.host}:{parsed.port}"
    account = Account(
        f"{'https' if secure else 'http'}://{host}",
        access_id,
        access_key,
        os.environ.get("MNS_SECURITY_TOKEN", ""),
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
) -> AzureQueueBackend:
    """Azure Storage Queue: ``azure://<account>/<queue>``, or ``azure:///<queue>`` for
    the account of ``AZURE_STORAGE_CONNECTION_STRING``.

    The client: ``connection_string`` (one without a secret: it travels in the
    spec), else ``AZURE_STORAGE_CONNECTION_STRING`` when it names this account (or
    no account is given), else ``account_url`` (default
    ``https://<account>.queue.core.windows.net``; Azurite and sovereign clouds differ)
    with the credential from ``AZURE_STORAGE_SAS_TOKEN`` or
    ``AZURE_STORAGE_ACCOUNT_KEY``, else that connection string, else
    ``azure.identity.DefaultAzureCredential``.
    """
    from leasekeeper.backends.azure import AzureQueueBackend
    from leasekeeper.backends.spec import SECRET_KEYS

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
    env_conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
    conn = connection_string
    matches = env_conn and (account is None or _connection_account(env_conn) in (account, None))
    if conn is None and account_url is None and matches:
        conn = env_conn
    if conn is not None:
        client = QueueClient.from_connection_string(conn, queue)
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
        credential: Any = os.environ.get("AZURE_STORAGE_SAS_TOKEN") or None
        key = os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
        if credential is None and key:
            name = account or account_url.split("//", 1)[-1].split(".", 1)[0]
            credential = {"account_name": name, "account_key": key}
        if credential is None and env_conn:
            client = QueueClient.from_connection_string(env_conn, queue)
        else:
            if credential is None:  # a ConfigError naming the variables without azure-identity
                credential = azure_default_credential(account_url)
            client = QueueClient(account_url, queue, credential=credential)
    margin: dict[str, Any] = {} if expiry_margin is None else {"expiry_margin": expiry_margin}
    return AzureQueueBackend(client, clock=clock, max_lease_age=max_lease_age, **margin)


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
) -> RedisStreamsBackend:
    """Redis Streams: ``redis://[user:password@]host:port/db?stream=S&group=G``
    (``rediss://`` over TLS; ``stream``, ``group``, ``consumer`` and
    ``visibility_timeout`` in the query or as options; the group defaults to
    "leasekeeper"). Without a password in the URL, ``REDIS_PASSWORD``
    (and ``REDIS_USERNAME``) from the environment, if set: a spec carries none.
    Other query parameters are redis-py's connection options. ``consumer``,
    ``visibility_timeout``: ``RedisStreamsBackend``'s."""
    from leasekeeper.backends.redis import DEFAULT_GROUP, RedisStreamsBackend

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
    if not parsed.password and os.environ.get("REDIS_PASSWORD"):
        options["password"] = os.environ["REDIS_PASSWORD"]
        options["username"] = os.environ.get("REDIS_USERNAME") or None
    client = redis_py.Redis.from_url(base + (f"?{kept}" if kept else ""), **options)
    return RedisStreamsBackend(
        client,
        stream,
        group or parsed.query.get("group") or DEFAULT_GROUP,
        consumer=consumer or parsed.query.get("consumer"),
        visibility_timeout=visibility_timeout,
        clock=clock,
    )
