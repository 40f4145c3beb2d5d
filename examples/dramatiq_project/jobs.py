"""A Dramatiq project on SQS (dramatiq-sqs) whose long actors run once on a short
visibility timeout.

The two lines that matter are marked; the rest is an ordinary Dramatiq app. Run it
as README.md in this folder says (against a local moto server, or your AWS account).

Environment:
    AWS_ENDPOINT_URL    optional: another endpoint, e.g. http://127.0.0.1:5000 (moto)
    AWS_DEFAULT_REGION  the queue's region
    VISIBILITY_TIMEOUT  seconds each receive and renewal hides a message (default 60)
"""

from __future__ import annotations

import logging
import os
import time

import dramatiq
from dramatiq_sqs import SQSBroker

from leasekeeper.dramatiq import LeaseMiddleware  # (1)

log = logging.getLogger(__name__)

broker = SQSBroker(
    namespace="example",
    region_name=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
    endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None,
)
broker.add_middleware(  # (2)
    LeaseMiddleware(visibility_timeout=int(os.environ.get("VISIBILITY_TIMEOUT", "60")))
)
dramatiq.set_broker(broker)


# time_limit: Dramatiq's own TimeLimit stops an actor after 10 minutes by default.
@dramatiq.actor(queue_name="jobs", max_retries=3, time_limit=6 * 3600 * 1000)
def render(job: str, seconds: float) -> None:
    """Pretend work: ``seconds`` of it, longer than the timeout if you like."""
    log.info("job %s: starting (%gs)", job, seconds)
    time.sleep(seconds)
    log.info("job %s: done", job)
