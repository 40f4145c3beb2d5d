"""The lean call path: SQS's hot calls over a pooled connection, without botocore's
per-call machinery.

A worker spends its day on three calls: ReceiveMessage, DeleteMessageBatch and
ChangeMessageVisibilityBatch. Through a boto3 client each one goes through about
a dozen event hooks, parameter validation, the model-driven serialiser and parser
and a fresh request object, which costs more CPU than the work of the call.
``LeanPath`` puts the same request on the wire as the client would, the AWS JSON
1.0 protocol (X-Amz-Target ``AmazonSQS.<operation>``, its content type,
x-amzn-query-mode), with the client's User-Agent (its extra and app id in it),
invocation id and attempt headers, and keeps what matters of the client:

- its credentials object, frozen for every request as botocore's signer does (a
  refreshable one refreshes itself), signed as botocore's SigV4 signer signs
  (``sigv4.RequestSigner``: the same signature, the signing key derived once a day);
- its resolved endpoint and region, its connect and read timeouts and pool size,
  its TLS verification (a CA bundle or a CA directory), over keep-alive
  connections of our own (``keepalive.KeepAlivePool``);
- its retry policy and its one retry quota: a failed attempt is put to the
  client's own ``needs-retry`` handlers and every answer to its ``after-call``
  ones, as its endpoint does, so the lean calls and the client's share one quota;
- its answers: a success that keeps to its shape is read as botocore reads it
  (``responses.read_plain``), anything else - every error answer included - by
  botocore's own parser (``responses.botocore_answer``), and an error raised as
  the client raises it (its modeled class, the same Error and ResponseMetadata);
  connection failures as botocore's exceptions.

``lean_path(client)`` answers the path for a client, or None where the client's
configuration cannot be honoured here (``why_not(client)`` says why): proxies, a
client certificate, TCP keep-alive, another signature version or retry mode, a
protocol other than JSON, a CA bundle that cannot be loaded. ``LeanPath.usable()``
is checked on every call: hooks registered on the client's events beyond
botocore's own (a botocore Stubber, moto's in-process mock, your
instrumentation), or anything wrapping botocore's call pipeline (a tracer:
``wrappers``), send the calls back through the client. Nothing here logs a
request's body: it carries receipts.

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
from leasekeeper.backends.sqs.responses import botocore_answer, read_plain, response_metadata
from leasekeeper.backends.sqs.sigv4 import RequestSigner
from leasekeeper.backends.sqs.wrappers import WrapperWatch, wrapper_of


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
    "LazyModule",
    "Route",
    "OWN_CALL",
    "OWN_OPERATIONS",
    "one_attempt",
    "one_attempt_on",
    "LeanPath",
    "lean_path",
    "tls_context",
    "user_agent_of",
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
    """The part of an HTTP answer botocore's retry classes and ``after-call``
    handlers read."""

    status_code: int
    headers: dict[str, str]


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
    user_agent: str | None = None


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
        user_agent=user_agent_of(client),
    )


def invocation_id() -> str:
    """A random (version 4) UUID in its text form, as botocore's invocation id:
    the uuid module itself costs the renewer process a tenth of its imports."""
    t = os.urandom(16).hex()
    return f"{t[:8]}-{t[8:12]}-4{t[13:16]}-{_VARIANT[t[16]]}{t[17:20]}-{t[20:]}"


# the RFC 4122 variant: the first hex digit of the fourth group is 8, 9, a or b
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}


def user_agent_of(client: Any) -> str | None:
    """The User-Agent ``client`` sends (its ``user_agent_extra`` and
    ``user_agent_appid`` in it), built by botocore's own builder; None where it has
    none."""
    creator = getattr(client, "_user_agent_creator", None)
    try:
        return str(creator.to_string()) if creator is not None else None
    except Exception:  # a botocore that builds it otherwise: no User-Agent of ours
        return None


def tls_context(verify: bool | str) -> ssl.SSLContext:
    """The TLS context of ``verify`` as botocore's session uses it: False, no check;
    True, the system's CAs; a path, its CA bundle, loaded as a file as botocore
    has urllib3 load it (a directory is not one: it fails to load, as there).
    Raises what loading it raises."""
    if verify is False:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if isinstance(verify, str):
        return ssl.create_default_context(cafile=verify)
    return ssl.create_default_context()


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
    found = next((reason for found, reason in reasons if found), None)
    if found is None and parts.scheme == "https":
        found = _tls_problem(client)
    return found


def _tls_problem(client: Any) -> str | None:
    """Why the client's CA bundle cannot be loaded here (botocore then fails each
    call with its SSLError, which the client's own calls will raise), or None."""
    try:
        tls_context(route_of(client).verify)
    except (OSError, ValueError) as exc:
        return f"the client's CA bundle cannot be loaded ({type(exc).__name__})"
    return None


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
    wrapped = wrapper_of(client)
    if wrapped:
        return (
            f"botocore's calls are wrapped ({wrapped}: a tracer?), and another process's "
            "calls would not be seen by it: its renewals would go untraced"
        )
    events = getattr(getattr(client, "meta", None), "events", None)
    modules = foreign_hook_modules(events, RENEWAL_OPERATIONS)
    if not modules:
        return None
    return (
        f"the client calls event handlers registered in code ({', '.join(modules)}), "
        "which another process's client would not: its renewals would be made without them"
    )


class LeanPath:
    """SQS's hot calls for one boto3 client (see the module docstring); thread-safe.

    ``call(operation, params)`` answers the dict botocore's ``client.<operation>``
    would, or raises what it would raise. ``retries=False`` makes one attempt
    (leasekeeper's own batch calls, which it retries itself within each lease's
    deadline).
    """

    #: The JSON codec.
    encode: Callable[[Any], bytes] = staticmethod(lambda value: _ENCODER.encode(value).encode())

    def __init__(
        self,
        route: Route,
        credentials: Any,
        client: Callable[[], Any],
        *,
        events: Any = None,
        existing: Callable[[], Any] | None = None,
    ) -> None:
        """The path of ``route``, signing with ``credentials`` (botocore's kind: a
        ``get_frozen_credentials()``; None: none). ``client`` answers the botocore
        client, made when first asked where it is not made yet: its events decide
        retries, count the retry quota and read the answers the lean path does not
        read itself, as they do for the client's own calls; ``existing`` answers it
        only where it is made (None: not yet; default ``client``). ``events`` (the
        client's, whose hooks ``usable`` checks) are given for a client at hand.
        ``LeanPath.of(client)``: the path of a client at hand."""
        self.route = route
        self._client = client
        self._existing = existing or client
        self._events = events
        self._credentials = credentials
        self._region = route.region
        self.endpoint = route.endpoint
        parts = urlsplit(self.endpoint)
        self._path = parts.path or "/"
        verify = route.verify
        self._signer = RequestSigner(self.endpoint, self._region, "sqs")
        self._pool = KeepAlivePool(
            str(parts.hostname),
            parts.port or (443 if parts.scheme == "https" else 80),
            host_header=self._signer.host,
            connect_timeout=route.connect_timeout,
            read_timeout=route.read_timeout,
            maxsize=route.max_pool_connections,
            tls=(lambda: tls_context(verify)) if parts.scheme == "https" else None,
        )
        self.max_attempts = route.max_attempts or _DEFAULT_MAX_ATTEMPTS
        # What every request carries besides the signed headers, as botocore sends it.
        self._fixed = {"Accept-Encoding": "identity"}
        if route.user_agent:
            self._fixed["User-Agent"] = route.user_agent
        self._operations: dict[str, Any] = {}
        self._hooks_checked: object = None  # the emitter's lookup cache when last checked
        self._hooks_foreign = True
        self._wrappers = WrapperWatch()
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

    # ------------------------------------------------------------------ when

    def usable(self) -> bool:
        """False while the client has event hooks of its user's (checked again
        whenever a handler is registered or removed), or while anything wraps
        botocore's call pipeline (``wrappers``: a tracer sees only the client's
        calls); True without the client's events (a client leasekeeper makes for
        itself, as the renewer process's) and nothing wrapped."""
        if self._wrappers.wrapped(self._existing() if self._events is not None else None):
            return False
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

    def why_unusable(self) -> str | None:
        """Why ``usable()`` is False now, in a few words (None: it is True)."""
        client = self._existing() if self._events is not None else None
        wrapped = self._wrappers.wrapped(client)
        if wrapped:
            return f"botocore's calls are wrapped ({wrapped})"
        if self._events is not None and not self.usable():
            return "the client has event hooks of its user's"
        return None

    # ------------------------------------------------------------------ the call

    def call(self, operation: str, params: Mapping[str, Any], *, retries: bool = True) -> Any:
        body = self.encode(params)
        context: dict[str, Any] = {}
        invocation = invocation_id()
        attempt = 0
        while True:
            attempt += 1
            answer: _Answer | None = None
            parsed: Any = None
            caught: Exception | None = None
            try:
                answer, data = self._send(operation, body, invocation, attempt)
            except (boto.ConnectionError, boto.HTTPClientError) as exc:
                caught = exc
            else:
                if 200 <= answer.status_code < 300:
                    parsed = read_plain(operation, data)
                    if parsed is not None:
                        parsed["ResponseMetadata"] = response_metadata(
                            answer.status_code, answer.headers, attempt - 1
                        )
                        if retries and attempt >= self.max_attempts:
                            # the client's retry handler marks the last attempt's answer
                            self._needs_retry(
                                operation, answer, parsed, None, attempt=attempt, context=context
                            )
                        self._after_call(operation, answer, parsed, context)
                        return parsed
                parsed = botocore_answer(self._client(), self._operation(operation), *answer, data)
            if retries:
                delay = self._needs_retry(
                    operation, answer, parsed, caught, attempt=attempt, context=context
                )
                if delay:
                    log.debug("%s: attempt %d failed, retrying in %.3fs", operation, attempt, delay)
                    self.sleep(delay)
                    continue
            if caught is not None:
                raise caught
            assert answer is not None
            if isinstance(parsed, dict) and "ResponseMetadata" in parsed:
                parsed["ResponseMetadata"]["RetryAttempts"] = attempt - 1
            self._after_call(operation, answer, parsed, context)
            if answer.status_code >= 300:
                raise self._client_error(parsed, operation, context)
            return parsed

    def _needs_retry(
        self,
        operation: str,
        answer: _Answer | None,
        parsed: Any,
        caught: Exception | None,
        *,
        attempt: int,
        context: dict[str, Any],
    ) -> float | None:
        """The client's retry decision (its ``needs-retry`` handlers: its retry mode,
        its max attempts, its retry quota), as its endpoint asks it."""
        client = self._client()
        responses = client.meta.events.emit(
            f"needs-retry.sqs.{operation}",
            response=None if answer is None else (answer, parsed),
            endpoint=None,
            operation=self._operation(operation),
            attempts=attempt,
            caught_exception=caught,
            request_dict={"context": context},
        )
        delay = next((found for _, found in responses if found is not None), None)
        return float(delay) if delay else None

    def _after_call(
        self, operation: str, answer: _Answer, parsed: Any, context: dict[str, Any]
    ) -> None:
        """The client's ``after-call`` handlers (its retry quota gets back what a
        success gives back; an SQS error's code is chosen), where the client is made."""
        client = self._existing()
        if client is None:
            return  # no client yet: no quota to give back to
        client.meta.events.emit(
            f"after-call.sqs.{operation}",
            http_response=answer,
            parsed=parsed,
            model=self._operation(operation),
            context=context,
        )

    def _client_error(self, parsed: Any, operation: str, context: dict[str, Any]) -> Exception:
        """The exception the client raises for an error answer: its modeled class of
        the code botocore's ``after-call`` handler chose (the QueryErrorCode), else of
        ``Error.Code``."""
        client = self._client()
        code = context.get("error_code_override") or parsed.get("Error", {}).get("Code")
        error: Exception = client.exceptions.from_code(code)(parsed, operation)
        return error

    def _operation(self, name: str) -> Any:
        found = self._operations.get(name)
        if found is None:
            model = self._client().meta.service_model
            found = self._operations[name] = model.operation_model(name)
        return found

    def _headers(
        self, operation: str, body: bytes, invocation: str, attempt: int
    ) -> dict[str, str]:
        credentials = self._credentials
        if credentials is None:
            raise boto.NoCredentialsError()
        headers = self._signer.headers(
            credentials.get_frozen_credentials(), _TARGET + operation, JSON_CONTENT_TYPE, body
        )
        headers.update(self._fixed)
        headers["amz-sdk-invocation-id"] = invocation
        headers["amz-sdk-request"] = f"attempt={attempt}; max={self.max_attempts}"
        trace = os.environ.get("_X_AMZN_TRACE_ID")
        if trace and "AWS_LAMBDA_FUNCTION_NAME" in os.environ:  # as botocore's handler
            headers["X-Amzn-Trace-Id"] = quote(trace, safe="-=;:+&[]{}\"',")  # not signed
        return headers

    def _send(
        self, operation: str, body: bytes, invocation: str, attempt: int
    ) -> tuple[_Answer, bytes]:
        """One attempt: the answer, or botocore's exception for a failed exchange."""
        headers = self._headers(operation, body, invocation, attempt)
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
