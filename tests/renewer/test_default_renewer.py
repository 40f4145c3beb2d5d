"""``LeaseManager``'s default renewer is ``"auto"``, as the workers' is (issue 31), and
so are the module-level forms' (issue 47).

What a user of a bare ``LeaseManager`` on SQS now gets without asking: a renewer
process, so a handler that holds the GIL past the visibility timeout keeps its
lease. Asking for what only the thread renewer has (an ``executor``, a
``jitter_seed``) is choosing it, and the framework integrations, which own their
worker processes, keep the thread renewer unless told. A script in the
module-level form (``for held in leasekeeper.receive(queue): with held: ...``)
killed by SIGTERM gives its message back at once; stopped by Ctrl-C, too, and says
nothing of a failure.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import leasekeeper
from leasekeeper import LeaseManager, LeaseState, Message
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.defaults import default_manager
from leasekeeper.integrations.frameworks import FrameworkLeases, QueueSetup
from tests.core.test_lapses import hold_the_gil
from tests.renewer.test_process import fill
from tests.services import CHILD_ENV, make_client
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
        from tests.services import CHILD_ENV, make_client
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


def test_the_module_level_forms_renew_in_a_process(moto_endpoint: str, queue_url: str) -> None:
    """``leasekeeper.receive``, ``lease(msg)`` and ``@leased`` share the per-process
    default manager of the queue, which renews from a renewer process."""
    fill(moto_endpoint, queue_url, 3)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)

    @leasekeeper.leased
    def handle(message: Message) -> None:
        assert leasekeeper.lease(message)  # the same manager's

    try:
        got: list[Any] = []
        while len(got) < 3:
            got += leasekeeper.receive(backend, max_messages=3, wait_seconds=1)
        manager = default_manager(backend)
        assert manager.renewer.name == "process"
        assert manager.renewer_pid not in (0, os.getpid())
        with got[0]:
            pass
        with leasekeeper.lease(got[1].message):
            pass
        handle(got[2].message)
        assert manager.stats().completed == 3
    finally:
        leasekeeper.shutdown()
    assert queue_counts(make_client(moto_endpoint), queue_url) == (0, 0)


def start_module_level_script(endpoint: str, url: str) -> tuple[subprocess.Popen[str], str]:
    """``tests.renewer.module_level`` at work on the one message of the queue: the
    process and the message's id."""
    script = subprocess.Popen(
        [sys.executable, "-m", "tests.renewer.module_level", endpoint, url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **CHILD_ENV},
        cwd=Path(__file__).resolve().parents[2],
    )
    assert script.stdout is not None
    line = script.stdout.readline().split()
    assert line[:1] == ["working"], f"{line}: {script.stderr.read() if script.stderr else ''}"
    return script, line[1]


def back_after(endpoint: str, url: str, message_id: str, limit: float) -> float:
    """Seconds until another consumer receives ``message_id`` (at most ``limit``)."""
    other = make_client(endpoint)
    begun = time.monotonic()
    while time.monotonic() - begun < limit:
        got = other.receive_message(QueueUrl=url, WaitTimeSeconds=1, VisibilityTimeout=60)
        if [m["MessageId"] for m in got.get("Messages", [])] == [message_id]:
            return time.monotonic() - begun
    raise AssertionError(f"message not back within {limit:g}s")


# The queue's visibility timeout, and the leases': without a release on the way out
# a message would be back only after it (29.5 s was measured before issue 47).
SCRIPT_VISIBILITY = 30


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_module_level_script_stopped_gives_its_message_back_at_once(
    moto_endpoint: str, queue_url: str, stop: signal.Signals
) -> None:
    """SIGTERM (the default action: no Python code runs) and Ctrl-C (a
    KeyboardInterrupt in ``with held:``): either way the message is back well within
    its visibility timeout, and Ctrl-C says nothing of a failed handler or of
    poison messages."""
    fill(moto_endpoint, queue_url, 1)
    script, message_id = start_module_level_script(moto_endpoint, queue_url)
    try:
        time.sleep(0.5)
        script.send_signal(stop)
        took = back_after(moto_endpoint, queue_url, message_id, SCRIPT_VISIBILITY / 2)
        _, err = script.communicate(timeout=30)
    finally:
        script.kill()
        script.wait()
    print(f"\nback {took:.2f}s after {stop.name}")
    if stop is signal.SIGINT:
        assert "KeyboardInterrupt" in err  # Python's own traceback, and nothing else:
        for said in ("handler failed", "released: back in", "retried for ever", "dead-letter"):
            assert said not in err, err
