"""The documentation's shell blocks as tests: the ones a page marks to run.

A ```` ```sh ```` block right after ``<!-- shell: run -->`` runs in ``bash -e``, as
written, in the page's *shell session*: one working directory (a temporary one of
the page's) and one environment for all of the page's run blocks, so a block runs
where the last one left off (``cd``, ``export``, ``. env/bin/activate``). The
session starts from the test's environment with the suite's virtualenv first on
PATH (the reader's environment, leasekeeper installed), and Node.js where the
Makefile put it. What a block exports is the reader's ``export``: the page's later
Python blocks see it too (``harness.setenv``).

Options, after a comma each:

- ``serves PORT``: the block's first line is a server (an emulator) that runs until
  the page ends: it is started in the background, in the repository's directory
  (where ``npm install`` put Azurite: ``npx -p azurite`` uses that copy, offline),
  and the block goes on once something listens on PORT. A page's fixed port is
  taken by one test at a time on the machine (a lock file); taken by another
  program, the block fails and says so.
- ``repository URL``: the page spells the repository's URL as ``URL`` (leasekeeper
  has no public home yet): the block runs with a ``file://`` URL of a bare clone of
  this checkout in its place - the committed tree, as a clone would get it.
- ``timeout S``: how long the block may take (default 600 s: an install).

``<!-- shell: not run "why" -->`` marks a block that cannot run here (Docker); a
page whose blocks must all be accounted for lists itself in ``ACCOUNTED``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from sybil import Document, Example, Region

REPO = Path(__file__).resolve().parents[2]

#: A run block, its options, and the block it marks.
DIRECTIVE = re.compile(
    r"<!-- shell: (?P<verb>run|not run)(?P<options>[^\n]*?) -->[ \t]*\n(?:[ \t]*\n)?"
    r"```sh\n(?P<body>.*?)\n```",
    re.DOTALL,
)
FENCE = re.compile(r"^```sh\n", re.MULTILINE)

#: Pages whose every shell block runs or says why it cannot.
ACCOUNTED = ("installation.md", "local-development.md")

#: The variables a block's run changes that are the session's, not the reader's
#: exports for the page's Python.
SESSION_ONLY = frozenset(
    {"PATH", "VIRTUAL_ENV", "VIRTUAL_ENV_PROMPT", "PS1", "_", "SHLVL", "PWD", "OLDPWD"}
)

SERVER_START_TIMEOUT = 120.0


@dataclass
class ShellBlock:
    body: str
    options: dict[str, str] = field(default_factory=dict)
    line: int = 0


def parse_options(text: str) -> dict[str, str]:
    """``, serves 10001, timeout 60`` -> {"serves": "10001", "timeout": "60"}."""
    options: dict[str, str] = {}
    for given in text.split(","):
        part = given.strip()
        if not part:
            continue
        name, _, value = part.partition(" ")
        if name not in ("serves", "repository", "timeout"):
            raise ValueError(f"unknown shell block option {name!r}")
        options[name] = value.strip()
    return options


def not_run_reason(text: str) -> str:
    match = re.fullmatch(r'\s*"([^"]+)"\s*', text)
    if match is None:
        raise ValueError('"shell: not run" must say why: <!-- shell: not run "needs Docker" -->')
    return match.group(1)


class ShellBlockParser:
    """The Sybil parser of the ``<!-- shell: run -->`` blocks (see the module)."""

    def __init__(self, evaluator: Callable[[Example], Any]) -> None:
        self.evaluator = evaluator

    def __call__(self, document: Document) -> Iterable[Region]:
        for match in DIRECTIVE.finditer(document.text):
            if match["verb"] == "not run":
                not_run_reason(match["options"])
                continue
            line = document.text.count("\n", 0, match.start("body")) + 1
            block = ShellBlock(match["body"], parse_options(match["options"]), line)
            yield Region(match.start(), match.end(), block, self.evaluator)


def unaccounted_blocks(text: str) -> list[int]:
    """The lines of the shell blocks of ``text`` no directive marks."""
    marked = {m.start("body") - len("```sh\n") for m in DIRECTIVE.finditer(text)}
    return [
        text.count("\n", 0, m.start()) + 1 for m in FENCE.finditer(text) if m.start() not in marked
    ]


class ShellSession:
    """One page's shell: its directory, environment, servers (see the module)."""

    def __init__(self, setenv: Callable[[str, str], None]) -> None:
        self._setenv = setenv
        self._dir = tempfile.TemporaryDirectory(prefix="docs-shell-")
        self.cwd = Path(self._dir.name)
        path = [str(Path(sys.executable).parent)]
        from tests import toolchain

        node = toolchain.node()
        if node is not None:
            path.append(str(node.parent))
        self.env = {**os.environ, "PATH": os.pathsep.join([*path, os.environ.get("PATH", "")])}
        self.env.pop("VIRTUAL_ENV", None)
        self._servers: list[tuple[subprocess.Popen[bytes], IO[bytes], str]] = []
        self._locks: list[IO[str]] = []
        self._upstream: tempfile.TemporaryDirectory[str] | None = None

    # ------------------------------------------------------------------ running

    def run(self, block: ShellBlock, page: str) -> None:
        body = block.body
        url = block.options.get("repository")
        if url:
            body = body.replace(url, self._repository())
        if "serves" in block.options:
            first, _, body = body.partition("\n")
            self._serve(first, int(block.options["serves"]), f"{page}:{block.line}")
        if body.strip():
            self._run(body, float(block.options.get("timeout", 600)), f"{page}:{block.line}")

    def _repository(self) -> str:
        """A ``file://`` URL of this checkout's committed tree, as
        ``.../leasekeeper.git`` (a clone of it is ``leasekeeper``, as the page's is)."""
        if self._upstream is None:
            self._upstream = tempfile.TemporaryDirectory(prefix="docs-upstream-")
            bare = Path(self._upstream.name) / "leasekeeper.git"
            subprocess.run(
                ["git", "clone", "--quiet", "--bare", str(REPO), str(bare)],
                check=True,
                capture_output=True,
                timeout=300,
            )
        return f"file://localhost{Path(self._upstream.name) / 'leasekeeper.git'}"

    def _run(self, body: str, timeout: float, where: str) -> None:
        state = self.cwd / ".docs-shell-state"
        state.mkdir(exist_ok=True)
        script = (
            f"set -e\ncd {_quoted(str(self.cwd))}\n{body}\n"
            f"pwd > {_quoted(str(state / 'cwd'))}\nenv -0 > {_quoted(str(state / 'env'))}\n"
        )
        try:
            result = subprocess.run(
                ["bash", "-c", script],
                env=self.env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"{where}: the block ran for more than {timeout:g} s") from exc
        if result.returncode != 0:
            raise AssertionError(
                f"{where}: the block exited {result.returncode}\n--- stdout\n"
                f"{result.stdout[-4000:]}\n--- stderr\n{result.stderr[-4000:]}"
            )
        self.cwd = Path((state / "cwd").read_text().strip())
        after = dict(
            item.split("=", 1) for item in (state / "env").read_text().split("\0") if "=" in item
        )
        for name, value in after.items():
            if self.env.get(name) != value and name not in SESSION_ONLY:
                self._setenv(name, value)  # the reader's export, for the page's Python
        self.env = after

    def _serve(self, command: str, port: int, where: str) -> None:
        self._lock_port(port, where)
        log = tempfile.TemporaryFile()  # noqa: SIM115 - kept open for the server's life
        server = subprocess.Popen(
            ["bash", "-c", f"exec {command}"],
            cwd=REPO,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._servers.append((server, log, where))
        deadline = time.monotonic() + SERVER_START_TIMEOUT
        while time.monotonic() < deadline:
            if server.poll() is not None:
                raise AssertionError(
                    f"{where}: the server exited {server.returncode}:\n{_tail(log)}"
                )
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
                return
            time.sleep(0.2)
        raise AssertionError(
            f"{where}: nothing listened on port {port} after {SERVER_START_TIMEOUT:g} s:\n"
            f"{_tail(log)}"
        )

    def _lock_port(self, port: int, where: str) -> None:
        """Take the page's fixed port for this test, on the whole machine."""
        lock = open(Path(tempfile.gettempdir()) / f"leasekeeper-docs-port-{port}.lock", "w")  # noqa: SIM115
        deadline = time.monotonic() + 600
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    lock.close()
                    raise AssertionError(f"{where}: port {port} stayed locked for 600 s") from None
                time.sleep(0.5)
        self._locks.append(lock)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                raise AssertionError(
                    f"{where}: port {port}, which the page's command listens on, is in use by "
                    "another program"
                ) from None

    def close(self) -> None:
        for server, log, _ in self._servers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(server.pid, signal.SIGKILL)
                server.wait(10)
            log.close()
        self._servers = []
        for lock in self._locks:
            lock.close()  # releases the flock
        self._locks = []
        self._dir.cleanup()
        if self._upstream is not None:
            self._upstream.cleanup()


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _tail(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read()[-4000:].decode(errors="replace")
