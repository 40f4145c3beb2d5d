"""A Celery project on SQS whose long tasks run once on a short queue timeout.

The two lines that matter are marked; the rest is an ordinary Celery app. Run it as
README.md in this folder says (against a local moto server, or your AWS account).

Environment:
    CELERY_BROKER_URL   the broker (default ``sqs://``: AWS, credentials from the
                        usual chain; ``sqs://testing:testing@127.0.0.1:5000`` for moto)
    AWS_DEFAULT_REGION  the queue's region
    VISIBILITY_TIMEOUT  seconds; kombu creates the queue with it (default 60)
"""

from __future__ import annotations

import logging
import os
import time

from celery import Celery

from leasekeeper.celery import keep_leases  # (1)

log = logging.getLogger(__name__)

app = Celery("tasks", broker=os.environ.get("CELERY_BROKER_URL", "sqs://"))
app.conf.update(
    broker_transport_options={
        "region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        # Used by kombu when it creates the queue; an existing queue keeps its own
        # VisibilityTimeout, which is what SQS applies (docs/celery.md).
        "visibility_timeout": int(os.environ.get("VISIBILITY_TIMEOUT", "60")),
        "wait_time_seconds": 5,
    },
    task_default_queue="jobs",
    task_acks_late=True,  # a task's message is deleted when the task ends
    worker_prefetch_multiplier=2,
)
keep_leases(app)  # (2)


@app.task
def render(job: str, seconds: float) -> str:
    """Pretend work: ``seconds`` of it, longer than the queue's timeout if you like."""
    log.info("job %s: starting (%gs)", job, seconds)
    time.sleep(seconds)
    log.info("job %s: done", job)
    return job
