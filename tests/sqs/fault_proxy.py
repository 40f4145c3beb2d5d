"""A fault-injecting HTTP proxy between a boto3 client and the moto server.

The client's ``endpoint_url`` points at the proxy; the proxy forwards each request
to moto, after an added latency, and fails a share of the requests whose SQS
action it was told to target, in the ways the real service and network fail:

- ``InternalError`` (HTTP 500) and ``ServiceUnavailable`` (503) and
  ``RequestThrottled`` (400), shaped as SQS's JSON protocol in query-compatible
  mode sends them (``__type`` plus the ``x-amzn-query-error`` header);
- ``reset``: the connection is closed without an answer (the request never
  reached the service);
- ``lost_answer``: the request *is* forwarded and applied, then the answer is
  replaced by a 500 (the client cannot tell it worked).

It binds to 127.0.0.1 only and runs in its own process (``FaultProxyProcess``),
as moto does, so its request handling never competes with the lease scheduler
for the test process's GIL. ``GET /__stats`` answers its counters as JSON.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

VISIBILITY_ACTIONS = frozenset({"ChangeMessageVisibility", "ChangeMessageVisibilityBatch"})
KINDS = ("InternalError", "ServiceUnavailable", "RequestThrottled", "reset", "lost_answer")

_ERRORS: dict[str, tuple[int, str, str]] = {
    # kind: (HTTP status, query-compatible code and fault, message)
    "InternalError": (500, "InternalError;Receiver", "We encountered an internal error."),
    "ServiceUnavailable": (503, "ServiceUnavailable;Receiver", "Service is unavailable."),
    "RequestThrottled": (400, "RequestThrottled;Sender", "Rate exceeded."),
}
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


def _action(headers: Any, body: bytes) -> str:
    target = headers.get("X-Amz-Target", "")
    if target:  # JSON protocol: "AmazonSQS.ChangeMessageVisibilityBatch"
        return str(target).rsplit(".", 1)[-1]
    form = parse_qs(body.decode("utf-8", "replace"))  # query protocol
    return form.get("Action", [""])[0]


class FaultProxy:
    """``with FaultProxy(upstream, error_rate=0.3, latency=0.05) as proxy:`` then
    point a client at ``proxy.url``."""

    def __init__(
        self,
        upstream: str,
        *,
        error_rate: float = 0.3,
        latency: float = 0.0,
        jitter: float = 0.0,
        actions: frozenset[str] = VISIBILITY_ACTIONS,
        kinds: tuple[str, ...] = KINDS,
        seed: int = 0,
    ) -> None:
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self.error_rate = error_rate
        self.latency = latency
        self.jitter = jitter
        self.actions = actions
        self.kinds = kinds
        self._rng = random.Random(seed)
        # Guards the random generator and the counters (handler threads share them).
        self._lock = threading.Lock()
        self.forwarded: Counter[str] = Counter()  # by action
        self.injected: Counter[str] = Counter()  # by kind
        self.targeted = 0  # requests of a targeted action
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy._handle(self)

            def do_GET(self) -> None:
                answer = json.dumps(proxy.stats()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: request lines carry receipts

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="sqs-fault-proxy", daemon=True
        )

    def __enter__(self) -> FaultProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "targeted": self.targeted,
                "injected": dict(self.injected),
                "forwarded": dict(self.forwarded),
            }

    def _decide(self, action: str) -> tuple[float, str | None]:
        with self._lock:
            delay = self.latency + self._rng.uniform(0, self.jitter)
            if action not in self.actions:
                return delay, None
            self.targeted += 1
            if self._rng.random() >= self.error_rate:
                return delay, None
            kind = self._rng.choice(self.kinds)
            self.injected[kind] += 1
            return delay, kind

    def _handle(self, request: BaseHTTPRequestHandler) -> None:
        length = int(request.headers.get("Content-Length", "0") or 0)
        body = request.rfile.read(length)
        action = _action(request.headers, body)
        delay, fault = self._decide(action)
        if delay > 0:
            time.sleep(delay)
        if fault == "reset":
            request.close_connection = True
            # SO_LINGER 0: the client sees a reset, not an orderly end of stream.
            request.connection.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            return
        if fault in _ERRORS:
            self._error(request, fault)
            return
        status, headers, answer = self._forward(request, body)
        with self._lock:
            self.forwarded[action] += 1
        if fault == "lost_answer":  # applied upstream, but the client hears a failure
            self._error(request, "InternalError")
            return
        request.send_response(status)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                request.send_header(name, value)
        request.send_header("Content-Length", str(len(answer)))
        request.end_headers()
        request.wfile.write(answer)

    def _forward(
        self, request: BaseHTTPRequestHandler, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self._upstream, timeout=30)
        try:
            headers = {k: v for k, v in request.headers.items() if k.lower() != "host"}
            connection.request("POST", request.path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, response.getheaders(), response.read()
        finally:
            connection.close()

    def _error(self, request: BaseHTTPRequestHandler, kind: str) -> None:
        status, query_error, text = _ERRORS[kind]
        code = query_error.split(";", 1)[0]
        answer = json.dumps({"__type": f"com.amazonaws.sqs#{code}", "message": text}).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/x-amz-json-1.0")
        request.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        request.send_header("x-amzn-query-error", query_error)
        request.send_header("Content-Length", str(len(answer)))
        request.end_headers()
        request.wfile.write(answer)


class FaultProxyProcess:
    """``with FaultProxyProcess(upstream, error_rate=0.3, ...) as proxy:`` runs the
    proxy as ``python -m tests.sqs.fault_proxy`` and reads its counters over HTTP."""

    def __init__(self, upstream: str, **options: Any) -> None:
        args = [sys.executable, "-m", "tests.sqs.fault_proxy", "--upstream", upstream]
        for name, value in options.items():
            flag = "--" + name.replace("_", "-")
            args += [flag, ",".join(value) if isinstance(value, tuple) else str(value)]
        self._args = args
        self._proc: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> FaultProxyProcess:
        self._proc = subprocess.Popen(self._args, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()  # "PORT <n>" once it listens
        if not line.startswith("PORT "):
            self._proc.kill()
            raise RuntimeError(f"the fault proxy did not start (said {line!r})")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(10)

    def stats(self) -> dict[str, Any]:
        host, port = self.url.split("//", 1)[1].split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request("GET", "/__stats")
            stats: dict[str, Any] = json.loads(connection.getresponse().read())
            return stats
        finally:
            connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--error-rate", type=float, default=0.3)
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--jitter", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kinds", default=",".join(KINDS))
    options = parser.parse_args()
    proxy = FaultProxy(
        options.upstream,
        error_rate=options.error_rate,
        latency=options.latency,
        jitter=options.jitter,
        kinds=tuple(options.kinds.split(",")),
        seed=options.seed,
    )
    print(f"PORT {proxy.url.rsplit(':', 1)[1]}", flush=True)
    proxy._server.serve_forever()


if __name__ == "__main__":
    main()
