"""The shape of the code: no import cycles (type-only and lazy imports included), a
package's private modules reached only through the package, a small top level, no huge
classes or modules, no module importing another's underscored names, public types in
public modules, docstrings that name what exists, a design doc that stands alone and
maps the tree."""

from __future__ import annotations

import ast
import builtins
import importlib
import keyword
import re
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "leasekeeper"
DOCS = Path(__file__).resolve().parents[2] / "docs"
MAX_CLASS_LINES = 400
MAX_MODULE_LINES = 700
MAX_TOP_LEVEL_MODULES = 20


def modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def package_of(name: str, path: Path) -> str:
    """The package a module belongs to: its own name for a package's ``__init__``."""
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def imported_modules(name: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """Every leasekeeper module ``name`` imports, with the line: at top level, inside a
    function (a lazy import is still an import) or under ``if TYPE_CHECKING:`` (a
    type-only import still ties the two modules together: a reader, mypy and a
    refactoring see the circle)."""
    package = package_of(name, path)
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text())):
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
            if module:
                out.append((node.lineno, module))
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules whose code runs because ``name`` imports: each imported module and
    the packages above it (importing ``a.b.c`` runs ``a/b/__init__.py`` first), but
    not ``name`` itself or its own packages (those are already being imported)."""
    out: set[str] = set()
    for _, imported in imported_modules(name, path, known):
        module = imported
        while module:
            if module == name or name.startswith(module + "."):
                break
            out.add(module)
            module = module.rpartition(".")[0]
    return out


def test_no_import_cycles_type_only_and_lazy_imports_included() -> None:
    found = modules()
    graph = {name: imports_of(name, path, set(found)) for name, path in found.items()}
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
    ("leasekeeper.backends.sqs.lean", "signer._credentials"): (
        "botocore keeps a client's credentials object only on its request signer; the "
        "lean SQS path signs with that very object (no public accessor)"
    ),
    ("leasekeeper.backends.sqs.lean", "events._emitter"): (
        "botocore's handler table, read to tell a user's event hook from botocore's own"
    ),
    ("leasekeeper.backends.sqs.lean", "events._emitter._handlers"): "the same",
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
    limits = {"redis": 410, "sqs/backend": 680, "mns": 680, "azure": 680}
    sizes = {
        name: len((SRC / "backends" / f"{name}.py").read_text().splitlines()) for name in limits
    }
    assert {name: n for name, n in sizes.items() if n > limits[name]} == {}


def private_package(module: str) -> str | None:
    """The package a private module belongs to (``leasekeeper.engine`` for
    ``leasekeeper.engine._engine``); None for a public module."""
    parts = module.split(".")
    for i, part in enumerate(parts[1:], 1):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def test_a_packages_private_modules_are_reached_only_through_the_package() -> None:
    """A module named ``_x`` is its package's own: its siblings import it; any other
    module imports what the package offers from the package itself (its ``__init__``
    names the seam) or from a public module of it. So a newcomer can read a package
    from its ``__init__`` and know that nothing else leans on its insides."""
    found = modules()
    offenders = []
    for name, path in found.items():
        for line, module in imported_modules(name, path, set(found)):
            owner = private_package(module)
            if owner is not None and owner != package_of(name, path):
                offenders.append(f"{name}:{line}: imports {module} (private to {owner})")
    assert offenders == []


def test_at_most_20_modules_at_the_top_level() -> None:
    """The top level holds the public API and the modules users import by path; the
    engine, the renewers, the receiving loop, the command and the integrations are
    packages of their own (docs/design.md, "Module map")."""
    top = sorted(path.name for path in SRC.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top


def test_no_module_is_longer_than_700_lines() -> None:
    """A module past 700 lines holds more than one concept (the testing tools' local
    MNS server, a test double of a whole service, is left out)."""
    long = {
        name: n
        for name, path in modules().items()
        if not name.startswith("leasekeeper.testing")
        and (n := len(path.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_public_types_are_defined_in_public_modules() -> None:
    """Every class the public API names (``leasekeeper.__all__``, and the public
    packages' own) is defined in a module a user may import by its path: ``Stats``
    in ``leasekeeper.engine.stats``, not in a private ``_metrics``."""
    misplaced = []
    for package in (
        "leasekeeper",
        "leasekeeper.aio",
        "leasekeeper.testing",
        "leasekeeper.timeline",
        "leasekeeper.backends.base",
    ):
        module = importlib.import_module(package)
        for export in getattr(module, "__all__", ()):
            value = getattr(module, export)
            defined_in = getattr(value, "__module__", "")
            if isinstance(value, type) and private_package(defined_in) is not None:
                misplaced.append(f"{package}.{export}: defined in {value.__module__}")
    assert misplaced == []


# Names of other libraries' functions, settings and fields that docstrings cite, and
# whose they are: a name cited in double backticks must be defined in leasekeeper,
# Python or here.
_FOREIGN_NAMES = {
    "expires_on": "azure-storage-queue: a message's expiry",
    "next_visible_on": "azure-storage-queue: when a message shows again",
    "decode_responses": "redis-py: a client option",
    "task_acks_on_failure_or_timeout": "celery: a setting",
    "task_reject_on_worker_lost": "celery: a setting",
    "wait_time_seconds": "kombu: an SQS transport option",
    "after_consumer_thread_boot": "dramatiq: a middleware hook",
    "requeue_messages": "dramatiq: Worker.requeue_messages",
    "update_message": "azure-storage-queue: QueueClient.update_message",
    "ceil": "math.ceil",
    "getppid": "os.getppid",
    "parse_qs": "urllib.parse.parse_qs",
    "unquote_plus": "urllib.parse.unquote_plus",
    "prometheus_client": "the Prometheus client library",
    "traceparent": "W3C Trace Context: the header that carries a span's context",
    "tracestate": "W3C Trace Context: the vendors' header beside it",
    "baggage": "W3C Baggage: the header of name=value pairs",
    "extract": "opentelemetry.propagate.extract",
    "services": "botocore: a [services ...] section of the shared config file",
    "secret_key": "botocore: ReadOnlyCredentials.secret_key",
    "email": "the standard library's email package (http.client parses headers with it)",
    "sendall": "socket.socket.sendall",
    "recv": "socket.socket.recv",
}
_ENTRY_POINT = re.compile(r"\b(leasekeeper(?:\.\w+)*):(\w+)")
_CITED = re.compile(r"``((?:[A-Za-z_]\w*\.)*)([a-z_][a-z0-9_]*)(\([^`]*\))?``")


DOCUMENTED = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def defined_names() -> set[str]:
    """Every name leasekeeper defines: functions, classes, variables, attributes,
    parameters and keywords, modules, and the identifiers its strings hold."""
    names = {path.stem for path in SRC.rglob("*.py")} | {
        p.name for p in SRC.rglob("*") if p.is_dir()
    }
    for path in SRC.rglob("*.py"):
        tree = ast.parse(path.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, DOCUMENTED)
            and ast.get_docstring(node) is not None
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and id(node) in docstrings:
                continue  # what a docstring says is not what the code defines
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                names.add(node.attr)
            elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
                names.add(node.arg)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    names.update((alias.asname or alias.name).split("."))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.update(re.findall(r"[a-z_][a-z0-9_]*", node.value))
    return names


def stdlib_has(dotted: str, name: str) -> bool:
    head = dotted.rstrip(".").split(".")[0]
    if hasattr(builtins, head):
        return True  # type.__call__
    if not head or head not in sys.stdlib_module_names:
        return False
    return hasattr(importlib.import_module(head), name) or "." in dotted.rstrip(".")


def test_docstrings_name_only_what_exists() -> None:
    """A name a docstring cites in double backticks (``from_url``, ``spec_of()``,
    ``lease.check()``) is something leasekeeper (or Python, or a library listed in
    ``_FOREIGN_NAMES``) defines: a reader who looks for it finds it."""
    known = defined_names() | set(_FOREIGN_NAMES)
    missing = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(
                node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
            ):
                continue
            doc = ast.get_docstring(node) or ""
            for match in _CITED.finditer(doc):
                prefix, cited = match.group(1), match.group(2)
                if cited in known or keyword.iskeyword(cited) or hasattr(builtins, cited):
                    continue
                if stdlib_has(prefix, cited) or cited in ("py", "toml", "md"):
                    continue
                missing.append(f"{name}:{getattr(node, 'lineno', 1)}: ``{match.group(0)[2:-2]}``")
            # An entry point written out ("leasekeeper.backends.schemes:sqs") names a
            # module and a function of it that exist.
            for module, function in _ENTRY_POINT.findall(doc):
                target = modules().get(module)
                if target is None or not re.search(
                    rf"^(def|class) {function}\b|^{function} =", target.read_text(), re.MULTILINE
                ):
                    missing.append(f"{name}:{getattr(node, 'lineno', 1)}: {module}:{function}")
    assert missing == []


def test_design_doc_maps_every_package_and_top_level_module() -> None:
    """docs/design.md's module map has one row per top-level module and package, and
    no row for anything that is not in the tree."""
    text = (DOCS / "design.md").read_text()
    section = re.split(r"\n##+ ", text.split("## Module map", 1)[1], maxsplit=1)[0]
    rows = set(re.findall(r"^\| `([\w./]+)` \|", section, re.MULTILINE))
    tree = {p.name for p in SRC.glob("*.py")} | {
        f"{p.name}/" for p in SRC.iterdir() if (p / "__init__.py").is_file()
    }
    assert sorted(rows - tree) == [], "rows for what is not in the tree"
    assert sorted(tree - rows) == [], "in the tree, not in the map"
