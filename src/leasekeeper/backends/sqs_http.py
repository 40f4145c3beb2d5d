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

import json
import logging
import os
import socket
import ssl
import threading
import time
import urllib.request
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple
from urllib.parse import quote, urlsplit

from botocore import exceptions as boto
from botocore.httpsession import get_cert_path
from botocore.retries import quota, standard

from leasekeeper.backends.keepalive import ExchangeError, KeepAlivePool
from leasekeeper.backends.sigv4 import RequestSigner

__all__ = [
    "CLIENT_METHODS",
    "HOT_OPERATIONS",
    "OWN_CALL",
    "OWN_OPERATIONS",
    "one_attempt",
    "LeanPath",
    "lean_path",
    "parse_error",
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


def why_not(client: Any) -> str | None:
    """Why the lean path cannot make ``client``'s calls as the client would, or None."""
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


def _verify_of(client: Any) -> bool | str:
    endpoint = getattr(client, "_endpoint", None)
    verify = getattr(getattr(endpoint, "http_session", None), "_verify", True)
    return verify if isinstance(verify, (bool, str)) else True


def _handler_modules(handlers: Iterable[Any]) -> Iterable[str]:
    for handler in handlers:
        function = getattr(handler, "__func__", handler)
        yield str(getattr(function, "__module__", "") or "")


def foreign_hooks(events: Any) -> bool:
    """Does the client's event system call a handler botocore (or leasekeeper's SQS
    backend) did not register on the events of an SQS call? Reads botocore's
    handler table; anything unreadable counts as a foreign hook."""
    try:
        table = events._emitter._handlers
        for event in _CALL_EVENTS:
            for module in _handler_modules(table.prefix_search(f"{event}.sqs.ReceiveMessage")):
                if not module.startswith(_OWN_MODULES) or module.startswith(_FOREIGN_MODULES):
                    return True
            for operation in HOT_OPERATIONS - {"ReceiveMessage"}:
                name = f"{event}.sqs.{operation}"
                for module in _handler_modules(table.prefix_search(name)):
                    if not module.startswith(_OWN_MODULES) or module.startswith(_FOREIGN_MODULES):
                        return True
    except Exception:
        return True
    return False


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

    def __init__(self, client: Any) -> None:
        reason = why_not(client)
        if reason is not None:
            raise ValueError(f"the lean SQS path cannot stand in for this client: {reason}")
        meta = client.meta
        config = meta.config
        self._client_ref = weakref.ref(client)
        self._events = meta.events
        self._credentials = _credentials_of(client)
        self._region = str(meta.region_name or "us-east-1")
        self._service_model = meta.service_model
        self._exceptions = client.exceptions
        self.endpoint = str(meta.endpoint_url)
        parts = urlsplit(self.endpoint)
        self._path = parts.path or "/"
        tls: ssl.SSLContext | None = None
        if parts.scheme == "https":
            verify = _verify_of(client)
            if verify is False:
                tls = ssl.create_default_context()
                tls.check_hostname = False
                tls.verify_mode = ssl.CERT_NONE
            else:
                tls = ssl.create_default_context(cafile=get_cert_path(verify))  # type: ignore[arg-type]  # a path too
        self._signer = RequestSigner(self.endpoint, self._region, "sqs")
        self._pool = KeepAlivePool(
            str(parts.hostname),
            parts.port or (443 if parts.scheme == "https" else 80),
            host_header=self._signer.host,
            connect_timeout=config.connect_timeout,
            read_timeout=config.read_timeout,
            maxsize=int(config.max_pool_connections or 10),
            tls=tls,
        )
        attempts = (config.retries or {}).get("total_max_attempts")
        self.max_attempts = int(attempts) if attempts else standard.DEFAULT_MAX_ATTEMPTS
        adapter = standard.RetryEventAdapter()
        throttling = standard.ThrottlingErrorDetector(adapter)
        self._quota = standard.RetryQuotaChecker(quota.RetryQuota(), throttling)
        self._retry = standard.RetryHandler(
            retry_policy=standard.RetryPolicy(
                retry_checker=standard.StandardRetryConditions(max_attempts=self.max_attempts),
                retry_backoff=standard.ExponentialBackoff(
                    service_name="sqs", throttling_detector=throttling
                ),
            ),
            retry_event_adapter=adapter,
            retry_quota=self._quota,  # type: ignore[arg-type]  # botocore's stubs say RetryQuota
            service_name="sqs",
        )
        self._operations: dict[str, Any] = {}
        self._hooks_checked: object = None  # the emitter's lookup cache when last checked
        self._hooks_foreign = True
        self._lock = threading.Lock()
        self.sleep: Callable[[float], None] = time.sleep

    # ------------------------------------------------------------------ when

    def usable(self) -> bool:
        """False while the client has event hooks of its user's (checked again
        whenever a handler is registered or removed)."""
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
                    self._quota.release_retry_quota(context, answer)  # type: ignore[arg-type]
                    return self.decode(data) if data.strip() else {}
                parsed = parse_error(answer.status_code, answer.headers, data)
            if retries:
                delay = self._retry.needs_retry(
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
            code = parsed["Error"].get("QueryErrorCode") or parsed["Error"]["Code"]
            raise self._exceptions.from_code(code)(parsed, operation)

    def _operation(self, name: str) -> Any:
        found = self._operations.get(name)
        if found is None:
            found = self._operations[name] = self._service_model.operation_model(name)
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
            path = LeanPath(client) if reason is None else None
            _PATHS[client] = path
    except TypeError:  # neither hashable nor weakly referenced: an unusual client
        return None
    if reason is not None:
        log.debug("SQS calls go through the boto3 client: %s", reason)
    return path
