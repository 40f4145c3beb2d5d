"""dramatiq-sqs brokers and messages on moto, for the worker app
(tests/frameworks/dramatiq_app.py) and for the tests that send to it."""

from __future__ import annotations

import dramatiq
from dramatiq_sqs import SQSBroker

RUN = "run"
NOOP = "noop"


def make_broker(endpoint: str) -> SQSBroker:
    """dramatiq-sqs's broker on moto at ``endpoint`` (host:port)."""
    return SQSBroker(
        endpoint_url=f"http://{endpoint}",
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def message(queue: str, actor: str, *args: object, **kwargs: object) -> dramatiq.Message[None]:
    return dramatiq.Message(
        queue_name=queue, actor_name=actor, args=args, kwargs=kwargs, options={}
    )
