"""Fixtures for the crash tests: the session's three local services (tests/services.py,
shared with the backend tests), and one fresh queue per test on each.

The SQS and MNS conftests both name their queue factory ``make_queue``; here
they are imported as ``sqs_make_queue`` and ``mns_make_queue`` (pytest
registers an imported fixture under the name it is imported as) and wrapped in
the ``*_target`` fixtures. A service that cannot start fails the test: these
tests are never skipped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from azure.storage.queue import QueueClient

from leasekeeper.testing.mns_server import MNSServer
from tests.azure.conftest import queue_name as azure_queue_name
from tests.crash.harness import RECORDED, QueueTarget
from tests.crash.targets import AzureTarget, MNSTarget, SQSTarget
from tests.mns.conftest import ACCESS_ID, ACCESS_KEY
from tests.mns.conftest import make_queue as mns_make_queue
from tests.services import CHILD_ENV, make_client
from tests.sqs.conftest import make_queue as sqs_make_queue
from tests.sqs.fault_proxy import FaultProxyProcess

__all__ = ["azure_queue_name", "mns_make_queue", "sqs_make_queue"]

VISIBILITY = 2  # the queues' own visibility timeout: the workers' lease setting

FIGURES_ENV = "LEASEKEEPER_CRASH_FIGURES"  # also write the session's figures there


@pytest.fixture
def sqs_target(moto_endpoint: str, sqs_make_queue: Callable[..., str]) -> Iterator[QueueTarget]:
    """The workers reach moto through the fault proxy in ``real_sqs`` mode (no faults):
    it answers old handles as SQS does, and it hands moto one receive, extend or
    delete at a time - moto's message list is not thread-safe, and deletes racing
    in it could bring a deleted message back, which the journal would then blame
    on leasekeeper. The test's own counts and probe go to moto directly."""
    url = sqs_make_queue(visibility_timeout=VISIBILITY)
    with FaultProxyProcess(moto_endpoint, error_rate=0.0, real_sqs=True) as proxy:
        env = {**CHILD_ENV, "SQS_ENDPOINT": proxy.url, "SQS_QUEUE_URL": url}
        yield SQSTarget(make_client(moto_endpoint), url, env)


@pytest.fixture
def azure_target(azurite: str, azure_queue_name: str) -> Iterator[QueueTarget]:
    client = QueueClient.from_connection_string(azurite, azure_queue_name)
    env = {"AZURE_STORAGE_CONNECTION_STRING": azurite, "AZURE_QUEUE_NAME": azure_queue_name}
    target = AzureTarget(client, env)
    yield target
    client.close()


@pytest.fixture
def mns_target(
    mns_server: MNSServer, mns_make_queue: Callable[..., tuple[str, Any]]
) -> QueueTarget:
    name, queue = mns_make_queue(visibility_timeout=VISIBILITY)
    env = {
        "MNS_ENDPOINT": mns_server.endpoint,
        "MNS_QUEUE": name,
        "MNS_ACCESS_KEY_ID": ACCESS_ID,
        "MNS_ACCESS_KEY_SECRET": ACCESS_KEY,
    }
    return MNSTarget(mns_server, name, queue, env)


@pytest.fixture
def target(request: pytest.FixtureRequest) -> QueueTarget:
    """``@pytest.mark.parametrize("target", ["sqs", ...], indirect=True)``."""
    made: QueueTarget = request.getfixturevalue(f"{request.param}_target")
    return made


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the duplicate counts of every crash scenario that ran (and save them)."""
    if not RECORDED:
        return
    rows = sorted(RECORDED, key=lambda f: (f["backend"], f["scenario"]))
    terminalreporter.write_sep("-", "crash tests: duplicates per backend x kill point")
    header = (
        f"{'backend':8} {'scenario':28} {'msgs':>4} {'kills':>5} {'recv':>4} "
        f"{'dup':>3} {'unavoid':>7} {'lapse':>5} {'unexpl':>6} {'secs':>5}"
    )
    terminalreporter.write_line(header)
    for f in rows:
        terminalreporter.write_line(
            f"{f['backend']:8} {f['scenario']:28} {f['messages']:>4} {f['kills']:>5} "
            f"{f['receives']:>4} {f['duplicates']:>3} {f['unavoidable_duplicates']:>7} "
            f"{f['lapse_duplicates']:>5} {f['unexplained_duplicates']:>6} {f['seconds']:>5}"
        )
    destination = os.environ.get(FIGURES_ENV)
    if destination:
        with open(destination, "w") as out:
            json.dump(rows, out, indent=2)
        terminalreporter.write_line(f"figures written to {destination}")
