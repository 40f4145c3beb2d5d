"""Queue sources for ``leasekeeper.spark``: the backends' specs under their Spark names.

A source is a small picklable, secret-free description of a queue that builds its
backend where it is used (an executor for ``drain``, the driver-side reader process
for ``read_stream``): ``backend.spec()`` (a ``URLSpec``, with the client's
settings: endpoint, region, retries, timeouts, proxies), ``queue=URL``, or the
older ``SQSSource``, ``MNSSource`` and ``AzureQueueSource``, which are
``SQSSpec`` (``leasekeeper.backends.sqs``), ``MNSSpec`` and ``AzureQueueSpec``
(``leasekeeper.backends.spec``).
None needs an SDK until it builds, so ``leasekeeper.spark`` needs only the SDK
of the service it reads.

Credentials never travel in a source: each process takes them from its own
environment or the cloud SDK's usual chain. ``build_backend`` is the one place a
source becomes a backend; ``source_options``/``source_from_options`` turn a source
into the string options of the ``"leasekeeper"`` streaming format and back.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import sys
from collections.abc import Mapping
from typing import Any

from leasekeeper.backends.contract import Backend
from leasekeeper.backends.spec import BackendSpec, URLSpec
from leasekeeper.backends.urls import factory_for, parse_url

#: Anything with ``build() -> Backend`` that pickles (the older name of BackendSpec).
Source = BackendSpec

# The sources the streaming format knows, by the name its "backend" option takes:
# (the module the spec class lives in, its name there, its Spark name, its fields).
# The fields are listed here so that parsing options imports no SDK;
# tests/spark/test_sources.py checks them against the classes.
SOURCE_KINDS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "sqs": (
        "leasekeeper.backends.sqs",
        "SQSSpec",
        "SQSSource",
        ("queue_url", "region", "endpoint_url", "client_retries"),
    ),
    "mns": ("leasekeeper.backends.spec", "MNSSpec", "MNSSource", ("endpoint", "queue_name")),
    "azure": (
        "leasekeeper.backends.spec",
        "AzureQueueSpec",
        "AzureQueueSource",
        ("queue_name", "connection_string", "account_url", "account_name"),
    ),
}
_SPARK_NAMES = {entry[2]: kind for kind, entry in SOURCE_KINDS.items()}
#: The options of a queue by URL (``backend`` "url"; ``.option("queue", url)`` alone
#: will do): its URL, and its URLSpec's options as JSON.
URL_KEYS = ("queue", "queue_options")
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def __getattr__(name: str) -> Any:
    # SQSSource, MNSSource, AzureQueueSource: the spec classes, imported on first use.
    kind = _SPARK_NAMES.get(name)
    if kind is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return source_class(kind)


def source_class(kind: str) -> type[Any]:
    """The source class of ``kind`` (sqs, mns, azure), its backend module imported."""
    module, name = SOURCE_KINDS[kind][:2]
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def build_backend(source: Source) -> Backend:
    """The backend ``source`` describes, built here, in this process (with this
    process's credentials). Every part of ``leasekeeper.spark`` builds through it."""
    return source.build()


def as_source(source: Source | str | None, queue: str | None = None) -> Source:
    """The source a call names: ``queue=URL`` (or a URL given as the source) is the
    URLSpec of that queue, checked here (ValueError for a malformed URL or a scheme
    no installed package registers); a source is itself."""
    if queue is not None and source is not None:
        raise TypeError("give a source or queue=URL, not both")
    url = queue if queue is not None else source
    if isinstance(url, str):
        factory_for(parse_url(url).scheme)
        return URLSpec.of(url)
    if url is None:
        raise TypeError("name the queue: queue=URL (or a source such as backend.spec())")
    return url


def source_kind(source: object) -> str | None:
    """``sqs``, ``mns`` or ``azure`` for one of the three sources, ``url`` for a
    URLSpec, else None. (A source's class is only ever loaded with its module, so
    nothing is imported.)"""
    if isinstance(source, URLSpec):
        return "url"
    for kind, (module_name, spec_name, _, _) in SOURCE_KINDS.items():
        module = sys.modules.get(module_name)
        if module is not None and type(source) is getattr(module, spec_name, None):
            return kind
    return None


def source_options(source: object) -> dict[str, str]:
    """``source`` as string options: ``backend`` (its kind) and its set fields."""
    kind = source_kind(source)
    if isinstance(source, URLSpec):
        options = {"backend": "url", "queue": source.url}
        if source.options:
            options["queue_options"] = json.dumps(dict(source.options))
        return options
    if kind is None:
        raise TypeError(
            "source must be a queue's URLSpec (backend.spec(), or queue=URL), or SQSSource, "
            f"MNSSource or AzureQueueSource, got {type(source).__name__}"
        )
    options = {"backend": kind}
    for field in dataclasses.fields(source):  # type: ignore[arg-type]
        value = getattr(source, field.name)
        if value is not None and value != field.default:
            options[field.name] = str(value).lower() if isinstance(value, bool) else str(value)
    return options


def source_from_options(options: Mapping[str, str]) -> Source:
    """The source that string options describe (keys lower-case): ``backend`` names
    the kind (sqs, mns, azure), the other keys its fields. Unknown keys are left to
    the caller; a missing required field raises ValueError."""
    kind = options.get("backend", "").strip().lower() or ("url" if "queue" in options else "")
    if kind == "url":
        given = json.loads(options.get("queue_options") or "{}")
        return URLSpec.of(options.get("queue", ""), given)
    if kind not in SOURCE_KINDS:
        raise ValueError(
            f"option 'backend' must be one of {', '.join(SOURCE_KINDS)} or url (or give the "
            f"option queue=URL), got {kind or None!r}"
        )
    cls = source_class(kind)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        value = options.get(field.name.lower())
        if value is not None and value != "":
            values[field.name] = _typed(kind, field, value)
        elif field.default is dataclasses.MISSING:
            raise ValueError(f"backend {kind!r} needs option {field.name!r}")
    return cls(**values)  # type: ignore[no-any-return]


def _typed(kind: str, field: dataclasses.Field[Any], value: str) -> Any:
    if field.type not in ("bool", bool):
        return value
    lowered = value.strip().lower()
    if lowered in _TRUE or lowered in _FALSE:
        return lowered in _TRUE
    raise ValueError(
        f"backend {kind!r}: option {field.name!r} must be true or false, got {value!r}"
    )
