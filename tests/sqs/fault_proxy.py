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

With ``real_sqs=True`` (``--real-sqs``) it also answers as the real service does
where moto does not (docs/backend-semantics.md, SQS: "Traps" and moto's
deviations 2 and 6). From the traffic it forwards (the JSON protocol: ``X-Amz-Target``
``AmazonSQS.ReceiveMessage``, ``ChangeMessageVisibility[Batch]``,
``DeleteMessage[Batch]``) it keeps, per message, the receipt handle of the latest
receive and the service's deadline (the receive's ``VisibilityTimeout``, or the
queue's own, read once with GetQueueAttributes, counted from when the receive
was forwarded; a forwarded extend moves it to then + its timeout), and:

- an extend with the latest handle after its deadline answers success and is
  **not** forwarded: the message stays visible (moto would hide it again);
- an extend with a handle that is not the latest (someone received the message
  again), or of a deleted message, fails with ``InvalidParameterValue`` "...
  Message does not exist or is not available for visibility timeout change."
  (moto accepts every handle a message ever had);
- a delete with a handle that is not the latest answers success and is **not**
  forwarded: nothing is deleted (on a FIFO queue a delete after the handle's
  deadline fails with ``InvalidParameterValue`` "The receipt handle has expired.");
- a batch forwards only the entries the real service would apply and merges the
  answers for the others in, in entry order, under their own Ids.

- a receive of a FIFO queue that carries a ReceiveRequestAttemptId seen less than
  five minutes before is answered the earlier answer - the same messages and
  receipt handles - and not forwarded (SQS's documented deduplication of receive
  attempts, which moto does not model; the messages were not touched since, which
  the tests that use it see to).

That needs every receive of the queue to pass through the proxy, so a competing
consumer must use it too (another client on ``proxy.url``), or its re-receives
go unseen. The emulated service is strictly serialised: receives (long polls are
turned into short polls every ``poll_interval`` seconds) and visibility changes
and deletes are forwarded one at a time, each decided just before it is
forwarded, so no receive slips between a decision and the change it allows.
That also keeps moto's thread-unsafe message list out of harm's way. Handles of
messages the proxy never saw received are forwarded untouched.

It binds to 127.0.0.1 only and runs in its own process (``FaultProxyProcess``),
as moto does, so its request handling never competes with the lease scheduler
for the test process's GIL. ``GET /__stats`` answers its counters as JSON (with
``real_sqs``: every emulated decision, by message id and receive number, never
a receipt).
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
from collections.abc import Callable
from dataclasses import dataclass
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
_JSON = "application/x-amz-json-1.0"

# What the real service answers (the handle is quoted in the text, as SQS does).
NOT_AVAILABLE = (
    "Value {handle} for parameter ReceiptHandle is invalid. Reason: Message does not "
    "exist or is not available for visibility timeout change."
)
EXPIRED = (
    "Value {handle} for parameter ReceiptHandle is invalid. Reason: The receipt handle has expired."
)

# Verdicts of the emulated service on one extend or delete entry.
FORWARD = "forward"  # applied: forwarded to moto
UNKNOWN = "unknown"  # a handle the proxy never saw received: forwarded untouched
LATE = "late"  # extend with the latest handle after its deadline: 200, nothing done
STALE = "stale"  # not the latest handle: extend fails, delete answers 200 and does nothing
GONE = "gone"  # extend of a deleted message: fails
EXPIRED_FIFO = "expired"  # FIFO delete after the handle's deadline: fails


def _action(headers: Any, body: bytes) -> str:
    target = headers.get("X-Amz-Target", "")
    if target:  # JSON protocol: "AmazonSQS.ChangeMessageVisibilityBatch"
        return str(target).rsplit(".", 1)[-1]
    form = parse_qs(body.decode("utf-8", "replace"))  # query protocol
    return form.get("Action", [""])[0]


def queue_key(url: str) -> str:
    """A queue URL's path: the same queue whichever host the client named."""
    return urlsplit(url).path.rstrip("/")


@dataclass
class _Tracked:
    """One message as the emulated service sees it."""

    message_id: str
    fifo: bool
    receives: int = 0  # receives seen so far; the latest handle is from the last one
    latest: str = ""
    deadline: float = 0.0
    deleted: bool = False


class ReceiptTracker:
    """The real service's receipt rules, decided from the traffic (pure: no I/O).

    ``received`` records a receive's handle and deadline; ``judge_change`` /
    ``judge_delete`` say what the real service would do with a handle *now*;
    ``changed`` / ``deleted`` record what a forwarded call did. Not thread-safe:
    the proxy calls it under its service lock. ``clock`` is monotonic seconds
    (tests drive it).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._messages: dict[tuple[str, str], _Tracked] = {}
        self._handles: dict[str, tuple[_Tracked, int]] = {}  # handle -> (message, receive no.)
        self.counts: Counter[str] = Counter()  # "<action>:<verdict>"
        self.events: list[dict[str, Any]] = []
        self.started = clock()

    def received(self, queue: str, message_id: str, handle: str, deadline: float) -> None:
        key = (queue, message_id)
        tracked = self._messages.get(key)
        if tracked is None:
            tracked = self._messages[key] = _Tracked(message_id, fifo=queue.endswith(".fifo"))
        tracked.receives += 1
        tracked.latest = handle
        tracked.deadline = deadline
        tracked.deleted = False
        self._handles[handle] = (tracked, tracked.receives)
        self._record("receive", FORWARD, tracked, tracked.receives)

    def judge_change(self, handle: str) -> str:
        """The verdict on a ChangeMessageVisibility entry with ``handle``, now."""
        found = self._handles.get(handle)
        if found is None:
            verdict = UNKNOWN
        else:
            tracked, number = found
            if tracked.deleted:
                verdict = GONE
            elif number != tracked.receives:
                verdict = STALE
            elif self.clock() >= tracked.deadline:
                verdict = LATE
            else:
                verdict = FORWARD
        return self._judged("extend", verdict, found)

    def judge_delete(self, handle: str) -> str:
        """The verdict on a DeleteMessage entry with ``handle``, now."""
        found = self._handles.get(handle)
        if found is None:
            verdict = UNKNOWN
        else:
            tracked, number = found
            past = self.clock() >= tracked.deadline
            if tracked.fifo and (past or number != tracked.receives) and not tracked.deleted:
                verdict = EXPIRED_FIFO
            elif number != tracked.receives:
                verdict = STALE
            else:
                # The latest handle deletes, late or not, and deleting twice is fine.
                verdict = FORWARD
        return self._judged("delete", verdict, found)

    def changed(self, handle: str, deadline: float) -> None:
        """A forwarded extend with ``handle`` succeeded: the deadline moves."""
        found = self._handles.get(handle)
        if found is not None:
            found[0].deadline = deadline

    def deleted(self, handle: str) -> None:
        found = self._handles.get(handle)
        if found is not None:
            found[0].deleted = True

    def _judged(self, action: str, verdict: str, found: tuple[_Tracked, int] | None) -> str:
        self.counts[f"{action}:{verdict}"] += 1
        if found is not None:
            self._record(action, verdict, found[0], found[1])
        return verdict

    def _record(self, action: str, verdict: str, tracked: _Tracked, number: int) -> None:
        self.events.append(
            {
                "at": round(self.clock() - self.started, 4),
                "action": action,
                "verdict": verdict,
                "id": tracked.message_id,
                "receive": number,  # which receive issued the handle used
                "latest": tracked.receives,
            }
        )

    def snapshot(self) -> dict[str, Any]:
        return {"counts": dict(self.counts), "events": list(self.events)}


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
        real_sqs: bool = False,
        visibility_timeout: float | None = None,
        poll_interval: float = 0.02,
        max_faults: int | None = None,
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
        self.max_faults = max_faults  # injected at most this many (None: no limit)
        # (queue, ReceiveRequestAttemptId) -> (when, the answer): SQS's receive attempts
        self._attempts: dict[
            tuple[str, str], tuple[float, tuple[int, list[tuple[str, str]], bytes]]
        ] = {}
        self.real_sqs = real_sqs
        self.tracker = ReceiptTracker()
        self.visibility_timeout = visibility_timeout  # the queues' own, if given
        self.poll_interval = poll_interval
        # The emulated service: one receive, visibility change or delete at a time.
        self._service = threading.Lock()
        self._queue_visibility: dict[str, float] = {}
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
            stats: dict[str, Any] = {
                "targeted": self.targeted,
                "injected": dict(self.injected),
                "forwarded": dict(self.forwarded),
            }
        if self.real_sqs:
            with self._service:
                stats["real_sqs"] = self.tracker.snapshot()
        return stats

    def _decide(self, action: str) -> tuple[float, str | None]:
        with self._lock:
            delay = self.latency + self._rng.uniform(0, self.jitter)
            if action not in self.actions:
                return delay, None
            self.targeted += 1
            if self._rng.random() >= self.error_rate:
                return delay, None
            if self.max_faults is not None and sum(self.injected.values()) >= self.max_faults:
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
        headers_in = {k: v for k, v in request.headers.items() if k.lower() != "host"}
        status, headers, answer = self._exchange(request.path, headers_in, action, body)
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

    # ------------------------------------------------------------------ the service

    def _exchange(
        self, path: str, headers: dict[str, str], action: str, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Answer one request: forwarded as it is, or as the real service would."""
        if self.real_sqs and headers.get("X-Amz-Target"):
            emulated = {
                "ReceiveMessage": self._receive,
                "ChangeMessageVisibility": self._change_one,
                "ChangeMessageVisibilityBatch": self._change_batch,
                "DeleteMessage": self._delete_one,
                "DeleteMessageBatch": self._delete_batch,
            }.get(action)
            if emulated is not None:
                return emulated(path, headers, json.loads(body or b"{}"))
        return self._forward(path, headers, action, body)

    def _forward(
        self, path: str, headers: dict[str, str], action: str, body: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self._upstream, timeout=30)
        try:
            # The body may have been rewritten: http.client sets its length.
            sent = {k: v for k, v in headers.items() if k.lower() != "content-length"}
            connection.request("POST", path, body=body, headers=sent)
            response = connection.getresponse()
            answer = response.status, response.getheaders(), response.read()
        finally:
            connection.close()
        with self._lock:
            self.forwarded[action] += 1
        return answer

    def _forward_json(
        self, path: str, headers: dict[str, str], action: str, payload: dict[str, Any]
    ) -> tuple[int, list[tuple[str, str]], bytes, dict[str, Any]]:
        call = {**headers, "X-Amz-Target": f"AmazonSQS.{action}"}
        status, answer_headers, answer = self._forward(
            path, call, action, json.dumps(payload).encode()
        )
        parsed: dict[str, Any] = {}
        if status == 200 and answer.strip():
            parsed = json.loads(answer)
        return status, answer_headers, answer, parsed

    def _queue_timeout(self, path: str, headers: dict[str, str], url: str) -> float:
        """The queue's VisibilityTimeout: given, or read once with GetQueueAttributes."""
        key = queue_key(url)
        if self.visibility_timeout is not None:
            return self.visibility_timeout
        if key not in self._queue_visibility:
            status, _, answer, parsed = self._forward_json(
                path,
                headers,
                "GetQueueAttributes",
                {"QueueUrl": url, "AttributeNames": ["VisibilityTimeout"]},
            )
            if status != 200:
                raise RuntimeError(f"GetQueueAttributes failed ({status}): {answer[:200]!r}")
            self._queue_visibility[key] = float(parsed["Attributes"]["VisibilityTimeout"])
        return self._queue_visibility[key]

    def _receive(
        self, path: str, headers: dict[str, str], payload: dict[str, Any]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        url = str(payload["QueueUrl"])
        attempt = payload.get("ReceiveRequestAttemptId")
        key = (queue_key(url), str(attempt))
        if attempt is not None and url.rstrip("/").endswith(".fifo"):
            with self._service:
                seen = self._attempts.get(key)
                if seen is not None and time.monotonic() - seen[0] < 300:
                    with self._lock:
                        self.forwarded["ReceiveMessage:replayed"] += 1
                    return seen[1]
        asked = payload.get("VisibilityTimeout")
        timeout = float(asked) if asked is not None else self._queue_timeout(path, headers, url)
        # A long poll becomes short polls, so no poll holds the service for long.
        wait_until = time.monotonic() + float(payload.get("WaitTimeSeconds") or 0)
        short = {**payload, "WaitTimeSeconds": 0}
        while True:
            with self._service:
                sent_at = self.tracker.clock()
                status, answer_headers, answer, parsed = self._forward_json(
                    path, headers, "ReceiveMessage", short
                )
                for message in parsed.get("Messages", []):
                    self.tracker.received(
                        queue_key(url),
                        str(message["MessageId"]),
                        str(message["ReceiptHandle"]),
                        sent_at + timeout,
                    )
            if status != 200 or parsed.get("Messages") or time.monotonic() >= wait_until:
                if attempt is not None and status == 200:
                    with self._service:
                        self._attempts[key] = (time.monotonic(), (status, answer_headers, answer))
                return status, answer_headers, answer
            time.sleep(self.poll_interval)

    def _change_batch(
        self, path: str, headers: dict[str, str], payload: dict[str, Any]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        return self._batch(path, headers, payload, "ChangeMessageVisibilityBatch")

    def _delete_batch(
        self, path: str, headers: dict[str, str], payload: dict[str, Any]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        return self._batch(path, headers, payload, "DeleteMessageBatch")

    def _batch(
        self, path: str, headers: dict[str, str], payload: dict[str, Any], action: str
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Forward the entries the real service would apply; answer the others."""
        entries: list[dict[str, Any]] = list(payload.get("Entries") or [])
        change = action == "ChangeMessageVisibilityBatch"
        with self._service:
            # Id -> its Failed entry (less the Id), or None for a success
            synthesized: dict[str, dict[str, Any] | None] = {}
            forward: list[dict[str, Any]] = []
            for entry in entries:
                handle = str(entry.get("ReceiptHandle", ""))
                answer_now = self._judge(change, handle)
                if answer_now is None:
                    forward.append(entry)
                else:
                    synthesized[str(entry.get("Id"))] = answer_now or None
            sent_at = self.tracker.clock()
            successful: set[str] = set()
            failed: dict[str, dict[str, Any]] = {}
            answer_headers: list[tuple[str, str]] = [("Content-Type", _JSON)]
            if forward:
                status, answer_headers, answer, parsed = self._forward_json(
                    path, headers, action, {**payload, "Entries": forward}
                )
                if status != 200:
                    return status, answer_headers, answer  # a whole-call error
                successful = {str(e.get("Id")) for e in parsed.get("Successful", [])}
                failed = {str(e.get("Id")): e for e in parsed.get("Failed", [])}
                for entry in forward:
                    if str(entry.get("Id")) in successful:
                        self._applied(change, entry, sent_at)
        for entry_id, failure in synthesized.items():
            if failure is None:
                successful.add(entry_id)
            else:
                failed[entry_id] = {"Id": entry_id, **failure}
        order = [str(entry.get("Id")) for entry in entries]
        merged = {
            "Successful": [{"Id": i} for i in order if i in successful],
            "Failed": [failed[i] for i in order if i in failed],
        }
        return 200, self._answer_headers(answer_headers), json.dumps(merged).encode()

    def _change_one(
        self, path: str, headers: dict[str, str], payload: dict[str, Any]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        return self._single(path, headers, payload, "ChangeMessageVisibility")

    def _delete_one(
        self, path: str, headers: dict[str, str], payload: dict[str, Any]
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        return self._single(path, headers, payload, "DeleteMessage")

    def _single(
        self, path: str, headers: dict[str, str], payload: dict[str, Any], action: str
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        change = action == "ChangeMessageVisibility"
        with self._service:
            failure = self._judge(change, str(payload.get("ReceiptHandle", "")))
            if failure is None:
                sent_at = self.tracker.clock()
                status, answer_headers, answer, _ = self._forward_json(
                    path, headers, action, payload
                )
                if status == 200:
                    self._applied(change, payload, sent_at)
                return status, answer_headers, answer
        if not failure:  # applied as far as the caller can tell: 200, nothing done
            return 200, self._answer_headers([("Content-Type", _JSON)]), b"{}"
        code, text = failure["Code"], failure["Message"]
        answer = json.dumps({"__type": f"com.amazonaws.sqs#{code}", "message": text}).encode()
        error_headers = [
            ("Content-Type", _JSON),
            ("x-amzn-query-error", f"{code};Sender"),
            ("x-amzn-RequestId", str(uuid.uuid4())),
        ]
        return 400, error_headers, answer

    def _judge(self, change: bool, handle: str) -> dict[str, Any] | None:
        """None: forward the entry. Otherwise what the service answers without
        applying it: a Failed entry (less its Id), or {} for a success."""
        judge = self.tracker.judge_change if change else self.tracker.judge_delete
        verdict = judge(handle)
        if verdict in (FORWARD, UNKNOWN):
            return None
        if verdict in (STALE, GONE) and change:
            text = NOT_AVAILABLE.format(handle=handle)
        elif verdict == EXPIRED_FIFO:
            text = EXPIRED.format(handle=handle)
        else:  # a late extend, a stale delete: success, and nothing happens
            return {}
        return {"SenderFault": True, "Code": "InvalidParameterValue", "Message": text}

    def _applied(self, change: bool, entry: dict[str, Any], sent_at: float) -> None:
        handle = str(entry.get("ReceiptHandle", ""))
        if change:
            self.tracker.changed(handle, sent_at + float(entry.get("VisibilityTimeout", 0)))
        else:
            self.tracker.deleted(handle)

    @staticmethod
    def _answer_headers(upstream: list[tuple[str, str]]) -> list[tuple[str, str]]:
        kept = [(k, v) for k, v in upstream if k.lower() in ("content-type", "x-amzn-requestid")]
        if not any(k.lower() == "x-amzn-requestid" for k, _ in kept):
            kept.append(("x-amzn-RequestId", str(uuid.uuid4())))
        return kept

    def _error(self, request: BaseHTTPRequestHandler, kind: str) -> None:
        status, query_error, text = _ERRORS[kind]
        code = query_error.split(";", 1)[0]
        answer = json.dumps({"__type": f"com.amazonaws.sqs#{code}", "message": text}).encode()
        request.send_response(status)
        request.send_header("Content-Type", _JSON)
        request.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        request.send_header("x-amzn-query-error", query_error)
        request.send_header("Content-Length", str(len(answer)))
        request.end_headers()
        request.wfile.write(answer)


class FaultProxyProcess:
    """``with FaultProxyProcess(upstream, error_rate=0.3, ...) as proxy:`` runs the
    proxy as ``python -m tests.sqs.fault_proxy`` and reads its counters over HTTP.
    ``real_sqs=True`` turns on the real service's receipt rules."""

    def __init__(self, upstream: str, **options: Any) -> None:
        args = [sys.executable, "-m", "tests.sqs.fault_proxy", "--upstream", upstream]
        for name, value in options.items():
            flag = "--" + name.replace("_", "-")
            if isinstance(value, bool):
                args += [flag] if value else []
            else:
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
    parser.add_argument(
        "--real-sqs",
        action="store_true",
        help="answer late extends and stale handles as the real SQS does (see the docstring)",
    )
    parser.add_argument(
        "--visibility-timeout",
        type=float,
        default=None,
        help="the queues' own VisibilityTimeout (default: read with GetQueueAttributes)",
    )
    parser.add_argument("--poll-interval", type=float, default=0.02)
    parser.add_argument("--max-faults", type=int, default=None)
    parser.add_argument(
        "--actions",
        default=",".join(sorted(VISIBILITY_ACTIONS)),
        help="the SQS actions whose requests may fail, comma-separated",
    )
    options = parser.parse_args()
    proxy = FaultProxy(
        options.upstream,
        error_rate=options.error_rate,
        latency=options.latency,
        jitter=options.jitter,
        kinds=tuple(options.kinds.split(",")),
        seed=options.seed,
        real_sqs=options.real_sqs,
        visibility_timeout=options.visibility_timeout,
        poll_interval=options.poll_interval,
        max_faults=options.max_faults,
        actions=frozenset(options.actions.split(",")),
    )
    print(f"PORT {proxy.url.rsplit(':', 1)[1]}", flush=True)
    proxy._server.serve_forever()


if __name__ == "__main__":
    main()
