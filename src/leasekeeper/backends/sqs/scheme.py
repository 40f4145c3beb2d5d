"""The ``sqs`` URL scheme (also ``https`` and ``http``): ``sqs(url, **options)``
makes the ``SQSBackend`` of a queue URL, registered in the entry-point group
``leasekeeper.backends`` as ``leasekeeper.backends.sqs.scheme:sqs``, as a plug-in
backend registers its own; and how it finds the endpoint and region a client of
that queue needs, as botocore would.
"""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from leasekeeper.backends.cloud import unreachable
from leasekeeper.backends.rebuild import CLIENT_KEY, PROXY_CLIENT_KEY, PROXY_SETTINGS
from leasekeeper.backends.shared import host_port
from leasekeeper.backends.sqs.backend import MAX_WAIT_SECONDS, SQSBackend
from leasekeeper.backends.sqs.credentials import aws_configuration
from leasekeeper.backends.sqs.deferred import DeferredClient, StaticCredentials
from leasekeeper.backends.sqs.errors import classify_exception
from leasekeeper.backends.sqs.lean import Route
from leasekeeper.backends.urls import parse_url
from leasekeeper.clock import Clock
from leasekeeper.errors import ConfigError, ReceiveError, ReceiveErrorKind

if TYPE_CHECKING:
    from mypy_boto3_sqs import SQSClient

__all__ = ["aws_region_of", "configured_endpoint", "sqs", "sqs_client", "sqs_endpoint"]

# https://sqs.<region>.amazonaws.com[.cn]/<account>/<name> (and sqs-fips., and the
# legacy <region>.queue.amazonaws.com): the region is the host's.
_AWS_HOST = re.compile(
    r"^(?:sqs(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?|([a-z0-9-]+)\.queue\.amazonaws\.com)$"
)
# sqs.<region>.<any host>: a region named the way AWS's hosts name it (LocalStack's
# sqs.us-east-1.localhost.localstack.cloud).
_REGION_IN_HOST = re.compile(r"^sqs\.([a-z]{2}(?:-[a-z]+)+-\d+)\.")


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
    lean_user_agent: str | None = None,
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
    ``max_pool_connections``, ``user_agent_extra`` and ``user_agent_appid``,
    ``http_proxy`` and ``https_proxy``; a TLS proxy's
    ``proxy_ca_bundle``, ``proxy_client_cert`` (and ``proxy_client_key``, where the
    key is a file of its own) and ``proxy_use_forwarding_for_https``.
    ``verify``: the client's TLS verification (False, or a CA bundle's path);
    ``client_cert`` (and ``client_key``): the certificate it shows an endpoint that
    asks for one.
    ``client_retries``, ``max_lease_age`` and ``fast_path``: ``SQSBackend``'s.

    ``defer_client`` (the renewer process's, from its worker): with fixed keys given,
    an endpoint and a region, no proxy and the ``standard`` retry mode, the hot
    calls go the lean path (``leasekeeper.backends.sqs.lean``) and the boto3 client
    is made only when another call needs it - so renewing imports no botocore;
    ``lean_user_agent``: the User-Agent that path sends (the worker's client's).
    """
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
        client = _deferred_client(where, client_options, lean_user_agent)
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
        "user_agent_extra",
        "user_agent_appid",
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


def _deferred_client(where: dict[str, Any], options: dict[str, Any], user_agent: str | None) -> Any:
    """The client ``_made_client`` makes, made on first use; the lean path's route and
    keys are the ones that client would have (``_sqs_config``'s defaults)."""
    route = Route(
        endpoint=str(where["endpoint_url"]),
        region=str(where["region_name"]),
        connect_timeout=options.get("connect_timeout") or 5,
        read_timeout=options.get("read_timeout") or MAX_WAIT_SECONDS + 10,
        max_pool_connections=int(options.get("max_pool_connections") or 10),
        max_attempts=options.get("max_attempts") or None,
        verify=where.get("verify", True),
        user_agent=user_agent,
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
    for name in ("user_agent_extra", "user_agent_appid"):
        if options.get(name):
            settings[name] = options[name]
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
