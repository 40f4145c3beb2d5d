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
moto's scans of the whole queue that nothing reads (``without_attribute_scans``):
moto 5's ReceiveMessage rebuilds every attribute of the queue, three scans of all
its messages, for each message it returns, so a receive of ten from a queue of
2,000 costs moto about a second of CPU and every client's rate on it is moto's;
and each message sent costs it the same three scans, so filling a queue takes
time in the square of its length. Without them, and with moto's SQS reading the
clock the quick way (``with_a_quick_clock``: it reads it for each queued message
on each receive), moto answers 20-100 times faster and a benchmark's rates are
the clients' again.
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


_COUNTS = (
    "approximate_number_of_messages",
    "approximate_number_of_messages_not_visible",
    "approximate_number_of_messages_delayed",
)


def without_attribute_scans() -> None:
    """moto without its scans of the whole queue where no one reads what they count.

    ``Queue.attributes`` builds every attribute of a queue, and three of them
    (ApproximateNumberOfMessages, ...NotVisible, ...Delayed) scan all its messages.
    moto builds it to read one other attribute: in each SendMessage
    (``ContentBasedDeduplication``), and through ``get_queue_attributes`` in
    ``is_message_valid_based_on_retention_period``, for each message a
    ReceiveMessage hands out (``MessageRetentionPeriod``, and there the
    attributes are built three times). So a send or a receive cost moto time in
    proportion to the queue's length, and filling a queue time in its square.
    Here the retention check reads the one number it needs, and the three counts
    are counted only inside ``get_queue_attributes`` (GetQueueAttributes, the one
    place their values go out); elsewhere they read 0, and nothing reads them
    there. Every answer is moto's own."""
    from moto.sqs import models

    asking = threading.local()  # set while get_queue_attributes runs, on its thread

    def counted_when_asked(count: Callable[[Any], int]) -> property:
        return property(lambda queue: count(queue) if getattr(asking, "counts", False) else 0)

    for name in _COUNTS:
        setattr(models.Queue, name, counted_when_asked(getattr(models.Queue, name).fget))

    attributes_of = models.SQSBackend.get_queue_attributes

    def get_queue_attributes(self: Any, queue_name: str, attribute_names: list[str]) -> Any:
        asking.counts = True
        try:
            return attributes_of(self, queue_name, attribute_names)
        finally:
            asking.counts = False

    def valid(self: Any, queue_name: str, message: Any) -> bool:
        period = int(self.get_queue(queue_name).message_retention_period)
        return bool(period + message.sent_timestamp / 1000 > models.unix_time())

    setattr(models.SQSBackend, "get_queue_attributes", get_queue_attributes)  # noqa: B010
    setattr(models.SQSBackend, "is_message_valid_based_on_retention_period", valid)  # noqa: B010


def with_a_quick_clock() -> None:
    """moto's SQS models reading the time as ``time.time()`` does.

    moto reads the clock in every ``Message.visible`` and ``.delayed``, so two or
    three times for each message in the queue on every ReceiveMessage, through
    ``unix_time``: a naive ``datetime`` now, less the epoch's, 6 us a reading
    (``time.time()`` takes 0.1 us) - most of what a receive still cost in
    proportion to the queue's length. The seconds since the epoch are the same;
    a time given to convert is converted by moto's own functions."""
    from moto.sqs import models

    stock_seconds, stock_millis = models.unix_time, models.unix_time_millis

    def seconds(dt: Any = None) -> float:
        return time.time() if dt is None else float(stock_seconds(dt))

    def millis(dt: Any = None) -> float:
        return time.time() * 1000.0 if dt is None else float(stock_millis(dt))

    setattr(models, "unix_time", seconds)  # noqa: B010
    setattr(models, "unix_time_millis", millis)  # noqa: B010


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
        with_a_quick_clock()
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
