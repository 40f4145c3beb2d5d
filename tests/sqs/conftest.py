"""Fixtures for the SQS backend tests: clients and throw-away queues on moto's server.

The server itself (``moto_endpoint``) is the session's one, from tests/services.py:
a ``python -m moto.server`` subprocess on 127.0.0.1. If it cannot start, every
test that needs it fails (never skips).
"""

from __future__ import annotations

import contextlib
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.services import CHILD_ENV, REGION, make_client

__all__ = ["CHILD_ENV", "REGION", "count_calls", "make_client"]


def count_calls(client: Any) -> Counter[str]:
    """Count the client's API calls by operation name (through boto3's event hooks)."""
    calls: Counter[str] = Counter()

    def before_call(model: Any, **_: Any) -> None:
        calls[model.name] += 1

    client.meta.events.register("before-call.sqs.*", before_call)
    return calls


@pytest.fixture
def sqs_client(moto_endpoint: str) -> Any:
    return make_client(moto_endpoint)


@pytest.fixture
def make_queue(moto_endpoint: str) -> Iterator[Callable[..., str]]:
    """``make_queue(visibility_timeout=2, fifo=False) -> queue URL``; deleted afterwards."""
    admin = make_client(moto_endpoint)
    made: list[str] = []

    def make(visibility_timeout: int = 2, *, fifo: bool = False) -> str:
        name = f"lk-{uuid.uuid4().hex[:12]}"
        attributes = {"VisibilityTimeout": str(visibility_timeout)}
        if fifo:
            name += ".fifo"
            attributes["FifoQueue"] = "true"
            attributes["ContentBasedDeduplication"] = "true"
        url: str = admin.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        made.append(url)
        return url

    yield make
    for url in made:
        # The server may be gone at the very end; nothing outlives it.
        with contextlib.suppress(Exception):
            admin.delete_queue(QueueUrl=url)
