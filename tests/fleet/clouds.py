"""Local stand-ins for the endpoints an elastic fleet's worker talks to, answering in
the shapes their documentation gives (and the ECS agent's source,
ecs-agent/tmds/handlers/taskprotection): the ECS agent's task-protection endpoint,
the EC2 instance metadata service with IMDSv2 tokens, Azure's Scheduled Events and
Alibaba Cloud's ECS metadata. Each records what it was asked, with the time.

One ``CloudServer`` serves them all on a loopback port, each under its own paths,
as the real ones are laid out:

- ``PUT /api/<container>/task-protection/v1/state`` (ECS agent): the body is decoded
  like the agent does (unknown fields and a missing ``ProtectionEnabled`` are a 400
  ``InvalidParameterException``); ``ecs_mode`` "ok" answers ``{"protection": {...}}``,
  "error" a 500 ``{"error": {"Arn", "Code", "Message"}}``, "failure" a 200
  ``{"failure": {"Arn", "Reason": "TASK_NOT_VALID", "Detail": null}}``.
- ``PUT /latest/api/token`` (EC2: ``X-aws-ec2-metadata-token-ttl-seconds``, 1 to
  21600, else 400) and ``GET /latest/meta-data/spot/instance-action`` with the token
  (401 without one, or with one it did not issue: IMDSv2 required; with
  ``ec2_tokens`` False, an IMDSv1-only service: the token PUT is refused and reads
  need none): 404 until ``spot_action`` is set, then its JSON.
- ``GET /metadata/scheduledevents?api-version=...`` (Azure; ``Metadata: true`` or
  400): ``{"DocumentIncarnation", "Events": azure_events}``; ``POST`` of
  ``{"StartRequests": [{"EventId"}]}`` is recorded in ``azure_started``;
  ``GET /metadata/instance/compute/name?...&format=text``: ``azure_vm``.
- Alibaba (``alibaba/`` in front, as a second endpoint): ``PUT /latest/api/token``
  (``X-aliyun-ecs-metadata-token-ttl-seconds``) and ``GET /latest/meta-data/
  instance/spot/termination-time`` (with the token when ``alibaba_hardened``): 404
  until ``alibaba_time`` is set, then the time as text.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

CONTAINER = "0123456789abcdef-1234567890"
TASK_ARN = "arn:aws:ecs:us-east-1:123456789012:task/cluster/0123456789abcdef"


@dataclass
class Call:
    at: float  # time.time()
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class CloudState:
    ecs_mode: str = "ok"
    spot_action: dict[str, str] | None = None
    ec2_tokens: bool = True  # False: an IMDSv1-only service (no token PUT, none needed)
    azure_events: list[dict[str, Any]] = field(default_factory=list)
    azure_vm: str = "worker-vm_3"
    azure_started: list[str] = field(default_factory=list)
    alibaba_time: str | None = None
    alibaba_hardened: bool = True
    tokens: set[str] = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)
    answered: int = 0  # requests answered (their status line sent)

    def puts(self) -> list[Call]:
        """The ECS agent's task-protection PUTs, in order."""
        return [c for c in self.calls if c.method == "PUT" and c.path.endswith("/state")]

    def protections(self) -> list[bool]:
        """What each PUT asked: True (protect), False (unprotect)."""
        return [c.body["ProtectionEnabled"] for c in self.puts()]


class CloudServer:
    """The endpoints on ``http://127.0.0.1:PORT``; ``url`` for the EC2 and Azure
    metadata, ``agent_uri`` for ``ECS_AGENT_URI``, ``alibaba_url`` for Alibaba's."""

    def __init__(self) -> None:
        self.state = CloudState()
        self.lock = threading.Condition()
        state, lock = self.state, self.lock

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _send(self, status: int, body: bytes | str | dict[str, Any] | None) -> None:
                if isinstance(body, dict):
                    data, kind = json.dumps(body).encode(), "application/json"
                elif isinstance(body, str):
                    data, kind = body.encode(), "text/plain"
                else:
                    data, kind = body or b"", "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _record(self, body: bytes) -> None:
                try:
                    decoded: Any = json.loads(body) if body else None
                except ValueError:
                    decoded = body
                with lock:
                    state.calls.append(
                        Call(time.time(), self.command, self.path, dict(self.headers), decoded)
                    )

            def send_response(self, code: int, message: str | None = None) -> None:
                super().send_response(code, message)
                with lock:
                    state.answered += 1
                    lock.notify_all()

            def do_PUT(self) -> None:
                body = self._body()
                self._record(body)
                path = urlsplit(self.path).path
                if path.endswith("/task-protection/v1/state"):
                    self._ecs(body)
                elif path == "/latest/api/token" and not state.ec2_tokens:
                    self._send(403, "")
                elif path in ("/latest/api/token", "/alibaba/latest/api/token"):
                    header = (
                        "X-aliyun-ecs-metadata-token-ttl-seconds"
                        if path.startswith("/alibaba")
                        else "X-aws-ec2-metadata-token-ttl-seconds"
                    )
                    ttl = self.headers.get(header, "")
                    if not ttl.isdigit() or not 1 <= int(ttl) <= 21600:
                        self._send(400, "")
                        return
                    token = secrets.token_urlsafe(24)
                    with lock:
                        state.tokens.add(token)
                    self._send(200, token)
                else:
                    self._send(404, "")

            def _ecs(self, body: bytes) -> None:
                try:
                    request = json.loads(body)
                    assert isinstance(request, dict)
                    assert set(request) <= {"ProtectionEnabled", "ExpiresInMinutes"}
                except (ValueError, AssertionError):
                    self._send(400, {"error": {"Code": "InvalidParameterException",
                                               "Message": "UpdateTaskProtection: failed to "
                                               "decode request"}})  # fmt: skip
                    return
                if "ProtectionEnabled" not in request:
                    self._send(400, {"error": {"Arn": TASK_ARN, "Code": "InvalidParameterException",
                                               "Message": "Invalid request: does not contain "
                                               "'ProtectionEnabled' field"}})  # fmt: skip
                    return
                if state.ecs_mode == "error":
                    self._send(500, {"requestID": "req-1", "error": {
                        "Arn": TASK_ARN, "Code": "ServerException",
                        "Message": "Timed out calling ECS Task Protection API"}})  # fmt: skip
                    return
                if state.ecs_mode == "failure":
                    self._send(200, {"failure": {"Arn": TASK_ARN, "Reason": "TASK_NOT_VALID",
                                                 "Detail": None}})  # fmt: skip
                    return
                enabled = bool(request["ProtectionEnabled"])
                protection: dict[str, Any] = {"ProtectionEnabled": enabled, "TaskArn": TASK_ARN}
                if enabled:
                    minutes = int(request.get("ExpiresInMinutes") or 120)
                    expires = time.gmtime(time.time() + 60 * minutes)
                    protection["ExpirationDate"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", expires)
                self._send(200, {"protection": protection})

            def do_GET(self) -> None:
                self._record(b"")
                parts = urlsplit(self.path)
                if parts.path == "/latest/meta-data/spot/instance-action":
                    token = self.headers.get("X-aws-ec2-metadata-token")
                    if state.ec2_tokens and token not in state.tokens:
                        self._send(401, "")
                    elif state.spot_action is None:
                        self._send(404, "")
                    else:
                        self._send(200, dict(state.spot_action))
                elif parts.path == "/metadata/scheduledevents":
                    if self.headers.get("Metadata") != "true" or "api-version" not in parse_qs(
                        parts.query
                    ):
                        self._send(400, {"error": "Bad request"})
                        return
                    self._send(200, {"DocumentIncarnation": 1, "Events": state.azure_events})
                elif parts.path == "/metadata/instance/compute/name":
                    if self.headers.get("Metadata") != "true":
                        self._send(400, "")
                        return
                    self._send(200, state.azure_vm)
                elif parts.path == "/alibaba/latest/meta-data/instance/spot/termination-time":
                    token = self.headers.get("X-aliyun-ecs-metadata-token")
                    if state.alibaba_hardened and token not in state.tokens:
                        self._send(403, "")
                    elif state.alibaba_time is None:
                        self._send(404, "")
                    else:
                        self._send(200, state.alibaba_time)
                else:
                    self._send(404, "")

            def do_POST(self) -> None:
                body = self._body()
                self._record(body)
                if urlsplit(self.path).path != "/metadata/scheduledevents":
                    self._send(404, "")
                    return
                if self.headers.get("Metadata") != "true":
                    self._send(400, "")
                    return
                request = json.loads(body)
                with lock:
                    state.azure_started += [each["EventId"] for each in request["StartRequests"]]
                self._send(200, "")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def agent_uri(self) -> str:
        return f"{self.url}/api/{CONTAINER}"

    @property
    def alibaba_url(self) -> str:
        return f"{self.url}/alibaba"

    def wait_puts(self, count: int, timeout: float = 30.0) -> list[bool]:
        """Block (real time) until the agent has answered ``count`` protection PUTs."""
        with self.lock:
            assert self.lock.wait_for(
                lambda: (
                    len(self.state.puts()) >= count and self.state.answered >= len(self.state.calls)
                ),
                timeout,
            ), f"the agent got {self.state.protections()}, not {count} PUTs"
            return self.state.protections()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
