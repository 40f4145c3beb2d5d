"""Queues by URL: ``leasekeeper.connect(url, **options) -> Backend``.

A URL's scheme names a *factory* ``(url, **options) -> Backend`` registered in the
entry-point group ``leasekeeper.backends``. leasekeeper's own backends register
there as any other package would, in its ``pyproject.toml``::

    [project.entry-points."leasekeeper.backends"]
    sqs = "leasekeeper.backends.sqs:from_url"
    memory = "leasekeeper.backends.memory:from_url"

so a third-party package adds a queue service by declaring one more line in its
own ``pyproject.toml``, with no code in leasekeeper. ``connect`` remembers the URL
and the options on the backend it returns: that backend's ``spec()`` is a
``URLSpec``, which calls ``connect`` again in another process (the process
renewer, a Spark executor), so a plug-in backend works there too.

Credentials never travel in a URLSpec: a password in the URL is dropped from it
(and from every repr and log line), so the other process takes its credentials
from its own environment, as each backend documents.
"""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from typing import Any, NamedTuple
from urllib.parse import parse_qsl, urlsplit

from leasekeeper.backends.base import Backend
from leasekeeper.errors import ConfigError

__all__ = [
    "ENTRY_POINT_GROUP",
    "QueueURL",
    "URLSpec",
    "connect",
    "installed_schemes",
    "parse_url",
    "spec_of",
]

log = logging.getLogger("leasekeeper.backends")

ENTRY_POINT_GROUP = "leasekeeper.backends"

#: What an entry point of the group names: ``factory(url, **options) -> Backend``.
Factory = Callable[..., Backend]
#: Option values a URLSpec carries to another process.
Plain = (str, int, float, bool, type(None))
# Options that belong to this process and are not carried (another process has its own).
_LOCAL_OPTIONS = frozenset({"clock"})


class QueueURL(NamedTuple):
    """A queue URL taken apart (``parse_url``). ``password`` is a secret: ``str()``
    and ``repr()`` show the URL without it."""

    scheme: str
    host: str  # "" when the URL has none (sqs://name has "name" here)
    port: int | None
    path: tuple[str, ...]  # the non-empty path segments
    query: Mapping[str, str]
    username: str
    password: str
    text: str  # the URL without its password

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"QueueURL({self.text!r})"


def parse_url(
    url: object, *, what: str = "a queue URL", credentials_from: str | None = None
) -> QueueURL:
    """``url`` taken apart; ValueError naming it (without its password) when it is
    not a URL with a scheme, or its port or query is malformed. With
    ``credentials_from`` (where the backend takes them instead), a URL that carries
    credentials (``user:password@``) is refused too: a URL is logged and shipped."""
    if not isinstance(url, str):
        raise TypeError(f"{what} must be a str, got {type(url).__name__}")
    try:
        parts = urlsplit(url.strip())
        port = parts.port  # ValueError for a port that is not a number
        query = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    except ValueError as exc:
        raise ValueError(f"{redact_url(url)!r} is not {what}: {exc}") from None
    if not parts.scheme or "://" not in url:
        raise ValueError(f"{redact_url(url)!r} is not {what}: it has no scheme:// part")
    if credentials_from is not None and (parts.username or parts.password):
        raise ValueError(
            f"{redact_url(url)!r}: credentials do not go in {what} (it is logged and "
            f"shipped); {credentials_from}"
        )
    # The host as written: a queue's name (sqs://Jobs, memory://Jobs) keeps its case.
    hostport = parts.netloc.rpartition("@")[2]
    if hostport.startswith("["):
        host = hostport[1 : hostport.find("]")]
    else:
        host = hostport.partition(":")[0]
    return QueueURL(
        scheme=parts.scheme.lower(),
        host=host,
        port=port,
        path=tuple(segment for segment in parts.path.split("/") if segment),
        query=query,
        username=parts.username or "",
        password=parts.password or "",
        text=redact_url(url),
    )


def redact_url(url: str) -> str:
    """``url`` without the password of its userinfo (``user@host``, never ``user:pw@``)."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    userinfo, at, host = authority.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{scheme}://{user + '@' if user else ''}{host}{slash}{tail}"


def installed_schemes() -> dict[str, EntryPoint]:
    """Every scheme of the ``leasekeeper.backends`` entry-point group, by name."""
    found: dict[str, EntryPoint] = {}
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        scheme = entry.name.lower()
        if scheme in found and found[scheme].value != entry.value:
            log.warning(
                "scheme %r is registered twice (%s and %s); using the first",
                scheme,
                found[scheme].value,
                entry.value,
            )
            continue
        found.setdefault(scheme, entry)
    return found


def factory_for(scheme: str) -> Factory:
    """The factory registered for ``scheme``; ValueError naming the installed ones."""
    schemes = installed_schemes()
    entry = schemes.get(scheme.lower())
    if entry is None:
        known = ", ".join(sorted(schemes)) or "none"
        hint = (
            ""
            if schemes
            else " (is leasekeeper installed? after changing its entry points, an editable "
            "install must be reinstalled: pip install -e .)"
        )
        raise ValueError(
            f"no leasekeeper backend for the scheme {scheme!r}; installed schemes: {known}{hint}"
        )
    factory = entry.load()
    if not callable(factory):
        raise ConfigError(f"the {ENTRY_POINT_GROUP} entry point {entry.value!r} is not callable")
    return factory  # type: ignore[no-any-return]


def connect(url: str, **options: Any) -> Backend:
    """The backend for the queue at ``url``, built by the factory its scheme names.

    Schemes leasekeeper installs: ``https://sqs.<region>.amazonaws.com/<account>/<name>``
    and ``sqs://<name>`` (SQS), ``mns://<endpoint-host>/<queue>``,
    ``azure://<account>/<queue>``, ``memory://<name>``,
    ``redis://host:port/db?stream=S&group=G``; ``options`` are the factory's own
    (each backend's ``from_url`` documents them). A malformed URL is a ValueError
    naming it; an unknown scheme a ValueError naming the installed ones.
    The backend's ``spec()`` then describes this URL and these options.
    """
    parsed = parse_url(url)
    factory = factory_for(parsed.scheme)
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
    ``options`` only plain values (str, int, float, bool, None)."""

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

    @classmethod
    def of(cls, url: str, options: Mapping[str, Any] | None = None) -> URLSpec:
        """A URLSpec of ``url`` (its password dropped) and the options that are not None."""
        given = options or {}
        kept = tuple(sorted((k, v) for k, v in given.items() if v is not None))
        return cls(redact_url(url), kept)

    def build(self) -> Backend:
        return connect(self.url, **dict(self.options))

    def __repr__(self) -> str:
        shown = "".join(f", {name}={value!r}" for name, value in self.options)
        return f"URLSpec({self.url!r}{shown})"


# Backends whose class does not let connect set their spec (slots): id -> (ref, spec).
_remembered: dict[int, tuple[Callable[[], Any], Callable[[], URLSpec]]] = {}
_remembered_lock = threading.Lock()


def remember(backend: object, url: str, options: Mapping[str, Any]) -> None:
    """Make ``backend.spec()`` describe ``url`` and ``options`` (``connect`` does it).

    A backend whose class says ``process_local = True`` (an in-memory queue) keeps
    its own ``spec()``, which refuses. ``clock`` is not carried (another process has
    its own); another option that is not a plain value makes ``spec()`` raise
    ConfigError naming it."""
    if getattr(backend, "process_local", False):
        return
    carried = {k: v for k, v in options.items() if k not in _LOCAL_OPTIONS}
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
    class takes no new attribute; ConfigError where it has neither."""
    with _remembered_lock:
        found = _remembered.get(id(backend))
    if found is not None and found[0]() is backend:
        return found[1]()
    spec = getattr(backend, "spec", None)
    if spec is None:
        raise ConfigError(
            f"{backend!r} has no spec(): it cannot be rebuilt in another process "
            "(a backend from leasekeeper.connect(url) can)"
        )
    return spec()
