"""The Dramatiq app the tests run real ``dramatiq`` worker processes of, on moto.

Set by the test through the environment, as for tests/frameworks/celery_app.py:
``LK_ENDPOINT``, ``LK_QUEUE``, ``LK_VISIBILITY``, ``LK_LEASES`` ("1": the two lines
of docs/dramatiq.md are in; "0": plain dramatiq-sqs receiving with the same
visibility timeout, the control), ``LK_RENEWER`` (LeaseMiddleware's ``renewer``),
``LK_JOURNAL``, ``LK_WORKER``.
"""

from __future__ import annotations

import os

import dramatiq

from tests.frameworks import journal
from tests.frameworks.dramatiq_broker import NOOP, RUN, make_broker

QUEUE = os.environ.get("LK_QUEUE", "default")
JOURNAL = os.environ.get("LK_JOURNAL", os.devnull)
VISIBILITY = int(os.environ.get("LK_VISIBILITY", "3"))

broker = make_broker(os.environ.get("LK_ENDPOINT", ""))
if os.environ.get("LK_LEASES") == "1":
    from leasekeeper.dramatiq import LeaseMiddleware

    # LK_RENEWER=process: renewals in a process of their own (docs/dramatiq.md).
    renewer = os.environ.get("LK_RENEWER")
    options = {"renewer": renewer} if renewer else {}
    broker.add_middleware(LeaseMiddleware(visibility_timeout=VISIBILITY, **options))
else:
    broker.visibility_timeout = VISIBILITY
dramatiq.set_broker(broker)


@dramatiq.actor(actor_name=RUN, queue_name=QUEUE, max_retries=0)
def run(label: str, seconds: float, busy: bool = False, fail: bool = False) -> None:
    journal.work(JOURNAL, label, seconds, busy=busy, fail=fail)


@dramatiq.actor(actor_name=NOOP, queue_name=QUEUE, max_retries=0)
def noop(label: str) -> None:
    journal.write(JOURNAL, "end", label)
