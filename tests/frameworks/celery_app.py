"""The Celery app the tests run real ``celery worker`` processes of, on moto.

Set by the test through the environment: ``LK_ENDPOINT`` (host:port of moto, or of
the counting proxy in front of it), ``LK_QUEUE`` (the queue), ``LK_VISIBILITY``
(seconds), ``LK_LEASES`` ("1": the two lines of docs/celery.md are in; "0": plain
Celery, the control), ``LK_PREFETCH`` (Celery's prefetch multiplier), ``LK_POLL``
(kombu's polling interval), ``LK_JOURNAL``
(where tasks journal), ``LK_WORKER`` (its name).
"""

from __future__ import annotations

import os

from celery import Celery

from tests.frameworks import journal

RUN = "tests.frameworks.celery_app.run"
NOOP = "tests.frameworks.celery_app.noop"


def make_app(
    endpoint: str, queue: str, visibility: int, *, prefetch: int = 2, poll: float = 0.1
) -> Celery:
    """A Celery app on ``sqs://`` at ``endpoint`` whose tasks go to ``queue`` (kombu
    creates it with a VisibilityTimeout of ``visibility`` seconds). ``poll`` is how
    long kombu waits before it polls again when the prefetch buffer is full."""
    app = Celery("lk_tests", broker=f"sqs://testing:testing@{endpoint}")
    app.conf.update(
        broker_transport_options={
            "region": "us-east-1",
            "visibility_timeout": visibility,
            # Short long polls: a worker stops within a second.
            "wait_time_seconds": 1,
            "polling_interval": poll,
        },
        broker_connection_retry_on_startup=True,
        task_default_queue=queue,
        task_acks_late=True,
        worker_prefetch_multiplier=prefetch,
    )
    return app


JOURNAL = os.environ.get("LK_JOURNAL", os.devnull)
app = make_app(
    os.environ.get("LK_ENDPOINT", ""),
    os.environ.get("LK_QUEUE", "celery"),
    int(os.environ.get("LK_VISIBILITY", "3")),
    prefetch=int(os.environ.get("LK_PREFETCH", "2")),
    poll=float(os.environ.get("LK_POLL", "0.1")),
)

if os.environ.get("LK_LEASES") == "1":
    from leasekeeper.celery import keep_leases

    keep_leases(app)


@app.task(name=RUN)
def run(label: str, seconds: float, busy: bool = False, fail: bool = False) -> None:
    journal.work(JOURNAL, label, seconds, busy=busy, fail=fail)


@app.task(name=NOOP)
def noop(label: str) -> None:
    journal.write(JOURNAL, "end", label)
