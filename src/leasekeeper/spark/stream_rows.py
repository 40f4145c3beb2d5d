"""The columns of ``read_stream``'s DataFrame, and one message as one row.

=================  =====================  =============================================
column             type                   value
=================  =====================  =============================================
id                 STRING                 the service's message id (de-duplicate on it)
body               STRING                 the body as text; for a binary body, its UTF-8
                                          decoding, or NULL when it is not UTF-8
body_binary        BINARY                 the body's bytes when the service returned
                                          bytes (NULL for a text body)
receive_count      BIGINT                 deliveries so far, this one included
sent_at            TIMESTAMP              when the message was sent (SQS SentTimestamp,
                                          MNS EnqueueTime, Azure insertion time)
first_received_at  TIMESTAMP              its first delivery (SQS
                                          ApproximateFirstReceiveTimestamp, MNS
                                          FirstDequeueTime; NULL on Azure)
received_at        TIMESTAMP              when the reader sent the receive that got it
                                          (the driver's clock)
attributes         MAP<STRING, STRING>    user attributes: SQS String and Number message
                                          attributes, MNS user properties; binary ones are
                                          left out; empty on Azure (it has none)
batch              BIGINT                 the micro-batch's end offset
=================  =====================  =============================================

Only what the receive already returned is used: no extra service call per message.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from leasekeeper.backends.contract import Message

COLUMNS = (
    "id",
    "body",
    "body_binary",
    "receive_count",
    "sent_at",
    "first_received_at",
    "received_at",
    "attributes",
    "batch",
)
SCHEMA = (
    "id STRING, body STRING, body_binary BINARY, receive_count BIGINT, sent_at TIMESTAMP, "
    "first_received_at TIMESTAMP, received_at TIMESTAMP, attributes MAP<STRING, STRING>, "
    "batch BIGINT"
)

Row = tuple[Any, ...]
_UTC = datetime.timezone.utc


def _from_epoch_ms(value: object) -> datetime.datetime | None:
    try:
        ms = int(str(value))
    except (TypeError, ValueError):
        return None
    if ms <= 0:
        return None
    return datetime.datetime.fromtimestamp(ms / 1000.0, _UTC)


def _from_datetime(value: object) -> datetime.datetime | None:
    if not isinstance(value, datetime.datetime):
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=_UTC)


def _sqs_extras(raw: Mapping[str, Any]) -> tuple[Any, Any, dict[str, str]]:
    system = raw.get("Attributes")
    system = system if isinstance(system, Mapping) else {}
    attributes: dict[str, str] = {}
    found = raw.get("MessageAttributes")
    if isinstance(found, Mapping):
        for name, value in found.items():
            if isinstance(value, Mapping) and isinstance(value.get("StringValue"), str):
                attributes[str(name)] = value["StringValue"]
    return (
        _from_epoch_ms(system.get("SentTimestamp")),
        _from_epoch_ms(system.get("ApproximateFirstReceiveTimestamp")),
        attributes,
    )


def _mns_extras(raw: Any) -> tuple[Any, Any, dict[str, str]]:
    attributes: dict[str, str] = {}
    found = getattr(raw, "user_properties", None)
    if isinstance(found, Mapping):
        for name, value in found.items():
            text = getattr(value, "string_value", value)
            if getattr(value, "data_type", "STRING") != "BINARY" and isinstance(
                text, (str, int, float)
            ):
                attributes[str(name)] = str(text)
    return (
        _from_epoch_ms(getattr(raw, "enqueue_time", None)),
        _from_epoch_ms(getattr(raw, "first_dequeue_time", None)),
        attributes,
    )


def extras(message: Message) -> tuple[Any, Any, dict[str, str]]:
    """(sent_at, first_received_at, attributes) from what the service returned."""
    raw = message.raw
    if isinstance(raw, Mapping):  # SQS: the message dict of ReceiveMessage
        return _sqs_extras(raw)
    if hasattr(raw, "enqueue_time"):  # MNS: mns.queue.Message
        return _mns_extras(raw)
    if hasattr(raw, "inserted_on"):  # Azure: QueueMessage
        return _from_datetime(raw.inserted_on), None, {}
    return None, None, {}


def sent_at(message: Message) -> datetime.datetime | None:
    """When the service says ``message`` was sent, if it says."""
    sent: datetime.datetime | None = extras(message)[0]
    return sent


def message_row(message: Message, batch: int, received_wall: float) -> Row:
    """One row of the schema for ``message``, received at wall time ``received_wall``."""
    body = message.body
    if isinstance(body, str):
        text: str | None = body
        binary: bytes | None = None
    else:
        binary = bytes(body)
        try:
            text = binary.decode("utf-8")
        except UnicodeDecodeError:
            text = None
    sent, first, attributes = extras(message)
    return (
        message.id,
        text,
        binary,
        int(message.receive_count),
        sent,
        first,
        datetime.datetime.fromtimestamp(received_wall, _UTC),
        attributes,
        batch,
    )
