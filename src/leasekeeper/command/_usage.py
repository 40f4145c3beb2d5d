"""What the worker command checks before it runs: the handler ``MODULE:HANDLER``
names (importable, callable with one message, sync or async), and the one-line
``UsageError`` every such check raises (exit code 2)."""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from leasekeeper.errors import LeaseError
from leasekeeper.receiving import handler_signature_problem


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
        raise UsageError(f"importing {module_name!r} failed: {one_line(exc)}{where(exc)}") from exc
    except Exception as exc:
        raise UsageError(f"importing {module_name!r} failed: {one_line(exc)}{where(exc)}") from exc
    handler: Any = module
    for part in attribute.split("."):
        try:
            handler = getattr(handler, part)
        except AttributeError:
            raise UsageError(
                f"module {module_name!r} has no {attribute!r} (for handler {path!r})"
            ) from None
    if not callable(handler):
        kind = type(handler).__name__
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        raise UsageError(f"{path!r} is {article} {kind}, not a callable: name a function")
    return handler  # type: ignore[no-any-return]


#: The frames an import failure shows: the last ones, where the user's code failed.
FRAMES_SHOWN = 4


def where(exc: BaseException) -> str:
    """Where ``exc`` was raised in the user's code, as the last frames of a traceback
    (file, line and source line each; importlib's own frames left out), on lines of
    their own after the error's line. A SyntaxError's is where its code is wrong."""
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<frozen ") and not _is_ours(frame.filename)
    ]
    lines = traceback.format_list(frames[-FRAMES_SHOWN:])
    if isinstance(exc, SyntaxError) and exc.filename is not None:
        lines.append(f'  File "{exc.filename}", line {exc.lineno}\n')
        if exc.text:
            lines.append(f"    {exc.text.strip()}\n")
    text = "".join(lines).rstrip("\n")
    return f"\n{text}" if text else ""


def _is_ours(filename: str) -> bool:
    """A frame of leasekeeper's or of importlib's, not of the code imported."""
    return filename == importlib.__file__ or filename.startswith(
        os.path.dirname(os.path.abspath(__file__))
    )


def check_handler(handler: Callable[..., object], path: str) -> None:
    """Refuse a handler that cannot be called with one message, before anything is
    received (rather than failing every message): the workers' own check."""
    problem = handler_signature_problem(handler)
    if problem is not None:
        raise UsageError(
            f"the handler {path!r} {problem}; give it one parameter for the message: "
            "def handle(message)"
        )


def is_async(handler: Callable[..., object]) -> bool:
    """A coroutine function, or an object whose __call__ method is one."""
    return inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        type(handler).__call__
    )
