"""moto's server, keeping a journal of the requests it answers (measure 12).

``python -m benchmarks.moto_journal PORT JOURNAL`` serves moto's app exactly as
``python -m moto.server`` does (werkzeug, a thread per request), wrapped so that
each request appends one line to JOURNAL when its answer is complete: when it
came in and when it was answered (epoch seconds, to the microsecond), its
action (``ReceiveMessage``, ``DeleteMessageBatch``...) and how many messages it
carried (received, or entries deleted or changed). The journal is how the
cluster benchmark counts every SQS call the executors and the reader make, and
times the receives and deletes of a run, however many processes made them.
``journaled_moto`` runs it as a process of its own.

With ``LEASEKEEPER_BENCH_LEAN_MOTO=1`` in its environment the server also takes out
one of moto's own costs (``without_attribute_scans``): moto 5's ReceiveMessage
rebuilds every attribute of the queue, three scans of all its messages, for each
message it returns, so a receive of ten from a queue of 2,000 costs moto about a
second of CPU and every client's rate on it is moto's. Without those scans moto
answers 20-40 times faster and a benchmark's rates are the clients' again.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from benchmarks.common import moto_server


@dataclass(frozen=True)
class Request:
    began: float
    ended: float
    action: str
    messages: int  # received (ReceiveMessage) or entries (the batch calls); 1 otherwise


def read(journal: Path, mark: int = 0) -> list[Request]:
    """The requests journaled after byte ``mark``."""
    with journal.open("rb") as f:
        f.seek(mark)
        text = f.read().decode()
    found = []
    for line in text.splitlines():
        began, ended, action, messages = line.split()
        found.append(Request(float(began), float(ended), action, int(messages)))
    return found


def mark(journal: Path) -> int:
    return journal.stat().st_size if journal.exists() else 0


def _action(environ: dict[str, Any]) -> str:
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    if target:  # the JSON protocol: "AmazonSQS.ReceiveMessage"
        return str(target).rsplit(".", 1)[-1]
    query = parse_qs(environ.get("QUERY_STRING", ""))
    return query.get("Action", ["other"])[0]


def _count(text: bytes, key: str, missing: int) -> int:
    """len(text's JSON ``key``), ``missing`` without one."""
    try:
        found = json.loads(text or b"{}").get(key)
    except (ValueError, AttributeError):
        return missing
    return len(found) if isinstance(found, list) else missing


def journaling(app: Callable[..., Any], journal: Path) -> Callable[..., Any]:
    """``app`` (a WSGI application) noting each request in ``journal``."""
    lock = threading.Lock()
    out = journal.open("a", buffering=1)

    def wrapped(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        began = time.time()
        action = _action(environ)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        request = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(request)  # moto reads it again
        answer = b"".join(app(environ, start_response))  # the answer, complete
        if action == "ReceiveMessage":
            messages = _count(answer, "Messages", 0)
        else:
            messages = _count(request, "Entries", 1)
        with lock:
            out.write(f"{began:.6f} {time.time():.6f} {action} {messages}\n")
        return [answer]

    return wrapped


LEAN_MOTO = "LEASEKEEPER_BENCH_LEAN_MOTO"


def without_attribute_scans() -> None:
    """moto's retention check of a received message, reading the one number it needs.

    ``SQSBackend.is_message_valid_based_on_retention_period`` asks
    ``get_queue_attributes`` for ``MessageRetentionPeriod``, and that computes every
    attribute (ApproximateNumberOfMessages, ...NotVisible, ...Delayed: a scan of the
    queue each) before picking one. The answer here is the same."""
    from moto.core.utils import unix_time
    from moto.sqs import models

    def valid(self: Any, queue_name: str, message: Any) -> bool:
        period = int(self.get_queue(queue_name).message_retention_period)
        return bool(period + message.sent_timestamp / 1000 > unix_time())

    setattr(models.SQSBackend, "is_message_valid_based_on_retention_period", valid)  # noqa: B010


def main(argv: list[str]) -> None:
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import run_simple

    port, journal = int(argv[0]), Path(argv[1])
    if os.environ.get(LEAN_MOTO) == "1":
        without_attribute_scans()
    os.environ.setdefault("MOTO_PORT", str(port))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        "127.0.0.1",
        port,
        journaling(app, journal),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


def journaled_moto(journal: Path, timeout: float = 30.0) -> contextlib.AbstractContextManager[str]:
    """This server as a process of its own on a free loopback port, ready to answer;
    its endpoint, as ``common.moto_server`` gives moto's own."""
    return moto_server(
        timeout, lambda port: ["-m", "benchmarks.moto_journal", str(port), str(journal)]
    )


if __name__ == "__main__":
    main(sys.argv[1:])
