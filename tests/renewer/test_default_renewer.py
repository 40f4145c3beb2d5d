"""``LeaseManager``'s default renewer is ``"auto"``, as the workers' is (issue 31).

What a user of a bare ``LeaseManager`` on SQS now gets without asking: a renewer
process, so a handler that holds the GIL past the visibility timeout keeps its
lease. Asking for what only the thread renewer has (an ``executor``, a
``jitter_seed``) is choosing it, and the framework integrations, which own their
worker processes, keep the thread renewer unless told.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from leasekeeper import LeaseManager, LeaseState
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.integrations.frameworks import FrameworkLeases, QueueSetup
from tests.core.test_lapses import hold_the_gil
from tests.renewer.test_process import fill
from tests.services import make_client
from tests.sqs.test_moto import queue_counts

pytestmark = [pytest.mark.realtime, pytest.mark.slow]

TIMING: dict[str, float] = {"visibility_timeout": 2, "timer_interval": 0.2, "minimal_life": 0.5}


def test_a_bare_manager_renews_in_a_process_so_a_gil_holder_keeps_its_lease(
    moto_endpoint: str, queue_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler holds the GIL for 3.5 s at a 2 s visibility timeout: with the
    thread renewer (the default before) no renewal could run and the lease lapsed;
    the default now renews from a process of its own, and the job completes."""
    one_job_on_the_default(moto_endpoint, queue_url, caplog, lambda: hold_the_gil(3.5))


def one_job_on_the_default(
    moto_endpoint: str,
    queue_url: str,
    caplog: pytest.LogCaptureFixture,
    handler: Callable[[], None],
) -> None:
    """A bare ``LeaseManager`` on moto renews one message from a renewer process
    while ``handler`` runs; the job completes, nothing is lost, no WARNING."""
    fill(moto_endpoint, queue_url, 1)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    with caplog.at_level(logging.WARNING, logger="leasekeeper"):
        manager = LeaseManager(backend, **TIMING)
    try:
        assert manager.renewer.name == "process"
        assert manager.renewer_pid not in (0, os.getpid())
        got = backend.receive(max_messages=1, wait_seconds=1, visibility_timeout=2)
        lease = manager.register(got[0])
        handler()
        lease.complete()
        assert lease.state is LeaseState.COMPLETED and not lease.lost.is_set()
        assert manager.stats().lost == 0
    finally:
        manager.close()
    assert queue_counts(make_client(moto_endpoint), queue_url) == (0, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_settings_only_the_thread_renewer_has_choose_it(
    moto_endpoint: str, queue_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """An ``executor`` runs the thread renewer's extend calls and a ``jitter_seed``
    seeds its retry delays: given either, the default takes the thread renewer,
    silently (nothing is lost that the caller did not ask for), and uses them."""
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    with ThreadPoolExecutor(2) as executor, caplog.at_level(logging.WARNING, "leasekeeper"):
        for settings in ({"executor": executor}, {"jitter_seed": 7}):
            manager = LeaseManager(backend, **settings, **TIMING)  # type: ignore[arg-type]
            try:
                assert manager.renewer.name == "thread", settings
                assert manager.renewer_pid == os.getpid()
            finally:
                manager.close()
    assert not caplog.records


def test_framework_integrations_keep_the_thread_renewer_unless_told(
    moto_endpoint: str, queue_url: str
) -> None:
    """Celery's and Dramatiq's managers renew in the worker process by default
    (Celery's consumer runs no task code; a renewer process per queue would hold up
    a framework worker's first receive); Dramatiq's ``renewer="process"`` still
    asks for one."""
    backend = SQSBackend(make_client(moto_endpoint), queue_url)

    def setup() -> QueueSetup:
        return QueueSetup(backend, 30.0)

    for options, expected in (({}, "thread"), ({"renewer": "process"}, "process")):
        leases = FrameworkLeases("test", options)
        try:
            queue = leases.queue(queue_url, setup)
            assert queue is not None and queue.manager.renewer.name == expected, options
        finally:
            leases.close()


def test_a_leasekeeper_without_its_package_metadata_still_renews_from_a_process(
    moto_endpoint: str, queue_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """leasekeeper vendored into an application, or imported from a source tree by
    ``PYTHONPATH``, has no installed metadata, so no entry points: its own schemes
    still resolve, and a bare manager renews from a process as an installed copy's
    does (before, the renewer process found "installed schemes: none" and the
    default fell back to the thread renewer with a WARNING)."""
    import importlib.metadata

    from leasekeeper.backends.registry import factory_for, installed_schemes

    with monkeypatch.context() as patched:
        patched.setattr(importlib.metadata, "entry_points", lambda **_: ())
        assert installed_schemes()["sqs"].value == "leasekeeper.backends.sqs.scheme:sqs"
        assert callable(factory_for("memory"))
    # A worker, and the renewer process it starts (which imports with the worker's
    # sys.path), that see no package's entry points at all.
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.metadata\nimportlib.metadata.entry_points = lambda **_: ()\n"
    )
    fill(moto_endpoint, queue_url, 1)
    worker = textwrap.dedent(
        """
        import logging, sys
        logging.basicConfig(level=logging.WARNING, stream=sys.stdout)
        from leasekeeper import LeaseManager
        from leasekeeper.backends.sqs import SQSBackend
        from tests.services import make_client
        backend = SQSBackend(make_client(sys.argv[1]), sys.argv[2])
        manager = LeaseManager(backend, visibility_timeout=5)
        got = backend.receive(max_messages=1, wait_seconds=1, visibility_timeout=5)
        manager.register(got[0]).complete()
        print("renewer:", manager.renewer.name)
        manager.close()
        """
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(root)])}
    ran = subprocess.run(
        [sys.executable, "-c", worker, moto_endpoint, queue_url],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "renewer: process"  # and no WARNING line before it
    assert queue_counts(make_client(moto_endpoint), queue_url) == (0, 0)
