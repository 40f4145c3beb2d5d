"""The string options of the ``"leasekeeper"`` streaming format, parsed and checked once.

``spark.readStream.format("leasekeeper").option(k, v)`` passes strings; ``read_stream``
builds the same strings from its arguments (``stream_options``), so both ways in
go through ``StreamOptions.parse``. Keys are case-insensitive. An unknown key is
an error (a typo would otherwise be ignored silently).

==========================  =========  ================================================
option                      default    meaning
==========================  =========  ================================================
backend                     required   sqs, mns or azure
queue_url, region,                     SQS: ``SQSSource``'s fields
endpoint_url
endpoint, queue_name                   MNS: ``MNSSource``'s fields
queue_name, account_url,               Azure: ``AzureQueueSource``'s fields
connection_string
max_messages_per_batch      1000       most messages one micro-batch takes
partitions                  1          Spark partitions a micro-batch is split into
                                       (1: its rows go to Spark with its plan)
receive_concurrency         8          receive calls in flight while filling a batch
poll_seconds                1          long poll of an empty queue, per latestOffset
fill_seconds                2          most time a micro-batch waits to fill up
prefetch                    (max_m.)   messages received and leased ahead, while
                                       Spark runs the batches before (0: none)
log_level                   (unset)    e.g. INFO: the reader process logs
                                       ``leasekeeper`` records at that level to stderr
renewer                     auto       who renews the reader's leases: a renewer
                                       process where one can run (auto), a process
                                       or nothing (process), a thread (thread)
visibility_timeout, ...                any ``LeaseConfig`` field (the reader's leases)
==========================  =========  ================================================
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from leasekeeper.config import LeaseConfig
from leasekeeper.errors import ConfigError
from leasekeeper.spark.sources import (
    SOURCE_KINDS,
    URL_KEYS,
    Source,
    source_from_options,
    source_options,
)

DEFAULT_MAX_MESSAGES_PER_BATCH = 1000

_CONFIG_FIELDS = {field.name: field for field in dataclasses.fields(LeaseConfig)}
_SOURCE_KEYS = {"backend", *URL_KEYS} | {name for kind in SOURCE_KINDS.values() for name in kind[3]}
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_RENEWERS = ("auto", "process", "thread")
Renewer = Literal["auto", "process", "thread"]


@dataclass(frozen=True)
class StreamOptions:
    """Everything the reader needs, checked: picklable, secret-free."""

    source: Source
    config: LeaseConfig
    max_messages_per_batch: int = DEFAULT_MAX_MESSAGES_PER_BATCH
    partitions: int = 1
    receive_concurrency: int = 8
    poll_seconds: float = 1.0
    fill_seconds: float = 2.0
    log_level: str | None = None
    prefetch: int | None = None  # None: max_messages_per_batch
    renewer: Renewer = "auto"  # the reader's manager's (``LeaseManager(renewer=...)``)

    def __post_init__(self) -> None:
        for name in ("max_messages_per_batch", "partitions", "receive_concurrency"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        prefetch = self.prefetch
        if prefetch is not None and (
            isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0
        ):
            raise ValueError(f"prefetch must be None or an integer >= 0, got {prefetch!r}")
        for name in ("poll_seconds", "fill_seconds"):
            value = getattr(self, name)
            if not (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and value >= 0
            ):
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        if self.log_level is not None and self.log_level not in _LOG_LEVELS:
            raise ValueError(f"log_level must be one of {', '.join(_LOG_LEVELS)}")
        if self.renewer not in _RENEWERS:
            raise ValueError(f"renewer must be one of {', '.join(_RENEWERS)}, got {self.renewer!r}")
        if not callable(getattr(self.source, "build", None)):
            raise TypeError(f"source must build a backend, got {type(self.source).__name__}")

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> StreamOptions:
        """Parse the format's string options (see the module docstring)."""
        lowered = {str(key).lower(): str(value) for key, value in options.items()}
        known = _SOURCE_KEYS | set(_CONFIG_FIELDS) | set(_STREAM_KEYS)
        unknown = sorted(set(lowered) - known)
        if unknown:
            raise ValueError(
                f"unknown option(s) for format 'leasekeeper': {', '.join(unknown)}; "
                f"known: {', '.join(sorted(known))}"
            )
        source = source_from_options(lowered)
        config_fields = {
            name: _config_value(name, lowered[name.lower()])
            for name in _CONFIG_FIELDS
            if name.lower() in lowered
        }
        try:
            config = LeaseConfig(**config_fields)
        except ConfigError as exc:
            raise ValueError(f"format 'leasekeeper': {exc}") from None
        stream: dict[str, Any] = {}
        for name, kind in _STREAM_KEYS.items():
            if name in lowered:
                stream[name] = _convert(name, lowered[name], kind)
        for name in ("log_level", "renewer"):
            word = stream.get(name)
            if isinstance(word, str):
                stream[name] = word.upper() if name == "log_level" else word.lower()
        return cls(source=source, config=config, **stream)

    def to_options(self) -> dict[str, str]:
        """These options as the format's strings (``parse`` gives them back)."""
        out = source_options(self.source)
        for name, field in _CONFIG_FIELDS.items():
            value = getattr(self.config, name)
            if value is not None and value != field.default:
                out[name] = value if isinstance(value, str) else repr(value)
        defaults = StreamOptions.__dataclass_fields__
        for name in _STREAM_KEYS:
            value = getattr(self, name)
            if value is not None and value != defaults[name].default:
                out[name] = str(value)
        return out

    @property
    def lease_ahead(self) -> int:
        """How many messages the reader keeps received and leased ahead of Spark."""
        return self.max_messages_per_batch if self.prefetch is None else self.prefetch

    def apply_log_level(self) -> None:
        """In the reader's own process: log ``leasekeeper`` records at ``log_level`` to
        stderr (which Spark passes on to the driver's), if a level was asked for."""
        if self.log_level is None:
            return
        logger = logging.getLogger("leasekeeper")
        logger.setLevel(self.log_level)
        if not logger.handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(
                logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
            )
            logger.addHandler(handler)


# option name -> its type
_STREAM_KEYS: dict[str, type] = {
    "max_messages_per_batch": int,
    "partitions": int,
    "receive_concurrency": int,
    "poll_seconds": float,
    "fill_seconds": float,
    "log_level": str,
    "prefetch": int,
    "renewer": str,
}


def _convert(name: str, text: str, kind: type) -> Any:
    if kind is str:
        return text.strip()
    try:
        return kind(text.strip())
    except ValueError:
        raise ValueError(
            f"option {name!r} must be {'an integer' if kind is int else 'a number'}, got {text!r}"
        ) from None


def _config_value(name: str, text: str) -> Any:
    if name == "on_cap" or (name == "extend_threshold" and text.strip() == "auto"):
        return text.strip()  # a word, not a number
    if name == "max_concurrency":
        return _convert(name, text, int)
    if text.strip().lower() == "none":
        return None
    return _convert(name, text, float)


def stream_options(
    source: Source,
    *,
    config: LeaseConfig | None = None,
    max_messages_per_batch: int = DEFAULT_MAX_MESSAGES_PER_BATCH,
    partitions: int = 1,
    receive_concurrency: int = 8,
    poll_seconds: float = 1.0,
    fill_seconds: float = 2.0,
    log_level: str | None = None,
    prefetch: int | None = None,
    renewer: Renewer = "auto",
) -> StreamOptions:
    """``read_stream``'s arguments, checked, as ``StreamOptions``."""
    if config is not None and not isinstance(config, LeaseConfig):
        raise TypeError(f"config must be a LeaseConfig, got {type(config).__name__}")
    source_options(source)  # TypeError for anything but a URLSpec or the three sources
    return StreamOptions(
        source=source,
        config=config if config is not None else LeaseConfig(),
        max_messages_per_batch=max_messages_per_batch,
        partitions=partitions,
        receive_concurrency=receive_concurrency,
        poll_seconds=poll_seconds,
        fill_seconds=fill_seconds,
        log_level=log_level.upper() if isinstance(log_level, str) else log_level,
        prefetch=prefetch,
        renewer=renewer,
    )
