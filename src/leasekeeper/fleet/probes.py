"""Kubernetes probes for a worker: ``/livez`` and ``/readyz`` (``serve_probes``).

``serve_probes(worker, port)`` (``leasekeeper worker --health-port PORT``) serves,
from a daemon thread (``leasekeeper-probes``), two plain-text answers:

- ``/livez``: 200 while the renewer keeps up - running (its process alive), or its
  process being replaced after it died - and the scheduler's median lag (of its last
  2,048 wake-ups) within ``lag_limit`` (default: the extend threshold in force: a
  renewer later than that renews after the deadlines); 503 otherwise, with the
  reason in the body. It fails only where a restart can help: a renewer that is
  gone, or a process too starved or stuck to renew.
- ``/readyz``: 200 while the worker receives; 503 before ``run()`` starts, and from
  the first SIGTERM (or ``stop()``, ``drain()``, an interruption notice) on, while
  its running handlers finish - so a rollout waits for the new pod to receive, and
  the old one is seen as going at once.

A check reads ``manager.stats()`` (a renewer process answers it over its socket);
one check runs at a time, and a probe that finds one under way waits for it up to
``check_timeout`` seconds, then answers 503 itself: a renewer that does not answer
is not keeping up. The server is one of the worker's listeners (it learns from them
when ``run()`` starts and ends): call ``serve_probes`` before ``run()``.
"""

from __future__ import annotations

import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, NamedTuple, Protocol

from leasekeeper.manager import LeaseManager
from leasekeeper.receiving.listeners import Listeners, WorkerListener

__all__ = ["Health", "ProbeServer", "renewer_health", "serve_probes"]


class Health(NamedTuple):
    """A probe's answer: ``ok``, and why (the body of the answer)."""

    ok: bool
    reason: str


class ProbedWorker(Protocol):
    """What the probes read of a ``Worker`` or ``AsyncWorker``."""

    manager: LeaseManager
    listeners: Listeners

    @property
    def stopping(self) -> bool: ...


def renewer_health(manager: LeaseManager, *, lag_limit: float | None = None) -> Health:
    """Whether ``manager``'s renewer keeps up (see the module docstring): running or
    being replaced (a renewer process's ``replacing``: it died, and a new one is on
    its way), and a median scheduler lag
    within ``lag_limit`` seconds (None: the extend threshold in force)."""
    renewer = manager.renewer
    if manager.closed:
        return Health(False, "the lease manager is closed: nothing is renewed")
    if not manager.running:
        if getattr(renewer, "replacing", False):  # a renewer process's (not a thread's)
            return Health(True, "the renewer process died and is being replaced")
        return Health(False, f"the {renewer.name} renewer is not running: leases are not renewed")
    stats = manager.stats()
    limit = stats.extend_threshold if lag_limit is None else lag_limit
    lag = stats.scheduler_lag_p50
    if limit > 0 and lag > limit:
        return Health(
            False,
            f"the scheduler is late: median lag {lag:.3f}s over the {limit:g}s limit "
            "(renewals go out after their deadlines)",
        )
    pid = manager.renewer_pid
    where = f" (pid {pid})" if pid != os.getpid() else ""
    return Health(
        True,
        f"the {renewer.name} renewer{where} keeps up: scheduler lag p50 "
        f"{lag * 1000:.0f} ms, p99 {stats.scheduler_lag_p99 * 1000:.0f} ms",
    )


class ProbeServer(WorkerListener):
    """``/livez`` and ``/readyz`` of one worker over HTTP (made by ``serve_probes``);
    ``close()`` stops serving. ``liveness()`` and ``readiness()`` are the answers."""

    def __init__(
        self,
        worker: ProbedWorker,
        *,
        lag_limit: float | None = None,
        check_timeout: float = 2.0,
    ) -> None:
        self.worker = worker
        self.lag_limit = lag_limit
        self.check_timeout = check_timeout
        self._receiving = self._draining = self._ended = False
        self._checking = threading.Lock()  # one liveness check at a time
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.addr = ""
        self.port = 0

    # ------------------------------------------------------------------ the answers

    def liveness(self) -> Health:
        if not self._checking.acquire(timeout=self.check_timeout):
            return Health(
                False,
                f"the renewer did not answer within {self.check_timeout:g}s (a check is "
                "still waiting for it)",
            )
        try:
            return renewer_health(self.worker.manager, lag_limit=self.lag_limit)
        except Exception as exc:  # a renewer that cannot say: not keeping up
            return Health(False, f"the renewer's health could not be read: {type(exc).__name__}")
        finally:
            self._checking.release()

    def readiness(self) -> Health:
        if self._ended:
            return Health(False, "the worker has stopped")
        if self._draining or self.worker.stopping:
            return Health(False, "draining: no longer receiving; running handlers finish")
        if not self._receiving:
            return Health(False, "not receiving yet")
        return Health(True, "receiving")

    # ------------------------------------------------------------------ the worker's moments

    def started(self) -> None:
        self._receiving, self._draining, self._ended = True, False, False

    def draining(self) -> None:
        self._draining = True

    def stopped(self) -> None:
        self._receiving, self._ended = False, True

    # ------------------------------------------------------------------ serving

    def serve(self, port: int, addr: str = "0.0.0.0") -> ProbeServer:
        """Serve on ``addr:port`` (``port=0``: a free one; ``self.port`` says which)."""
        probes = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                path = self.path.split("?", 1)[0].rstrip("/")
                if path == "/livez":
                    health = probes.liveness()
                elif path == "/readyz":
                    health = probes.readiness()
                else:
                    self._answer(404, "not found: /livez or /readyz")
                    return
                text = ("ok: " if health.ok else "") + health.reason
                self._answer(200 if health.ok else 503, text)

            def _answer(self, status: int, text: str) -> None:
                body = (text + "\n").encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # a probe every few seconds is not worth a line on stderr

        family = socket.AF_INET6 if ":" in addr else socket.AF_INET

        class Server(ThreadingHTTPServer):
            address_family = family
            daemon_threads = True

        server = Server((addr, port), Handler)
        self._server = server
        self.addr, self.port = addr, int(server.server_address[1])
        self._thread = threading.Thread(
            target=server.serve_forever, name="leasekeeper-probes", daemon=True
        )
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        host = f"[{self.addr}]" if ":" in self.addr else self.addr
        return f"http://{host}:{self.port}"

    def close(self) -> None:
        """Stop serving and free the port."""
        self.worker.listeners.remove(self)
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()
        if self._thread is not None:
            self._thread.join(5.0)

    def __repr__(self) -> str:
        return f"<ProbeServer {self.url}>"


def serve_probes(
    worker: ProbedWorker,
    port: int,
    *,
    addr: str = "0.0.0.0",
    lag_limit: float | None = None,
    check_timeout: float = 2.0,
) -> ProbeServer:
    """Serve ``worker``'s ``/livez`` and ``/readyz`` at ``http://addr:port`` (see the
    module docstring) until ``close()``. ``addr`` defaults to every interface: the
    kubelet probes the pod's address, not its loopback. Call it before ``run()``."""
    probes = ProbeServer(worker, lag_limit=lag_limit, check_timeout=check_timeout)
    worker.listeners.add(probes)
    try:
        return probes.serve(port, addr)
    except BaseException:
        worker.listeners.remove(probes)
        raise
