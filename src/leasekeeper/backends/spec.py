"""Backend specs: picklable descriptions that build an equivalent backend elsewhere.

``backend.spec()`` returns one (``spec_of(backend)`` is the one way to ask for it);
its ``build()`` makes a backend on the same queue, with the same client settings
(endpoint, region, retries, timeouts, pool, proxies), in another process - the
renewer process, a Spark executor. Every backend's is a ``URLSpec``: its URL and
options, built again with ``connect``, so a backend of another package, connected
by URL, is rebuilt the same way.

A spec never holds a secret: it may be shipped to Spark, logged, shown. The
building process takes its credentials from its own environment or the SDK's
default chain (each factory of ``leasekeeper.backends.schemes`` says where), with
one exception: the renewer process, a child of the worker, is sent the
credentials the worker's own client was given in code over its private socket
(``renewal_spec``: a ``PrivateSpec``, never pickled anywhere else).

``MNSSpec`` and ``AzureQueueSpec`` (and SQS's ``SQSSpec``, in
``leasekeeper.backends.sqs``) are the specs of earlier versions, kept with their
fields (``leasekeeper.spark``'s ``SQSSource``, ``MNSSource`` and
``AzureQueueSource`` are the same classes); each builds through ``connect`` too.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from leasekeeper.backends.contract import Backend, BackendSpec
from leasekeeper.backends.urls import (
    Factory,
    factory_for,
    factory_named,
    factory_value,
    parse_url,
    redact_url,
)
from leasekeeper.errors import ConfigError

__all__ = [
    "SECRET_OPTIONS",
    "AzureQueueSpec",
    "BackendSpec",
    "MNSSpec",
    "PrivateSpec",
    "URLSpec",
    "connect",
    "public_options",
    "renewal_spec",
    "spec_of",
]

log = logging.getLogger("leasekeeper.backends")

#: Option values a URLSpec carries to another process.
Plain = (str, int, float, bool, type(None))
# Options that belong to this process and are not carried (another process has its own).
LOCAL_OPTIONS = frozenset({"clock"})
#: Factory options that are secrets: never in a URLSpec (a connect() given them
#: drops them from its spec), only in a ``PrivateSpec`` to the renewer process.
SECRET_OPTIONS = frozenset(
    {
        "aws_access_key_id",
        "aws_secret_access_key",
        "aws_session_token",
        "access_key_id",
        "access_key_secret",
        "security_token",
        "account_key",
        "sas_token",
        "password",
        "ssl_password",
    }
)
# Secrets a connection string may carry: they must not travel in a spec.
SECRET_KEYS = ("accountkey=", "sharedaccesssignature=")


def public_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` without secrets: no secret option, no password in a URL value (a
    proxy's), no connection string with a key. What a spec may carry and show."""
    out: dict[str, Any] = {}
    for name, value in options.items():
        if name in SECRET_OPTIONS:
            continue
        if isinstance(value, str) and any(key in value.lower() for key in SECRET_KEYS):
            continue
        out[name] = redact_url(value) if isinstance(value, str) else value
    return out


def connect(url: str, **options: Any) -> Backend:
    """The backend for the queue at ``url``, built by the factory its scheme names.

    Schemes leasekeeper installs: any ``http(s)://host[:port]/<account>/<name>`` and
    ``sqs://<name>`` (SQS), ``mns://<endpoint-host>/<queue>``,
    ``azure://<account>/<queue>``, ``memory://<name>``,
    ``redis://host:port/db?stream=S&group=G``; ``options`` are the factory's own
    (each factory of ``leasekeeper.backends.schemes`` documents them). A malformed
    URL is a ValueError naming it; an unknown scheme a ValueError naming the
    installed ones. The backend's ``spec()`` then describes this URL and these
    options, secrets left out.
    """
    return _connect(factory_for(parse_url(url).scheme), url, options)


def _connect(factory: Factory, url: str, options: Mapping[str, Any]) -> Backend:
    parsed = parse_url(url)
    backend = factory(url, **options)
    if not isinstance(backend, Backend):
        raise ConfigError(
            f"the factory for {parsed.scheme}:// returned {type(backend).__name__}, "
            "not a leasekeeper Backend"
        )
    log.debug("connected to %s: %r", parsed.text, backend)
    remember(backend, parsed.text, options)
    return backend


@dataclass(frozen=True)
class URLSpec:
    """A queue by URL and options: ``build()`` is ``connect(url, **options)`` in the
    process that calls it. Picklable and hashable; ``url`` holds no password and
    ``options`` only plain values (str, int, float, bool, None), none a secret."""

    url: str
    options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        parsed = parse_url(self.url)
        if parsed.password:
            raise ValueError("a URLSpec holds no credentials: give the URL without its password")
        for name, value in self.options:
            if not isinstance(value, Plain):
                raise ConfigError(
                    f"option {name}={type(value).__name__} cannot travel to another process "
                    "(only str, int, float, bool and None do)"
                )
            if name in SECRET_OPTIONS:
                raise ValueError(f"a URLSpec holds no credentials: option {name} is one")

    @classmethod
    def of(cls, url: str, options: Mapping[str, Any] | None = None) -> URLSpec:
        """A URLSpec of ``url`` (its password dropped) and the options that are not
        None (secrets dropped, passwords in URL values too: ``public_options``)."""
        given = public_options(options or {})
        kept = tuple(sorted((k, v) for k, v in given.items() if v is not None))
        return cls(redact_url(url), kept)

    def build(self) -> Backend:
        return connect(self.url, **dict(self.options))

    def __repr__(self) -> str:
        shown = "".join(f", {name}={value!r}" for name, value in self.options)
        return f"URLSpec({self.url!r}{shown})"


class PrivateSpec:
    """A ``URLSpec`` and the secrets of the client it describes (keys given in code, a
    proxy's password): what the worker sends its renewer process over their private
    socket, and nowhere else. ``build()`` passes both to ``connect`` - to the
    factory ``factory`` names (``module:name``, found by the worker) where given,
    so the renewer process need not read every package's metadata to find it. No
    repr, str or error shows a secret."""

    __slots__ = ("_secrets", "factory", "spec")

    def __init__(
        self, spec: URLSpec, secrets: Mapping[str, Any], factory: str | None = None
    ) -> None:
        self.spec = spec
        self._secrets = dict(secrets)
        self.factory = factory

    def build(self) -> Backend:
        options = {**dict(self.spec.options), **self._secrets}
        if self.factory is None:
            return connect(self.spec.url, **options)
        return _connect(factory_named(self.factory), self.spec.url, options)

    def __reduce__(self) -> tuple[Any, ...]:
        return (PrivateSpec, (self.spec, self._secrets, self.factory))

    def __repr__(self) -> str:
        return f"PrivateSpec({self.spec!r}, secrets={sorted(self._secrets)})"


def renewal_spec(backend: object) -> BackendSpec:
    """What the renewer process builds its backend from: ``spec_of(backend)``, with
    the secrets its client holds that the renewer could not find itself
    (``backend.secret_options()``) and its factory, found here. For the renewer's
    private channel only."""
    spec: BackendSpec = spec_of(backend)
    secret_options = getattr(backend, "secret_options", None)
    secrets = secret_options() if callable(secret_options) else {}
    if not isinstance(spec, URLSpec):
        return spec
    try:
        factory: str | None = factory_value(parse_url(spec.url).scheme)
    except ValueError:  # no such scheme here: the renewer's connect says so, as before
        factory = None
    return PrivateSpec(spec, secrets, factory)


# Backends whose class does not let connect set their spec (slots): id -> (ref, spec).
_remembered: dict[int, tuple[Callable[[], Any], Callable[[], URLSpec]]] = {}
_remembered_lock = threading.Lock()


def remember(backend: object, url: str, options: Mapping[str, Any]) -> None:
    """Make ``backend.spec()`` describe ``url`` and ``options`` (``connect`` does it).

    A backend whose class says ``process_local = True`` (an in-memory queue) keeps
    its own ``spec()``, which refuses. ``clock`` is not carried (another process has
    its own), nor is a secret; another option that is not a plain value makes
    ``spec()`` raise ConfigError naming it."""
    if getattr(backend, "process_local", False):
        return
    carried = {k: v for k, v in public_options(options).items() if k not in LOCAL_OPTIONS}
    local = sorted(k for k, v in carried.items() if not isinstance(v, Plain))
    spec = URLSpec.of(url, carried) if not local else None

    def spec_method() -> URLSpec:
        if spec is None:
            raise ConfigError(
                f"{backend!r} was connected with option(s) {', '.join(local)} that cannot "
                "travel to another process: connect it with plain values to rebuild it there"
            )
        return spec

    try:
        backend.spec = spec_method  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        key = id(backend)

        def forget(_: object) -> None:
            with _remembered_lock:
                _remembered.pop(key, None)

        try:
            ref: Callable[[], Any] = weakref.ref(backend, forget)
        except TypeError:  # no weak references either: kept (a backend lives long)
            ref = lambda: backend  # noqa: E731
        with _remembered_lock:
            _remembered[key] = (ref, spec_method)


def spec_of(backend: object) -> Any:
    """``backend.spec()``, or the URLSpec ``connect`` remembered for a backend whose
    class takes no new attribute; ConfigError where it has neither. The one way to
    ask for a backend's spec."""
    with _remembered_lock:
        found = _remembered.get(id(backend))
    if found is not None and found[0]() is backend:
        return found[1]()
    spec = getattr(backend, "spec", None)
    if not callable(spec):
        raise ConfigError(
            f"{backend!r} has no spec(): it cannot be rebuilt in another process "
            "(a backend from leasekeeper.connect(url) can)"
        )
    return spec()


@dataclass(frozen=True)
class MNSSpec:
    """An Aliyun MNS queue; credentials from the building process's environment:
    ``MNS_ACCESS_KEY_ID``, ``MNS_ACCESS_KEY_SECRET`` and optionally
    ``MNS_SECURITY_TOKEN`` (on a Spark cluster: ``spark.executorEnv.*``)."""

    endpoint: str
    queue_name: str

    def build(self) -> Backend:
        scheme, _, host = self.endpoint.rstrip("/").partition("://")
        return connect(f"mns://{host}/{self.queue_name}", secure=scheme != "http")


@dataclass(frozen=True)
class AzureQueueSpec:
    """An Azure Storage queue.

    With neither ``connection_string`` nor ``account_url``, the connection string
    comes from ``AZURE_STORAGE_CONNECTION_STRING`` in the building process's
    environment. With ``account_url``, the credential comes from
    ``AZURE_STORAGE_SAS_TOKEN`` or ``AZURE_STORAGE_ACCOUNT_KEY`` (for account
    ``account_name``, or the first label of the URL's host), else from
    ``AZURE_STORAGE_CONNECTION_STRING``, else ``azure.identity.DefaultAzureCredential``.
    A ``connection_string`` given here must hold no secret (no AccountKey or
    SharedAccessSignature): the spec is pickled and shipped.
    """

    queue_name: str
    connection_string: str | None = None
    account_url: str | None = None
    account_name: str | None = None

    def __post_init__(self) -> None:
        if self.connection_string is not None and any(
            key in self.connection_string.lower() for key in SECRET_KEYS
        ):
            raise ValueError(
                f"{type(self).__name__}: this connection string holds a secret, and the spec "
                "is pickled and shipped; set AZURE_STORAGE_CONNECTION_STRING in the building "
                "process's environment instead (the renewer inherits the worker's; on Spark, "
                "the executors' environment: spark.executorEnv.AZURE_STORAGE_CONNECTION_STRING)"
            )
        if self.connection_string is not None and self.account_url is not None:
            raise ValueError(
                f"{type(self).__name__}: give connection_string or account_url, not both"
            )

    def __repr__(self) -> str:
        where = self.account_url or ("connection string" if self.connection_string else "env")
        return f"{type(self).__name__}(queue_name={self.queue_name!r}, via={where!r})"

    def build(self) -> Backend:
        account = self.account_name
        if account is None and self.account_url is not None:
            account = self.account_url.split("//", 1)[-1].split(".", 1)[0]
        options: dict[str, Any] = {"account_url": self.account_url}
        if self.connection_string is not None:
            options = {"connection_string": self.connection_string}
        return connect(f"azure://{account or ''}/{self.queue_name}", **options)
