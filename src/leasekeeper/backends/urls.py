"""Queue URLs and the schemes that open them: ``parse_url`` takes a URL apart
(never showing its password), ``factory_for`` finds the factory a scheme names in
the entry-point group ``leasekeeper.backends`` (see ``leasekeeper.backends.registry``).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import parse_qsl, urlsplit

from leasekeeper.errors import ConfigError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "ENTRY_POINT_GROUP",
    "OWN_SCHEMES",
    "Factory",
    "QueueURL",
    "factory_for",
    "factory_named",
    "factory_value",
    "installed_schemes",
    "parse_url",
    "redact_url",
]

log = logging.getLogger("leasekeeper.backends")

ENTRY_POINT_GROUP = "leasekeeper.backends"

#: What an entry point of the group names: ``factory(url, **options) -> Backend``.
Factory = Callable[..., Any]

#: leasekeeper's own schemes, as its ``pyproject.toml`` declares them. They count
#: where the package's metadata is missing - leasekeeper vendored into an
#: application, or imported from a source tree by ``PYTHONPATH`` - so that its own
#: backends still connect there, and its workers still renew from a process (the
#: renewer process rebuilds a backend through its scheme); an installed package's
#: entry points come first.
OWN_SCHEMES: Mapping[str, str] = {
    "sqs": "leasekeeper.backends.sqs.scheme:sqs",
    "https": "leasekeeper.backends.sqs.scheme:sqs",
    "http": "leasekeeper.backends.sqs.scheme:sqs",
    "mns": "leasekeeper.backends.schemes:mns",
    "azure": "leasekeeper.backends.schemes:azure",
    "memory": "leasekeeper.backends.schemes:memory",
    "redis": "leasekeeper.backends.schemes:redis",
    "rediss": "leasekeeper.backends.schemes:redis",
}


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
    """Every scheme of the ``leasekeeper.backends`` entry-point group, by name, and
    leasekeeper's own (``OWN_SCHEMES``) where no installed package declares them."""
    from importlib.metadata import EntryPoint, entry_points  # (every package's metadata)

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
    for scheme, value in OWN_SCHEMES.items():
        if scheme not in found:
            found[scheme] = EntryPoint(scheme, value, ENTRY_POINT_GROUP)
    return found


def factory_for(scheme: str) -> Factory:
    """The factory registered for ``scheme``; ValueError naming the installed ones."""
    entry = _entry(scheme)
    return _checked(str(entry.value), entry.load())


def factory_value(scheme: str) -> str:
    """The ``module:name`` of the factory registered for ``scheme`` (``factory_named``
    loads it in another process without reading the packages' metadata again)."""
    return str(_entry(scheme).value)


def factory_named(value: str) -> Factory:
    """The factory ``value`` (``module:name [extras]``, as ``factory_value`` gives)
    names, loaded as its entry point would load it."""
    module, _, name = value.partition("[")[0].partition(":")
    found: Any = importlib.import_module(module.strip())
    for part in name.strip().split(".") if name.strip() else ():
        found = getattr(found, part)
    return _checked(value, found)


def _checked(value: str, factory: Any) -> Factory:
    if not callable(factory):
        raise ConfigError(f"the {ENTRY_POINT_GROUP} entry point {value!r} is not callable")
    return factory  # type: ignore[no-any-return]


def _entry(scheme: str) -> EntryPoint:
    schemes = installed_schemes()
    entry = schemes.get(scheme.lower())
    if entry is None:
        known = ", ".join(sorted(schemes))
        raise ValueError(
            f"no leasekeeper backend for the scheme {scheme!r}; installed schemes: {known} "
            "(a plug-in's scheme is its package's entry point: is that package installed?)"
        )
    return entry
