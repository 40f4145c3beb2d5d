"""The lean call path: SQS's hot calls over a pooled connection, without botocore's
per-call machinery.

A worker spends its day on three calls: ReceiveMessage, DeleteMessageBatch and
ChangeMessageVisibilityBatch. Through a boto3 client each one goes through about
a dozen event hooks, parameter validation, the model-driven serialiser and parser
and a fresh request object, which costs more CPU than the work of the call.
``LeanPath`` makes the same calls as botocore would put them on the wire, the
AWS JSON 1.0 protocol (``X-Amz-Target: AmazonSQS.<operation>``,
``Content-Type: application/x-amz-json-1.0``, ``x-amzn-query-mode: true``),
with what matters of the client kept:

- its credentials object, frozen for every request as botocore's signer does (a
  refreshable one refreshes itself), signed as botocore's SigV4 signer signs
  (``sigv4.RequestSigner``: the same signature, the signing key derived once a day);
- its resolved endpoint and region, its connect and read timeouts and pool size,
  its TLS verification, over keep-alive connections of our own
  (``keepalive.KeepAlivePool``: no email-parsed headers, no urllib3 objects);
- botocore's ``standard`` retry mode, built from botocore's own classes with the
  client's max attempts: retries on throttling, 5xx and connection errors, with
  exponential backoff and jitter, and a retry quota;
- errors as botocore raises them: a ``ClientError`` (the client's modeled class)
  whose ``Error.Code`` is the legacy query code from the ``x-amzn-query-error``
  header and ``Error.QueryErrorCode`` the JSON ``__type``, and botocore's
  connection errors, so the backend classifies both paths with one table.

``lean_path(client)`` answers the path for a client, or None where the client's
configuration cannot be honoured here (``why_not(client)`` says why): proxies, a
client certificate, TCP keep-alive, another signature version or retry mode, a
protocol other than JSON. ``LeanPath.usable()`` is checked on every call: hooks
registered on the client's events beyond botocore's own (a botocore Stubber,
moto's in-process mock, your instrumentation) send the calls back through the
client. Nothing here logs a request's body: it carries receipts.

The client's own path keeps one thing here too: ``one_attempt``, the botocore
``needs-retry`` hook that ends leasekeeper's own batch calls after one attempt
(``OWN_CALL.active`` marks them), as ``LeanPath.call(retries=False)`` does.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import ssl
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from types import ModuleType
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote, urlsplit

from leasekeeper.backends.sqs.keepalive import ExchangeError, KeepAlivePool
from leasekeeper.backends.sqs.rebuild import sqs_verify
from leasekeeper.backends.sqs.sigv4 import RequestSigner


class LazyModule:
    """A module imported on the first use of one of its names: botocore's exceptions
    are needed when a call fails, and the renewer process, which makes the lean
    path's calls alone, never imports botocore until one does."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._module: ModuleType | None = None

    def __getattr__(self, attribute: str) -> Any:
        module = self._module
        if module is None:
            module = self._module = importlib.import_module(self.name)
        return getattr(module, attribute)


if TYPE_CHECKING:
    from botocore import exceptions as boto
else:
    boto = LazyModule("botocore.exceptions")

__all__ = [
    "CLIENT_METHODS",
    "HOT_OPERATIONS",
    "DeferredClient",
    "StaticCredentials",
    "LazyModule",
    "Route",
    "OWN_CALL",
    "OWN_OPERATIONS",
    "one_attempt",
    "one_attempt_on",
    "LeanPath",
    "lean_path",
    "parse_error",
    "renewal_options",
    "route_of",
    "why_not",
]

log = logging.getLogger("leasekeeper.backends.sqs")

#: The calls the lean path makes, and the client's method each stands in for; every
#: other call goes through the client.
CLIENT_METHODS = {
    "ReceiveMessage": "receive_message",
    "DeleteMessageBatch": "delete_message_batch",
    "ChangeMessageVisibilityBatch": "change_message_visibility_batch",
    "DeleteMessage": "delete_message",
    "ChangeMessageVisibility": "change_message_visibility",
}
HOT_OPERATIONS = frozenset(CLIENT_METHODS)
# One encoder and decoder for every call (json.dumps and json.loads build or look
# up theirs, and sniff the encoding of bytes, on each one).
_ENCODER = json.JSONEncoder(separators=(",", ":"))
_DECODER = json.JSONDecoder()
JSON_CONTENT_TYPE = "application/x-amz-json-1.0"
_DEFAULT_MAX_ATTEMPTS = 3  # botocore's standard retry mode's, the first attempt included
_TARGET = "AmazonSQS."
# The events a botocore call emits; a handler on one of them that botocore did not
# register itself changes what the call does, so the lean path must not skip it.
_CALL_EVENTS = (
    "provide-client-params",
    "before-parameter-build",
    "before-endpoint-resolution",
    "before-call",
    "request-created",
    "choose-signer",
    "before-sign",
    "before-send",
    "response-received",
    "needs-retry",
    "after-call",
    "after-call-error",
    "before-parse",
)
# Handlers of these modules are the client's own (leasekeeper's one-attempt hook
# included); botocore.stub is a test double that answers instead of the service.
_OWN_MODULES = ("botocore.", "leasekeeper.backends.sqs")
_FOREIGN_MODULES = ("botocore.stub",)


class _Answer(NamedTuple):
    """The part of an HTTP answer botocore's retry classes read."""

    status_code: int
    headers: Mapping[str, str]


class Route(NamedTuple):
    """Where and how the lean path sends a client's calls, in plain values (so the
    renewer process can be given them): the resolved endpoint and region, the
    timeouts and pool size, the attempts of botocore's ``standard`` retry mode and
    ``verify``: False, True (an http endpoint) or the CA bundle's path."""

    endpoint: str
    region: str
    connect_timeout: float | None
    read_timeout: float | None
    max_pool_connections: int
    max_attempts: int | None
    verify: bool | str


def route_of(client: Any) -> Route:
    """The route of ``client``'s calls (one ``why_not`` finds no reason against)."""
    meta = client.meta
    config = meta.config
    endpoint = str(meta.endpoint_url)
    verify: bool | str = True
    if urlsplit(endpoint).scheme == "https":
        verify = sqs_verify(client)
        if verify is not False:
            from botocore.httpsession import get_cert_path  # the client's, loaded already

            verify = str(get_cert_path(verify))  # type: ignore[arg-type]  # a path too
    attempts = (config.retries or {}).get("total_max_attempts")
    return Route(
        endpoint=endpoint,
        region=str(meta.region_name or "us-east-1"),
        connect_timeout=config.connect_timeout,
        read_timeout=config.read_timeout,
        max_pool_connections=int(config.max_pool_connections or 10),
        max_attempts=int(attempts) if attempts else None,
        verify=verify,
    )


def why_not(client: Any) -> str | None:
    """Why the lean path cannot make ``client``'s calls as the client would, or None."""
    import urllib.request  # (here: the renewer process never asks)

    meta = getattr(client, "meta", None)
    config = getattr(meta, "config", None)
    model = getattr(meta, "service_model", None)
    if meta is None or config is None or model is None:
        return "not a botocore client"
    protocol = getattr(model, "protocol", None)
    signature = str(getattr(config, "signature_version", None) or "v4")
    mode = (getattr(config, "retries", None) or {}).get("mode", "standard")
    parts = urlsplit(str(getattr(meta, "endpoint_url", "") or ""))
    host = parts.hostname or ""
    environment_proxy = parts.scheme in urllib.request.getproxies() and not (
        urllib.request.proxy_bypass(host)
    )
    reasons = [
        (protocol != "json", f"the client speaks {protocol!r}, not 'json'"),
        (_credentials_of(client) is _NO_SIGNER, "the client's signer is not reachable"),
        (signature not in ("v4", "sigv4"), f"signature version {signature!r}"),
        (mode != "standard", f"retry mode {mode!r} (the lean path mirrors 'standard' only)"),
        *(
            (bool(getattr(config, setting, None)), f"the client's {setting}")
            for setting in _UNHONOURED
        ),
        (parts.scheme not in ("http", "https") or not host, "no http(s) endpoint"),
        (environment_proxy, "a proxy from the environment"),
    ]
    return next((reason for found, reason in reasons if found), None)


# Client settings the lean path has no equivalent for: such a client keeps its calls.
_UNHONOURED = (
    "proxies",
    "proxies_config",
    "client_cert",
    "tcp_keepalive",
    "sigv4a_signing_region_set",
)


_NO_SIGNER = object()


def _credentials_of(client: Any) -> Any:
    """The client's own credentials object (None: it has none), as its signer holds it."""
    signer = getattr(client, "_request_signer", None)
    if signer is None or not hasattr(signer, "_credentials"):
        return _NO_SIGNER
    return signer._credentials


def _handler_modules(handlers: Iterable[Any]) -> Iterable[str]:
    for handler in handlers:
        function = getattr(handler, "__func__", handler)
        yield str(getattr(function, "__module__", "") or "")


def foreign_hooks(events: Any) -> bool:
    """Does the client's event system call a handler botocore (or leasekeeper's SQS
    backend) did not register on the events of an SQS call? Reads botocore's
    handler table; anything unreadable counts as a foreign hook."""
    return bool(foreign_hook_modules(events, HOT_OPERATIONS))


# The calls the renewer process makes for the workers (a release is a visibility change).
RENEWAL_OPERATIONS = (
    "ChangeMessageVisibility",
    "ChangeMessageVisibilityBatch",
    "DeleteMessage",
    "DeleteMessageBatch",
)


def foreign_hook_modules(events: Any, operations: Iterable[str]) -> list[str]:
    """The modules of the handlers on the events of ``operations`` that botocore (or
    leasekeeper's SQS backend) did not register, in order, each once;
    ``["an unreadable handler table"]`` when botocore's table cannot be read."""
    found: dict[str, None] = {}
    try:
        table = events._emitter._handlers
        for event in _CALL_EVENTS:
            for operation in operations:
                for module in _handler_modules(table.prefix_search(f"{event}.sqs.{operation}")):
                    if not module.startswith(_OWN_MODULES) or module.startswith(_FOREIGN_MODULES):
                        found[module or "an unnamed handler"] = None
    except Exception:
        return ["an unreadable handler table"]
    return list(found)


def hooks_problem(client: Any) -> str | None:
    """Why another process's client would not make ``client``'s renewals as it does:
    handlers registered on its events in code (a header a gateway wants, a Stubber),
    which that client would not have. None when it has none."""
    events = getattr(getattr(client, "meta", None), "events", None)
    modules = foreign_hook_modules(events, RENEWAL_OPERATIONS)
    if not modules:
        return None
    return (
        f"the client calls event handlers registered in code ({', '.join(modules)}), "
        "which another process's client would not: its renewals would be made without them"
    )


def parse_error(status: int, headers: Mapping[str, str], body: bytes) -> dict[str, Any]:
    """An error answer as botocore's JSON parser shapes it for a query-compatible
    service: ``Error.Code`` the legacy code of ``x-amzn-query-error`` (else the
    ``__type`` after its ``#``), ``Error.QueryErrorCode`` the ``__type``'s,
    ``Error.Type`` Sender or Receiver, and the response metadata."""
    try:
        found = json.loads(body) if body.strip() else {}
    except ValueError:
        found = {"message": body.decode("utf-8", "replace")}
    if not isinstance(found, dict):
        found = {}
    error: dict[str, Any] = {"Message": str(found.get("message", found.get("Message", "")) or "")}
    code = str(found.get("__type") or status)
    code = code.split(":", 1)[0].rsplit("#", 1)[-1]
    query_error = headers.get("x-amzn-query-error")
    if query_error is not None:
        legacy, _, fault = query_error.partition(";")
        if legacy and fault and ";" not in fault:
            error["QueryErrorCode"] = code
            error["Type"] = fault
            code = legacy
    error["Code"] = code
    meta: dict[str, Any] = {"HTTPStatusCode": status, "HTTPHeaders": dict(headers)}
    request_id = headers.get("x-amzn-requestid")
    if request_id is not None:
        meta["RequestId"] = request_id
    return {"Error": error, "ResponseMetadata": meta}


class LeanPath:
    """SQS's hot calls for one boto3 client (see the module docstring); thread-safe.

    ``call(operation, params)`` answers the dict botocore's ``client.<operation>``
    would (what the backend reads of it), or raises what it would raise.
    ``retries=False`` makes one attempt (leasekeeper's own batch calls, which it
    retries itself within each lease's deadline).
    """

    #: The JSON codec.
    encode: Callable[[Any], bytes] = staticmethod(lambda value: _ENCODER.encode(value).encode())
    decode: Callable[[bytes], Any] = staticmethod(lambda data: _DECODER.decode(data.decode()))

    def __init__(
        self,
        route: Route,
        credentials: Any,
        client: Callable[[], Any],
        *,
        events: Any = None,
    ) -> None:
        """The path of ``route``, signing with ``credentials`` (botocore's kind: a
        ``get_frozen_credentials()``; None: none). ``client`` answers the botocore
        client, made when first asked where it is not made yet: its service model
        is read only when a failed call asks the retry policy, its modeled error
        classes only when ``events`` (the client's, whose hooks ``usable`` checks)
        are given. ``LeanPath.of(client)``: the path of a client at hand."""
        self.route = route
        self._client = client
        self._events = events
        self._credentials = credentials
        self._region = route.region
        self.endpoint = route.endpoint
        parts = urlsplit(self.endpoint)
        self._path = parts.path or "/"
        tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            if route.verify is False:
                tls = ssl.create_default_context()
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            else:
                cafile = route.verify if isinstance(route.verify, str) else None
                tls = ssl.create_default_context(cafile=cafile)
        self._signer = RequestSigner(self.endpoint, self._region, "sqs")
        self._pool = KeepAlivePool(
            str(parts.hostname),
            parts.port or (443 if parts.scheme == "https" else 80),
            host_header=self._signer.host,
            connect_timeout=route.connect_timeout,
            read_timeout=route.read_timeout,
            maxsize=route.max_pool_connections,
            tls=tls,
        )
        self.max_attempts = route.max_attempts or _DEFAULT_MAX_ATTEMPTS
        # botocore's retry policy, made at the first failed call (its import is
        # most of the renewer process's start-up otherwise). Until then its quota
        # would be full: a success gives nothing back to a full quota.
        self._retry: Any = None
        self._quota: Any = None
        self._operations: dict[str, Any] = {}
        self._hooks_checked: object = None  # the emitter's lookup cache when last checked
        self._hooks_foreign = True
        self._lock = threading.Lock()
        self.sleep: Callable[[float], None] = time.sleep

    @classmethod
    def of(cls, client: Any) -> LeanPath:
        """The path of ``client``'s hot calls; ValueError where ``why_not`` says why not."""
        reason = why_not(client)
        if reason is not None:
            raise ValueError(f"the lean SQS path cannot stand in for this client: {reason}")
        ref = weakref.ref(client)
        return cls(route_of(client), _credentials_of(client), ref, events=client.meta.events)

    def _retry_policy(self) -> Any:
        """botocore's ``standard`` retry handler for this path, made once."""
        with self._lock:
            if self._retry is None:
                from botocore.retries import quota, standard

                adapter = standard.RetryEventAdapter()
                throttling = standard.ThrottlingErrorDetector(adapter)
                self._quota = standard.RetryQuotaChecker(quota.RetryQuota(), throttling)
                self._retry = standard.RetryHandler(
                    retry_policy=standard.RetryPolicy(
                        retry_checker=standard.StandardRetryConditions(
                            max_attempts=self.max_attempts
                        ),
                        retry_backoff=standard.ExponentialBackoff(
                            service_name="sqs", throttling_detector=throttling
                        ),
                    ),
                    retry_event_adapter=adapter,
                    retry_quota=self._quota,
                    service_name="sqs",
                )
            return self._retry

    # ------------------------------------------------------------------ when

    def usable(self) -> bool:
        """False while the client has event hooks of its user's (checked again
        whenever a handler is registered or removed); True without the client's
        events (a client leasekeeper makes for itself, as the renewer process's)."""
        if self._events is None:
            return True
        emitter = getattr(self._events, "_emitter", None)
        cache = getattr(emitter, "_lookup_cache", None)
        if cache is None:
            return False
        if cache is not self._hooks_checked:
            with self._lock:
                self._hooks_foreign = foreign_hooks(self._events)
                self._hooks_checked = cache
        return not self._hooks_foreign

    # ------------------------------------------------------------------ the call

    def call(self, operation: str, params: Mapping[str, Any], *, retries: bool = True) -> Any:
        body = self.encode(params)
        context: dict[str, Any] = {}
        attempt = 0
        while True:
            attempt += 1
            answer: _Answer | None = None
            parsed: Any = None
            caught: Exception | None = None
            try:
                answer, data = self._send(operation, body)
            except (boto.ConnectionError, boto.HTTPClientError) as exc:
                caught = exc
            else:
                if answer.status_code < 300:
                    if self._quota is not None:
                        self._quota.release_retry_quota(context, answer)
                    return self.decode(data) if data.strip() else {}
                parsed = parse_error(answer.status_code, answer.headers, data)
            if retries:
                delay = self._retry_policy().needs_retry(
                    response=None if answer is None else (answer, parsed),
                    attempts=attempt,
                    operation=self._operation(operation),
                    caught_exception=caught,
                    request_dict={"context": context},
                )
                if delay:
                    log.debug("%s: attempt %d failed, retrying in %.3fs", operation, attempt, delay)
                    self.sleep(delay)
                    continue
            if caught is not None:
                raise caught
            parsed["ResponseMetadata"]["RetryAttempts"] = attempt - 1
            raise self._client_error(parsed, operation)

    def _client_error(self, parsed: dict[str, Any], operation: str) -> Exception:
        """The ClientError the client raises: its modeled class where the client is
        at hand, else botocore's ``ClientError`` (the same response, so the same
        code to classify)."""
        client = self._client() if self._events is not None else None
        if client is None:
            return boto.ClientError(parsed, operation)  # type: ignore[arg-type]
        code = parsed["Error"].get("QueryErrorCode") or parsed["Error"]["Code"]
        error: Exception = client.exceptions.from_code(code)(parsed, operation)
        return error

    def _operation(self, name: str) -> Any:
        found = self._operations.get(name)
        if found is None:
            model = self._client().meta.service_model
            found = self._operations[name] = model.operation_model(name)
        return found

    def _signed_headers(self, operation: str, body: bytes) -> dict[str, str]:
        credentials = self._credentials
        if credentials is None:
            raise boto.NoCredentialsError()
        headers = self._signer.headers(
            credentials.get_frozen_credentials(), _TARGET + operation, JSON_CONTENT_TYPE, body
        )
        trace = os.environ.get("_X_AMZN_TRACE_ID")
        if trace and "AWS_LAMBDA_FUNCTION_NAME" in os.environ:  # as botocore's handler
            headers["X-Amzn-Trace-Id"] = quote(trace, safe="-=;:+&[]{}\"',")  # not signed
        return headers

    def _send(self, operation: str, body: bytes) -> tuple[_Answer, bytes]:
        """One attempt: the answer, or botocore's exception for a failed exchange."""
        headers = self._signed_headers(operation, body)
        try:
            status, found, data = self._pool.post(self._path, headers, body)
        except ExchangeError as failed:
            raise _botocore_error(self.endpoint, failed) from None
        return _Answer(status, found), data

    def close(self) -> None:
        self._pool.close()


def _botocore_error(url: str, failed: ExchangeError) -> Exception:
    """The exception botocore (over urllib3) raises for the same failure."""
    cause = failed.cause
    if isinstance(cause, (ssl.SSLError, ssl.CertificateError)):
        return boto.SSLError(endpoint_url=url, error=cause)
    if failed.phase == "connect":
        if isinstance(cause, (socket.timeout, TimeoutError)):
            return boto.ConnectTimeoutError(endpoint_url=url, error=cause)
        return boto.EndpointConnectionError(endpoint_url=url, error=cause)
    if failed.phase == "read" and isinstance(cause, (socket.timeout, TimeoutError)):
        return boto.ReadTimeoutError(endpoint_url=url, error=cause)
    return boto.ConnectionClosedError(endpoint_url=url, error=cause)


# ---------------------------------------------------------------------- the client's path


# Set on a thread while it is inside one of leasekeeper's own batch calls.
OWN_CALL = threading.local()
OWN_OPERATIONS = ("ChangeMessageVisibilityBatch", "DeleteMessageBatch")


def one_attempt(
    response: Any = None,
    caught_exception: BaseException | None = None,
    operation: Any = None,
    **_: Any,
) -> None:
    """botocore ``needs-retry`` hook: end leasekeeper's own calls after one attempt.

    botocore would retry a 5xx, a throttle or a reset inside the call, sleeping up
    to seconds between attempts while the lease's deadline runs out, and would
    not know the deadline. The manager retries these itself, within each lease's
    remaining time, so its calls fail fast instead: the attempt's own exception,
    or the ClientError botocore would have raised. Calls the application makes on
    the same client are left to botocore's retry policy.
    """
    if not getattr(OWN_CALL, "active", False):
        return None
    if caught_exception is not None:
        raise caught_exception
    if response is None:
        return None
    http_response, parsed = response
    if getattr(http_response, "status_code", 200) < 300:
        return None
    name = getattr(operation, "name", "") or "SQS call"
    raise boto.ClientError(parsed, name)


def one_attempt_on(client: Any) -> None:
    """Register ``one_attempt`` on ``client``'s events (once per client)."""
    events = getattr(getattr(client, "meta", None), "events", None)
    if events is not None:
        for operation in OWN_OPERATIONS:  # the unique id: once per client
            events.register_first(
                f"needs-retry.sqs.{operation}",
                one_attempt,
                unique_id=f"leasekeeper-one-attempt-{operation}",
            )


# ---------------------------------------------------------------------- one path per client

_PATHS: weakref.WeakKeyDictionary[Any, LeanPath | None] = weakref.WeakKeyDictionary()
_PATHS_LOCK = threading.Lock()


def lean_path(client: Any) -> LeanPath | None:
    """The lean path of ``client`` (one per client, shared by its backends: one pool,
    one retry quota), or None where ``why_not(client)`` has a reason."""
    try:
        with _PATHS_LOCK:
            if client in _PATHS:
                return _PATHS[client]
            reason = why_not(client)
            path = LeanPath.of(client) if reason is None else None
            _PATHS[client] = path
    except TypeError:  # neither hashable nor weakly referenced: an unusual client
        return None
    if reason is not None:
        log.debug("SQS calls go through the boto3 client: %s", reason)
    return path


# ---------------------------------------------------------------------- a client made when needed


class StaticCredentials(NamedTuple):
    """Fixed keys, as botocore's credentials hand them to a signer."""

    access_key: str
    secret_key: str
    token: str | None = None

    def get_frozen_credentials(self) -> StaticCredentials:
        return self


class DeferredClient:
    """A boto3 SQS client made on its first use, and the lean path that makes the hot
    calls meanwhile (and after) with fixed keys: what the renewer process of a
    worker whose client allows it builds (``scheme.sqs``'s ``defer_client``), so
    that renewing never imports botocore unless a call needs the client. Every
    attribute but ``lean`` and ``made`` is the client's."""

    def __init__(self, make: Callable[[], Any], route: Route, keys: StaticCredentials) -> None:
        self._make = make
        self._client: Any = None
        self._lock = threading.RLock()
        self._on_made: list[Callable[[Any], None]] = []
        self.lean = LeanPath(route, keys, self.made)

    def made(self) -> Any:
        """The client, made now if it is not yet."""
        with self._lock:
            if self._client is None:
                log.debug("making the SQS client a call needs")
                self._client = self._make()
                for adopt in self._on_made:
                    adopt(self._client)
                self._on_made.clear()
            return self._client

    def when_made(self, adopt: Callable[[Any], None]) -> None:
        """Call ``adopt(client)`` once the client is made (now if it is)."""
        with self._lock:
            if self._client is None:
                self._on_made.append(adopt)
                return
        adopt(self._client)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.made(), name)

    def __repr__(self) -> str:
        return f"DeferredClient({self.lean.endpoint!r}, made={self._client is not None})"


def renewal_options(lean: LeanPath | None, secrets: Mapping[str, Any]) -> dict[str, Any]:
    """The factory options that let the renewer process make the hot calls of a
    client whose ``lean`` path is in use and whose fixed keys are among ``secrets``
    without botocore (``defer_client``), over the same TLS verification."""
    if lean is None or not secrets.get("aws_secret_access_key"):
        return {}
    return {"defer_client": True, "verify": lean.route.verify}
