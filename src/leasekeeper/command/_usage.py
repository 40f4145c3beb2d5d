"""What the worker command checks before it runs: the handler ``MODULE:HANDLER``
names (importable, callable with one message, sync or async), and the one-line
``UsageError`` every such check raises (exit code 2)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable
from typing import Any

from leasekeeper.errors import LeaseError


class UsageError(Exception):
    """What the user gave cannot work: one line on stderr, exit code 2."""


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    plain = isinstance(exc, (LeaseError, ImportError, UsageError))
    return text if plain else f"{type(exc).__name__}: {text}"


def load_handler(path: str) -> Callable[..., object]:
    """The callable named by ``MODULE:HANDLER`` (the current directory importable)."""
    module_name, colon, attribute = path.partition(":")
    if not colon or not module_name or not attribute:
        raise UsageError(f"the handler must be MODULE:HANDLER (e.g. jobs:handle), got {path!r}")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name + ".").startswith(exc.name + "."):
            raise UsageError(f"no module named {exc.name!r} (for handler {path!r})") from exc
        raise UsageError(f"importing {module_name!r} failed: {one_line(exc)}") from exc
    except Exception as exc:
        raise UsageError(f"importing {module_name!r} failed: {one_line(exc)}") from exc
    handler: Any = module
    for part in attribute.split("."):
        try:
            handler = getattr(handler, part)
        except AttributeError:
            raise UsageError(
                f"module {module_name!r} has no {attribute!r} (for handler {path!r})"
            ) from None
    if not callable(handler):
        raise UsageError(f"{path!r} is a {type(handler).__name__}, not a callable")
    return handler  # type: ignore[no-any-return]


def check_handler(handler: Callable[..., object], path: str) -> None:
    """Refuse a handler that cannot be called with one message, before anything is
    received (rather than failing every message)."""
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # no signature to read (some builtins): let it run
        return
    try:
        signature.bind(object())
    except TypeError as exc:
        raise UsageError(
            f"the handler {path!r} cannot be called with one message: it takes {signature} "
            f"({exc}); give it one parameter for the message: def handle(message)"
        ) from None


def is_async(handler: Callable[..., object]) -> bool:
    """A coroutine function, or an object whose __call__ method is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        type(handler).__call__
    )
