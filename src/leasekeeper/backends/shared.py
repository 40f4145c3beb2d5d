"""What every service backend shares: argument checks and rounding
(``check_count``, ``check_seconds``, ``check_attributes``, ``whole_seconds``),
receipt scrubbing (``redact``, ``clean_code``), the clock-skew allowance for a
service's timestamps (``SKEW_MARGIN``, ``epoch_seconds``), the margin kept
before a service's cap (``cap_margin``), the body of an SDK message
(``text_body``), and ``ErrorTable``: a service's error codes, by the outcome
each means.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import TypeGuard, TypeVar
from urllib.parse import quote, urlsplit

from leasekeeper.backends.contract import OutcomeKind

T = TypeVar("T")


def chunked(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """Split ``items`` into runs of at most ``size`` (a backend's ``max_batch``)."""
    for start in range(0, len(items), size):
        yield items[start : start + size]


REDACTED = "<redacted>"

#: The port a URL's scheme means when it names none.
DEFAULT_PORTS = {"http": 80, "https": 443, "redis": 6379, "rediss": 6379}


def host_port(url: str) -> str:
    """``host:port`` of ``url`` - the port its scheme implies when it names none -
    and nothing else: never a user, a password, a path or a query (a SAS token).
    What every message about a service that cannot be reached names."""
    try:
        parts = urlsplit(url if "//" in url else f"//{url}")
        host, port = parts.hostname, parts.port
    except ValueError:
        return "an unreadable address"
    if not host:
        return "an unknown address"
    if ":" in host:  # IPv6
        host = f"[{host}]"
    if port is None:
        port = DEFAULT_PORTS.get(parts.scheme.lower())
    return host if port is None else f"{host}:{port}"


# (pattern, replacement) pairs a backend knows mark its secrets in free text.
Redactions = Sequence[tuple[re.Pattern[str], str]]


def redact(text: str, secrets: Iterable[str] = (), patterns: Redactions = ()) -> str:
    """``text`` with each known secret blanked, as written and URL-quoted (services
    and HTTP logs quote receipts back either way), then each pattern applied.

    The one place every backend blanks receipts, keys and signatures out of SDK
    errors and log records before leasekeeper lets them near a log line.
    """
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
            quoted = quote(secret, safe="")
            if quoted != secret:
                text = text.replace(quoted, REDACTED)
    for pattern, replacement in patterns:
        text = pattern.sub(replacement, text)
    return text


# What an error code (or a request id) looks like: an identifier, never free text.
CODE_SHAPE = re.compile(r"[A-Za-z0-9._:#-]{1,100}")


def clean_code(code: object) -> str:
    """``code`` if it looks like an error code or a request id, else "": a value fit
    for an outcome's detail or a log line (anything else may quote a request)."""
    return code if isinstance(code, str) and CODE_SHAPE.fullmatch(code) else ""


def said(text: str) -> str:
    """A service's own message, already scrubbed, as a note for a log line."""
    return f"service said: {text}" if text else ""


# ---------------------------------------------------------------------- time
# Float noise ignored when rounding to whole seconds: 2.0000000001 s is 2 s. The
# service starts counting when the request reaches it, later than the moment the
# local deadline counts from by at least the request's transit, so 1e-9 s less
# than asked is still on the safe side.
_NOISE = 1e-9


#: ``adopt`` trusts a deadline the service's clock reports, less this much for skew.
SKEW_MARGIN = 0.5


def whole_seconds(seconds: float, *, up: bool) -> int:
    """``seconds`` as the whole seconds a service takes, never below 0.

    ``up=True`` where a longer real time is the safe side: an extend (the manager
    counts its deadline from the float it asked for) and a long poll (a fraction
    of a second must not become a 0 s poll, which would make an idle worker
    busy-poll). ``up=False`` where a shorter one is: a release delay (a released
    message is never held back longer than asked). Float noise is ignored either
    way. ``seconds`` must be a finite number (see ``is_seconds``).
    """
    value = math.ceil(seconds - _NOISE) if up else math.floor(seconds + _NOISE)
    return value if value > 0 else 0


def cap_margin(max_lease_age: float) -> float:
    """What a backend takes off its service's cap on total invisibility, so the
    manager stops extending before the service refuses: 60 s (rounding, call
    latency, an ``adopt`` made shortly after the receive), or 2 % of a cap shorter
    than 50 minutes (an overridden one, in tests)."""
    return min(60.0, 0.02 * max_lease_age)


def epoch_seconds(moment: object) -> float | None:
    """A service's timestamp as epoch seconds: a datetime (naive ones are UTC), or
    an int or numeric str of epoch milliseconds; None for anything else (or <= 1 ms:
    an SDK object that was never received says 1)."""
    if isinstance(moment, datetime):
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=timezone.utc)
        return float(moment.timestamp())
    if isinstance(moment, bool):
        return None
    try:
        ms = int(moment)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return None
    return ms / 1000.0 if ms > 1 else None


# ---------------------------------------------------------------------- arguments
def is_seconds(value: object) -> TypeGuard[float]:
    """True for a finite int or float (bool is not a number of seconds)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_count(name: str, value: object, limit: int) -> int:
    """An int >= 1 (else TypeError/ValueError naming ``name``), at most ``limit``: a
    receive returns *up to* that many messages, so asking for more than the service
    gives in one call is not an error."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value!r}")
    return min(value, limit)


def check_seconds(name: str, value: object, *, low: float = 0.0, high: float = math.inf) -> float:
    """``value`` as a float if it is a finite number of seconds in ``low..high``,
    else ValueError naming ``name``, the range and the value."""
    if is_seconds(value) and low <= value <= high:
        return float(value)
    upper = "" if high == math.inf else f" and <= {high:g}"
    raise ValueError(f"{name} must be a number of seconds >= {low:g}{upper}, got {value!r}")


def check_lease_age(value: object, default: float) -> float:
    """A ``max_lease_age`` given at construction (None: ``default``): a number of
    seconds > 0, ``math.inf`` for none."""
    if value is None:
        return default
    if value == math.inf or (is_seconds(value) and value > 0):
        return float(value)
    raise ValueError(f"max_lease_age must be a number of seconds > 0 (or math.inf), got {value!r}")


def check_body(body: object) -> str | bytes:
    """A message body to send: str or bytes, else TypeError."""
    if not isinstance(body, (str, bytes)):
        raise TypeError(f"body must be str or bytes, got {type(body).__name__}")
    return body


def check_attributes(
    attributes: Mapping[str, str] | None, *, carried: bool, service: str, limit: int | None = None
) -> dict[str, str]:
    """Attributes to send, as a dict of str to str: TypeError for anything else,
    ValueError where the service cannot carry them (``carried`` False) or more than
    ``limit`` are given. None or empty: ``{}``."""
    if not attributes:
        return {}
    if not isinstance(attributes, Mapping):
        raise TypeError(f"attributes must be a mapping of str to str, got {attributes!r}")
    out: dict[str, str] = {}
    for key, value in attributes.items():
        if not isinstance(key, str) or not isinstance(value, str) or not key:
            raise TypeError(
                f"attributes must map non-empty str names to str values, got {key!r}: {value!r}"
            )
        out[key] = value
    if not carried:
        raise ValueError(
            f"{service} messages carry no attributes (carries_attributes is False): "
            "send the body alone, or carry them in the body"
        )
    if limit is not None and len(out) > limit:
        raise ValueError(f"{service} carries at most {limit} attributes a message, got {len(out)}")
    return out


def text_body(content: object, *, decode: bool) -> str | bytes:
    """An SDK message's content as a ``Message.body``: str stays str; bytes (and
    bytearray, memoryview) stay bytes, or with ``decode`` become str when they are
    valid UTF-8 (an SDK that base64-decodes every body); None is ""."""
    if content is None:
        return ""
    if isinstance(content, (bytearray, memoryview)):
        content = bytes(content)
    if isinstance(content, bytes):
        if decode:
            try:
                return content.decode("utf-8")
            except UnicodeDecodeError:
                return content
        return content
    return content if isinstance(content, str) else str(content)


def receive_count(value: object) -> int:
    """A service's delivery count as ``Message.receive_count``: a positive int, or
    1 where the service gave none that makes sense."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1


# ---------------------------------------------------------------------- errors
_KIND_ORDER: tuple[OutcomeKind, ...] = ("lost", "capped", "fatal", "retry")


Codes = Iterable[str]


def codes(given: Codes) -> frozenset[str]:
    """Error codes as a set: an iterable of them, or one str of whitespace-separated codes."""
    return frozenset(given.split() if isinstance(given, str) else given)


class ErrorTable:
    """A service's error codes, by the outcome each means.

    ``ErrorTable(lost=..., retry=..., fatal=..., bug=..., capped=...)``, each an
    iterable of codes or one str of whitespace-separated codes; ``bug``
    codes say the service rejected a request leasekeeper built (malformed: a bug,
    not a lost lease) and count as fatal. ``kind(*codes)`` is the outcome of the
    codes one error carries (SQS sends a legacy and a short name), the most
    definitive first (lost, capped, fatal, retry), or None when the table knows
    none of them: the backend then decides by HTTP status or exception type, and
    an unknown error is "retry" (a lease is declared lost only on a definitive
    answer, and at its deadline).
    """

    __slots__ = ("bug", "capped", "fatal", "lost", "retry")

    def __init__(
        self,
        *,
        lost: Codes = (),
        retry: Codes = (),
        fatal: Codes = (),
        bug: Codes = (),
        capped: Codes = (),
    ) -> None:
        self.lost = codes(lost)
        self.retry = codes(retry)
        self.bug = codes(bug)
        self.fatal = codes(fatal) | self.bug
        self.capped = codes(capped)
        groups = (self.lost, self.retry, self.fatal, self.capped)
        overlap = {code for i, a in enumerate(groups) for b in groups[i + 1 :] for code in a & b}
        if overlap:
            raise ValueError(f"codes in more than one group: {sorted(overlap)}")

    def _kind_of(self, code: str) -> OutcomeKind | None:
        if code in self.lost:
            return "lost"
        if code in self.capped:
            return "capped"
        if code in self.fatal:
            return "fatal"
        if code in self.retry:
            return "retry"
        return None

    def kind(self, *codes: str) -> OutcomeKind | None:
        """The outcome kind of an error carrying ``codes``, or None if none is known."""
        kinds = {self._kind_of(code) for code in codes}
        for kind in _KIND_ORDER:
            if kind in kinds:
                return kind
        return None

    def is_bug(self, code: str) -> bool:
        return code in self.bug
