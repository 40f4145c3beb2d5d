"""The documentation's code blocks as tests, through Sybil (docs/contributing.md).

Sybil finds every fenced ``python`` block of README.md and docs/**.md, and every
hidden one (``<!-- invisible-code-block: python ... -->``), and runs them in order,
each page in one namespace of its own. ``<!-- skip: next "why" -->`` skips the next
block, and must say why. A block with a top-level ``await`` or ``async with`` runs
as the body of a coroutine on the page's event loop. Each block runs under the
page's ``DocsHarness`` (tests/docs/harness.py), which checks that nothing was lost.
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Iterable
from pathlib import Path
from types import CodeType
from typing import Any

import pytest
from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown.codeblock import CodeBlockParser
from sybil.parsers.markdown.skip import SkipParser

from tests.docs.shell import ShellBlockParser

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"


def documented_pages() -> list[Path]:
    """The files whose code blocks run: README.md and every page under docs/."""
    return [README, *sorted(DOCS.rglob("*.md"))]


class ReasonedSkipParser(SkipParser):
    """Sybil's ``<!-- skip: next "reason" -->``, which must give its reason."""

    def __call__(self, document: Document) -> Iterable[Region]:
        for region in super().__call__(document):
            action, reason = region.parsed
            if action in ("next", "start") and not (reason or "").strip():
                raise ValueError(
                    f"{document.path}, {document.line_column(region.start)}: "
                    f'"skip: {action}" must say why the block cannot run: '
                    f'<!-- skip: {action} "needs a Spark cluster" -->'
                )
            yield region


def shifted(code: CodeType, lines: int) -> CodeType:
    """``code`` (and the functions and classes in it) moved down by ``lines`` lines."""
    constants = tuple(shifted(c, lines) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_firstlineno=code.co_firstlineno + lines, co_consts=constants)


def evaluate_block(example: Example) -> None:
    """Run one block in its page's namespace, under the page's harness."""
    __tracebackhide__ = True
    namespace: dict[str, Any] = example.namespace
    harness = namespace["harness"]
    harness.bind(namespace)
    code = compile(
        example.parsed,
        example.path,
        "exec",
        flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
        dont_inherit=True,
    )
    # Line numbers of the page, so that a failure shows the block, not the page above it.
    code = shifted(code, example.line + example.parsed.line_offset)
    with harness.running_block(example.path):
        if code.co_flags & inspect.CO_COROUTINE:
            harness.loop.run_until_complete(eval(code, namespace))
        else:
            exec(code, namespace)
    namespace.pop("__builtins__", None)


def evaluate_shell(example: Example) -> None:
    """Run one ``<!-- shell: run -->`` block in its page's shell session
    (tests/docs/shell.py)."""
    __tracebackhide__ = True
    harness = example.namespace["harness"]
    harness.shell.run(example.parsed, example.path)


DOCS_SYBIL = Sybil(
    parsers=[
        ReasonedSkipParser(),
        CodeBlockParser(language="python", evaluator=evaluate_block),
        ShellBlockParser(evaluate_shell),
    ],
    patterns=["*.md"],
    path=str(REPO),
    fixtures=["harness"],
)
_collect = DOCS_SYBIL.pytest()


def collect_docs(file_path: Path, parent: pytest.Collector) -> Any:
    """The ``pytest_collect_file`` hook of the repository's conftest.py."""
    if file_path in documented_pages():
        return _collect(file_path, parent)
    return None
