"""Fixtures for the Celery and Dramatiq tests: moto's server (the session's, from
tests/services.py), a counting proxy in front of it for the workers, real worker
processes stopped at the end, throw-away queue names.

Celery, kombu, Dramatiq and dramatiq-sqs are imported by the apps and the tests
themselves: when one is missing (``pip install -e '.[celery,dramatiq]'``), the tests
fail with the ImportError, never skip.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.frameworks.sqs_proxy import CountingProxy
from tests.frameworks.workers import WorkerSet
from tests.services import make_client

VISIBILITY = 3  # seconds: the scenario of issue 23


@pytest.fixture
def proxy(moto_endpoint: str) -> Iterator[CountingProxy]:
    counting = CountingProxy(moto_endpoint)
    yield counting
    counting.close()


@pytest.fixture
def workers(tmp_path: Path) -> Iterator[WorkerSet]:
    started = WorkerSet(tmp_path)
    yield started
    started.close()


@pytest.fixture
def sqs(moto_endpoint: str) -> Any:
    return make_client(moto_endpoint)


def new_queue_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def queue_is_empty(sqs: Any, name: str) -> bool:
    """No message left in the queue: none visible, in flight or delayed."""
    url = sqs.get_queue_url(QueueName=name)["QueueUrl"]
    names = [
        "ApproximateNumberOfMessages",
        "ApproximateNumberOfMessagesNotVisible",
        "ApproximateNumberOfMessagesDelayed",
    ]
    attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
    return all(int(attributes.get(name, "0")) == 0 for name in names)
