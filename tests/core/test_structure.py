"""The shape of the code: no import cycles (lazy imports included), no huge classes,
no module importing another's underscored names, a design doc that stands alone."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "leasekeeper"
DOCS = Path(__file__).resolve().parents[2] / "docs"
MAX_CLASS_LINES = 400


def modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def runtime_nodes(tree: ast.AST) -> list[ast.AST]:
    """Every node of ``tree`` except those under ``if TYPE_CHECKING:`` (never run)."""
    out: list[ast.AST] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        out.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and ast.unparse(child.test) == "TYPE_CHECKING":
                todo.extend(child.orelse)
                continue
            todo.append(child)
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every leasekeeper module ``name`` imports when it runs: at top level or inside
    a function (a lazy import is still an import)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in runtime_nodes(ast.parse(path.read_text())):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        for target in targets:
            # "from leasekeeper.x import y": y may be a module or a name in x.
            module = target
            while module and module not in known:
                module = module.rpartition(".")[0]
            if module and module != name and not module.startswith(name + "."):
                out.add(module)
    return out


def test_no_import_cycles_lazy_imports_included() -> None:
    found = modules()
    graph = {name: imports_of(name, path, set(found)) for name, path in found.items()}
    # A package's __init__ importing its submodules is not a cycle of theirs.
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == [], "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_class_is_longer_than_about_400_lines() -> None:
    long = []
    for name, path in modules().items():
        if name.startswith("leasekeeper.testing"):
            continue  # test tools (the local MNS server) are not the library's core
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > MAX_CLASS_LINES:
                    long.append(f"{name}.{node.name}: {length} lines")
    assert long == []


def test_no_module_imports_another_modules_underscored_names() -> None:
    offenders = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("leasekeeper"):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        offenders.append(f"{name}: from {node.module} import {alias.name}")
    assert offenders == []


def test_design_doc_stands_alone() -> None:
    text = (DOCS / "design.md").read_text()
    # Links and paths must stay inside the repository: no ../ and no absolute paths.
    targets = re.findall(r"\]\(([^)]+)\)", text) + re.findall(r"`([^`\s]*\.md)`", text)
    outside = [t for t in targets if t.startswith(("../", "/")) or "shared/" in t]
    assert outside == []
    assert "DESIGN.md" not in text
    for n in range(1, 9):
        assert re.search(rf"^{n}\. \*\*", text, re.MULTILINE), f"rule {n} is not stated"


def test_every_cited_doc_exists() -> None:
    """A docs/*.md path named in the code, the tests or the docs is a file of the repo."""
    root = SRC.parents[1]
    missing = []
    for folder in ("src", "tests", "docs", "examples", "benchmarks"):
        for path in (root / folder).rglob("*"):
            if path.suffix not in (".py", ".md") or not path.is_file():
                continue
            for cited in re.findall(r"\bdocs/[\w/.-]+?\.md\b", path.read_text(errors="replace")):
                if not (root / cited).is_file():
                    missing.append(f"{path.relative_to(root)}: {cited}")
    assert missing == []


# Named-tuple methods are public API despite their underscore.
_NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}
# Other libraries' internals that an integration cannot do without, and why.
_THEIR_INTERNALS = {
    ("leasekeeper.command._options", "argparse._ActionsContainer"): (
        "argparse's common type of a parser and an argument group, for an annotation"
    ),
    ("leasekeeper.dramatiq", "message._sqs_message"): (
        "dramatiq-sqs keeps the boto3 message (its receipt) there and nowhere public"
    ),
    ("leasekeeper.dramatiq", "received._sqs_message"): "the same, on a received message",
    ("leasekeeper.backends.sqs_http", "signer._credentials"): (
        "botocore keeps a client's credentials object only on its request signer; the "
        "lean SQS path signs with that very object (no public accessor)"
    ),
    ("leasekeeper.backends.sqs_http", "events._emitter"): (
        "botocore's handler table, read to tell a user's event hook from botocore's own"
    ),
    ("leasekeeper.backends.sqs_http", "events._emitter._handlers"): "the same",
    ("leasekeeper.integrations.kombu_sqs", "channel._restore"): (
        "kombu's SQS channel requeues through it; a lease must be forgotten first"
    ),
}


def test_no_module_reaches_into_another_objects_underscored_attributes() -> None:
    """``obj._name`` is private to ``obj``'s own class: a sibling asks through a named
    method instead. (``self._x`` and ``cls._x`` are a class's own; the testing tools'
    local MNS server, a test double of a whole service, is left out.)"""
    offenders = []
    for name, path in modules().items():
        if name.startswith("leasekeeper.testing"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute):
                continue
            attr = node.attr
            if not attr.startswith("_") or attr.startswith("__") or attr in _NAMEDTUPLE_API:
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if (name, ast.unparse(node)) in _THEIR_INTERNALS:
                continue
            offenders.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert offenders == []


def test_the_renewer_is_chosen_in_one_place() -> None:
    """``renewer="thread" | "process"`` is decided once, by ``make_renewer``: nothing
    else asks which renewer runs (the seam is the ``Renewer`` protocol)."""
    branching = re.compile(r"""renewer\s*(==|!=|is|in)\s*[("']|==\s*["']process["']""")
    offenders = [
        f"{name}:{n}"
        for name, path in modules().items()
        if name != "leasekeeper.renewers.protocol"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if branching.search(line) or re.search(r"\b_remote\b", line)
    ]
    assert offenders == []


def test_one_place_decides_a_lapse() -> None:
    """Rule 5 - what a call made or answered after the deadline proves - is decided by
    ``_lapse.lapsed`` alone: no other module of the core reads ``rotates_receipts``
    to decide whether a lease is lost."""
    core = {
        name: path
        for name, path in modules().items()
        if not name.startswith(("leasekeeper.backends", "leasekeeper.testing"))
    }
    readers = sorted(name for name, path in core.items() if ".rotates_receipts" in path.read_text())
    # _extend reads it once more, to hand back a message whose lease already ended.
    assert readers == ["leasekeeper.engine._extend", "leasekeeper.engine._lapse"]


def test_import_leasekeeper_needs_no_sdk_and_offers_memory_queue() -> None:
    """``from leasekeeper import MemoryQueue`` works, and importing the package loads
    no SDK (boto3, the MNS and Azure SDKs, PySpark, OpenTelemetry, Prometheus)."""
    code = (
        "import sys\n"
        "from leasekeeper import MemoryQueue\n"
        "queue = MemoryQueue()\n"
        "queue.send('job')\n"
        "assert queue.receive()[0].body == 'job'\n"
        "sdks = ('boto3', 'botocore', 'mns', 'azure', 'pyspark', 'opentelemetry',"
        " 'prometheus_client')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in sdks))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert (result.returncode, result.stdout.strip()) == (0, "[]"), result.stderr


def test_each_backend_module_keeps_only_its_service() -> None:
    """What every backend shares lives in backends/base.py: a service module that
    grows past these sizes is repeating it (Redis Streams, written against that
    contract only, is the measure of what a backend needs)."""
    limits = {"redis": 400, "sqs": 680, "mns": 680, "azure": 680}
    sizes = {
        name: len((SRC / "backends" / f"{name}.py").read_text().splitlines()) for name in limits
    }
    assert {name: n for name, n in sizes.items() if n > limits[name]} == {}
