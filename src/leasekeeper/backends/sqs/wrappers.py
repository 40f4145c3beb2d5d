"""Who wraps botocore's call pipeline: instrumentation that sees a call only when
the client makes it.

OpenTelemetry's botocore instrumentation, ddtrace, AWS X-Ray's SDK, Epsagon and
others trace a call by wrapping ``botocore.client.BaseClient._make_api_call``
(and some ``botocore.endpoint.Endpoint``'s steps), most with wrapt, some with
a decorator of their own. The lean SQS path does not run that code, so while
anything wraps it the hot calls go through the client. Told apart generally,
not by vendor: botocore's own function is a plain function whose code, and the
code of everything it wraps (botocore decorates it itself), lives in botocore's
package directory; anything else in its place - a wrapt proxy, a function
defined elsewhere, code swapped in - is a wrapper. ``WrapperWatch.wrapped()``
answers that cheaply enough for every call: it looks again only when one of the
attributes changed.
"""

from __future__ import annotations

import os
import sys
import types
from typing import Any

__all__ = ["CALL_PIPELINE", "WrapperWatch", "wrapper_of"]

#: (module, class, attribute): the steps of a botocore call a tracer wraps.
CALL_PIPELINE = (
    ("botocore.client", "BaseClient", "_make_api_call"),
    ("botocore.client", "BaseClient", "_make_request"),
    ("botocore.endpoint", "Endpoint", "make_request"),
    ("botocore.endpoint", "Endpoint", "create_request"),
    ("botocore.endpoint", "Endpoint", "prepare_request"),
    ("botocore.endpoint", "Endpoint", "_send_request"),
    ("botocore.endpoint", "Endpoint", "_send"),
    ("botocore.httpsession", "URLLib3Session", "send"),
)


def _botocore_dir() -> str | None:
    module = sys.modules.get("botocore")
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else None


def _foreign(found: Any, home: str) -> str | None:
    """What wraps ``found`` (a class attribute of botocore's), or None when it is
    botocore's own function."""
    seen = 0
    while True:
        if type(found) is not types.FunctionType:
            return f"a {type(found).__module__}.{type(found).__qualname__}"
        code = found.__code__
        if not os.path.abspath(code.co_filename).startswith(home):
            return f"{found.__module__}.{found.__qualname__} ({code.co_filename})"
        inner = found.__dict__.get("__wrapped__")
        if inner is None:
            return None
        found = inner
        seen += 1
        if seen > 8:  # a loop of wrappers: not botocore's
            return "a chain of wrappers"


def wrapper_of(client: Any = None) -> str | None:
    """What wraps botocore's call pipeline (or ``client``'s own ``_make_api_call``,
    set on the instance), described in a few words; None when nothing does."""
    home = _botocore_dir()
    if home is None:
        return None  # botocore not imported: nothing can wrap it
    if client is not None and "_make_api_call" in getattr(client, "__dict__", {}):
        return "the client's own _make_api_call (set on the client)"
    for module_name, class_name, attribute in CALL_PIPELINE:
        owner = getattr(sys.modules.get(module_name), class_name, None)
        if owner is None:
            continue
        found = owner.__dict__.get(attribute)
        if found is None:
            continue
        wrapper = _foreign(found, home)
        if wrapper is not None:
            return f"{class_name}.{attribute} is wrapped by {wrapper}"
    if client is not None:  # a subclass's own override (botocore's generated class has none)
        for klass in type(client).__mro__:
            if klass.__module__.startswith("botocore"):
                continue
            if any(name in klass.__dict__ for _, _, name in CALL_PIPELINE[:2]):
                return f"{klass.__qualname__} overrides botocore's calls"
    return None


class WrapperWatch:
    """``wrapped(client)``: what wraps the pipeline now (None: nothing), looked for
    again only when an object in its places, or its code, is another one."""

    def __init__(self) -> None:
        self._places: list[tuple[dict[str, Any], str]] | None = None
        self._seen: list[Any] = []
        self._found: str | None = None

    def _marks(self) -> list[Any]:
        places = self._places
        if places is None:
            places = []
            for module_name, class_name, attribute in CALL_PIPELINE:
                owner = getattr(sys.modules.get(module_name), class_name, None)
                if owner is not None:
                    places.append((owner.__dict__, attribute))
            if len(places) == len(CALL_PIPELINE):  # (else look again: not all imported)
                self._places = places
        marks: list[Any] = []
        for namespace, attribute in places:
            found = namespace.get(attribute)
            marks.append(found)
            marks.append(getattr(found, "__code__", None))
        return marks

    def wrapped(self, client: Any = None) -> str | None:
        if client is not None and "_make_api_call" in getattr(client, "__dict__", {}):
            return "the client's own _make_api_call (set on the client)"
        if "botocore" not in sys.modules:
            return None  # (the renewer process's lean path, before any client is made)
        marks = self._marks()
        seen = self._seen
        # 'is', not '==': a wrapt proxy compares equal to what it wraps
        if len(marks) != len(seen) or any(a is not b for a, b in zip(marks, seen, strict=True)):
            self._found = wrapper_of()
            self._seen = marks
        return self._found
