"""The continuation of a rolled-over job: what the original sends, what the next hop reads.

A continuation is a new message with the original's body and the job's lineage:
the first message's id, the hop number and the last checkpoint (JSON). Where the
service carries message attributes the lineage travels in one attribute,
``leasekeeper-continuation`` (one of SQS's ten), beside the original's own
attributes. Where it cannot (Azure Storage queues carry none; an SQS message whose
attributes are already at the limit), it travels in an *envelope*: the body is
prefixed with a marker line and a JSON header line (the lineage and the
original's attributes). ``unwrap`` takes an envelope off a received message in
place, before any handler sees it - the receive paths of ``LeaseManager``,
``Worker`` and ``AsyncWorker`` and the ``with`` scopes call it - and remembers
what it carried.

The same envelope, without a lineage, carries the attributes of a message sent to a
service that has none (``send_with_attributes``: Azure Storage queues), such as the
trace context ``leasekeeper.otel`` sends: its first line is ``ATTRIBUTES_MARK``, and
``unwrap`` takes it off the same way, giving the message those attributes.

A FIFO continuation is sent in the original's message group, so the group's order
holds. The continuation is sent before the original is deleted (``lease.py``,
``settle_rollover``): a crash in between leaves both, and a handler can tell the
stale one by its lineage (docs/outliving.md).
"""

from __future__ import annotations

import json
import logging
import weakref
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from leasekeeper.backends.contract import Message
from leasekeeper.errors import LeaseError

log = logging.getLogger("leasekeeper.rollover")

#: The attribute that carries the lineage where the service carries attributes.
ATTRIBUTE = "leasekeeper-continuation"
#: The first line of an envelope.
MARK = "leasekeeper-continuation/1\n"
_MARK_BYTES = MARK.encode()
#: The first line of an envelope that carries attributes only.
ATTRIBUTES_MARK = "leasekeeper-attributes/1\n"
_ATTRIBUTES_MARK_BYTES = ATTRIBUTES_MARK.encode()
#: What both marks begin with: a body without it has no envelope (one check per message).
_ENVELOPE = "leasekeeper-"
_ENVELOPE_BYTES = _ENVELOPE.encode()
assert MARK.startswith(_ENVELOPE) and ATTRIBUTES_MARK.startswith(_ENVELOPE)

# Messages whose envelope was taken off, and what it carried. Weak: a message
# forgotten by everyone takes its entry with it.
_unwrapped: weakref.WeakKeyDictionary[Message, Carried] = weakref.WeakKeyDictionary()


class Carried(NamedTuple):
    """The lineage a continuation carries. ``checkpoint`` is JSON text (None: none)."""

    first_id: str
    hop: int
    checkpoint: str | None


def checkpoint_text(state: object) -> str:
    """``state`` as the JSON text a continuation carries; ``TypeError``/``ValueError``
    (from ``json``) when it is not JSON-serialisable."""
    return json.dumps(state, separators=(",", ":"), allow_nan=False)


def _lineage_json(carried: Carried, attributes: Mapping[str, str] | None = None) -> str:
    fields: dict[str, Any] = {"first_id": carried.first_id, "hop": carried.hop}
    if attributes:
        fields["attributes"] = dict(attributes)
    text = json.dumps(fields, separators=(",", ":"))
    # The checkpoint is JSON already: spliced in as it stands, not quoted again.
    return f'{text[:-1]},"checkpoint":{carried.checkpoint or "null"}}}'


def _parse(text: str) -> tuple[Carried, dict[str, str]] | None:
    try:
        fields = json.loads(text)
        first_id, hop = fields["first_id"], fields["hop"]
        checkpoint = fields.get("checkpoint")
        attributes = fields.get("attributes") or {}
        if not isinstance(first_id, str) or isinstance(hop, bool) or not isinstance(hop, int):
            return None
        if not isinstance(attributes, dict):
            return None
        saved = None if checkpoint is None else checkpoint_text(checkpoint)
        return Carried(first_id, hop, saved), {str(k): str(v) for k, v in attributes.items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def attributes_of(message: Message) -> Mapping[str, str]:
    """The message's attributes (none where the backend gives none)."""
    attributes = getattr(message, "attributes", None)
    return attributes if isinstance(attributes, Mapping) else {}


def carried(message: Message) -> Carried | None:
    """What ``message`` carries as a continuation; None for an original."""
    found = _unwrapped.get(message)
    if found is not None:
        return found
    text = attributes_of(message).get(ATTRIBUTE)
    if text is None:
        return None
    parsed = _parse(text)
    return None if parsed is None else parsed[0]


def unwrap(message: Message) -> Message:
    """Take a continuation's envelope off ``message`` in place (its body becomes the
    original's, its attributes the original's where the message has them) and
    remember the lineage. Anything else is left as it is (a wrong type too:
    registering it raises the TypeError that names it). Returns ``message``."""
    if not isinstance(message, Message) or not _may_carry_envelope(message.body):
        return message
    body = message.body
    if _unwrap_attributes(message):
        return message
    if isinstance(body, str):
        if not body.startswith(MARK):
            return message
        header, _, inner = body[len(MARK) :].partition("\n")
        rest: str | bytes = inner
    elif isinstance(body, bytes) and body.startswith(_MARK_BYTES):
        raw_header, _, raw_inner = body[len(_MARK_BYTES) :].partition(b"\n")
        header, rest = raw_header.decode("utf-8", "replace"), raw_inner
    else:
        return message
    parsed = _parse(header)
    if parsed is None:
        log.warning("message %r looks like a continuation but its header is unreadable", message.id)
        return message
    lineage, attributes = parsed
    message.body = rest
    if attributes and hasattr(message, "attributes"):
        # Where the message has attributes (the backends' own field), the original's.
        setattr(message, "attributes", MappingProxyType(attributes))  # noqa: B010
    _unwrapped[message] = lineage
    return message


def _may_carry_envelope(body: object) -> bool:
    """False for a body without either envelope: one check, as most have none."""
    if isinstance(body, str):
        return body.startswith(_ENVELOPE)
    return isinstance(body, bytes) and body.startswith(_ENVELOPE_BYTES)


def _unwrap_attributes(message: Message) -> bool:
    """Take an attributes envelope off ``message`` in place; False when it has none."""
    body = message.body
    if isinstance(body, str) and body.startswith(ATTRIBUTES_MARK):
        header, _, rest = body[len(ATTRIBUTES_MARK) :].partition("\n")
        inner: str | bytes = rest
    elif isinstance(body, bytes) and body.startswith(_ATTRIBUTES_MARK_BYTES):
        raw_header, _, inner = body[len(_ATTRIBUTES_MARK_BYTES) :].partition(b"\n")
        header = raw_header.decode("utf-8", "replace")
    else:
        return False
    try:
        fields = json.loads(header)
        attributes = {str(k): str(v) for k, v in fields["attributes"].items()}
    except (ValueError, TypeError, KeyError, AttributeError):
        log.warning("message %r has an unreadable attributes envelope", message.id)
        return False
    message.body = inner
    setattr(message, "attributes", MappingProxyType(attributes))  # noqa: B010
    return True


def send_with_attributes(
    backend: object, body: str | bytes, attributes: Mapping[str, str], **options: Any
) -> str:
    """Send ``body`` with ``attributes`` to ``backend``: as the message's attributes
    where the service carries them, else in an envelope that the workers (and
    ``LeaseManager.receive``) take off before a handler sees the message."""
    send = getattr(backend, "send", None)
    if not callable(send):
        raise LeaseError(f"{backend!r} has no send()")
    if getattr(backend, "carries_attributes", False) or not attributes:
        return str(send(body, dict(attributes) or None, **options))
    header = json.dumps({"attributes": dict(attributes)}, separators=(",", ":"))
    wrapped: str | bytes = (
        f"{ATTRIBUTES_MARK}{header}\n{body}"
        if isinstance(body, str)
        else _ATTRIBUTES_MARK_BYTES + header.encode() + b"\n" + body
    )
    return str(send(wrapped, **options))


def next_hop(message: Message, checkpoint: str | None) -> Carried:
    """The lineage of ``message``'s continuation: one hop on, carrying ``checkpoint``
    (None: the checkpoint ``message`` itself carried, if any)."""
    before = carried(message)
    if before is None:
        return Carried(message.id, 1, checkpoint)
    return Carried(
        before.first_id, before.hop + 1, checkpoint if checkpoint is not None else before.checkpoint
    )


def _group_of(message: Message) -> str | None:
    """The message group of a FIFO message (SQS's MessageGroupId), if it has one."""
    if message.group is not None:
        return message.group
    raw = message.raw
    if isinstance(raw, Mapping):
        system = raw.get("Attributes")
        if isinstance(system, Mapping):
            group = system.get("MessageGroupId")
            return group if isinstance(group, str) else None
    return None


def send_continuation(message: Message, lineage: Carried) -> str:
    """Send the continuation of ``message`` carrying ``lineage`` to its queue; returns
    the new message's id. Raises what the backend's ``send`` raises, and
    ``LeaseError`` for a backend that cannot send."""
    backend = message.backend
    send = getattr(backend, "send", None)
    if not callable(send):
        raise LeaseError(
            f"cannot roll over message {message.id!r}: {backend!r} has no send() to put "
            "its continuation on the queue"
        )
    options: dict[str, Any] = {}
    group = _group_of(message)
    if group is not None and getattr(backend, "fifo", False):
        options["group_id"] = group  # a FIFO continuation keeps its message group
    original = {k: v for k, v in attributes_of(message).items() if k != ATTRIBUTE}
    if getattr(backend, "carries_attributes", False):
        limit = getattr(backend, "attribute_limit", None)
        if limit is None or len(original) < limit:
            attributes = {**original, ATTRIBUTE: _lineage_json(lineage)}
            try:
                return str(send(message.body, attributes, **options))
            except ValueError as exc:  # refused before sending (too many, too large)
                log.info("continuation of %r goes in an envelope: %s", message.id, exc)
    header = _lineage_json(lineage, original)
    body = message.body
    wrapped: str | bytes = (
        f"{MARK}{header}\n{body}"
        if isinstance(body, str)
        else _MARK_BYTES + header.encode() + b"\n" + body
    )
    return str(send(wrapped, **options))
