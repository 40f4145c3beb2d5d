"""What only the process renewer does: renew through a held GIL, and fail over at once.

Against moto's server (its own process), so a test that holds this process's GIL
holds nothing the renewer or the service needs. Timings are generous bounds for
a loaded machine; the figures themselves are measured by ``make bench``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

from leasekeeper import ConfigError, LeaseLost, LeaseManager, LeaseState, Worker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.observers import CallEvent, Observer
from leasekeeper.testing import FaultyBackend, ManualClock
from tests.core.test_lapses import hold_the_gil
from tests.forward_proxy import ForwardProxy
from tests.helpers import renewed_twice_then_completed, runs_three_jobs_in_a_thread_and_warns
from tests.services import CHILD_ENV, make_client

pytestmark = [pytest.mark.realtime, pytest.mark.slow]


def fill(endpoint: str, url: str, n: int) -> None:
    admin = make_client(endpoint)
    for start in range(0, n, 10):
        entries = [
            {"Id": str(i), "MessageBody": f"job {i}"} for i in range(start, min(n, start + 10))
        ]
        admin.send_message_batch(QueueUrl=url, Entries=entries)


def drain_ids(endpoint: str, url: str, want: int, timeout: float) -> set[str]:
    """Receive (as another consumer) until ``want`` distinct messages or ``timeout``."""
    other = make_client(endpoint)
    got: set[str] = set()
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        answer = other.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1, VisibilityTimeout=60
        )
        got |= {m["MessageId"] for m in answer.get("Messages", [])}
    return got


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie counts as gone: it renews nothing.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def held_back_manager(backend: SQSBackend) -> LeaseManager:
    """A process renewer whose leases are held back 2.5 s: until 1.5 s before their
    4 s deadline (threshold 1 s, tick 0.5 s). Returns once its renewer serves."""
    return LeaseManager(
        backend,
        renewer="process",
        visibility_timeout=4,
        extend_threshold=1.0,
        timer_interval=0.5,
        minimal_life=0.5,
    )


def receive_registered(backend: SQSBackend, manager: LeaseManager, count: int) -> list[Any]:
    """``count`` messages received (4 s timeout) and registered a receive at a time."""
    leases: list[Any] = []
    while len(leases) < count:
        got = backend.receive(max_messages=count, wait_seconds=1, visibility_timeout=4)
        leases += manager.register_many(got)
    return leases


def test_renewals_go_on_while_the_handler_holds_the_gil(moto_endpoint: str, queue_url: str) -> None:
    fill(moto_endpoint, queue_url, 5)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    manager = LeaseManager(
        backend, renewer="process", visibility_timeout=2, timer_interval=0.2, minimal_life=0.5
    )
    try:
        # Renewing before the first receive, as a loop of one's own does: at a 2 s
        # timeout, a lease registered while the renewer still builds its client (a
        # second or more on a loaded machine) could run out before it serves.
        manager.start()
        leases = []
        while len(leases) < 5:
            for message in backend.receive(max_messages=5, wait_seconds=1, visibility_timeout=2):
                leases.append(manager.register(message))
        hold_the_gil(3.5)  # 1.75 timeouts with no thread of this process running
        assert drain_ids(moto_endpoint, queue_url, 1, timeout=1.5) == set()
        for lease in leases:
            lease.complete()
        assert all(lease.extensions >= 1 for lease in leases)
        stats = manager.stats()
        assert (stats.completed, stats.lost, stats.lapses) == (5, 0, 0)
    finally:
        manager.close()


def test_leases_registered_without_a_ring_are_renewed_while_the_handler_holds_the_gil(
    moto_endpoint: str, queue_url: str
) -> None:
    """Held back 2.5 s (a 4 s timeout, threshold 1 s, tick 0.5 s), a receive's
    registers ring no bell (``renewers._bell``): the renewer reads them a while
    later on its own, with no word more from a worker stuck in C code, and renews."""
    fill(moto_endpoint, queue_url, 5)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    manager = held_back_manager(backend)
    try:
        leases = receive_registered(backend, manager, 5)
        hold_the_gil(6.0)  # 1.5 timeouts with no thread of this process running
        assert drain_ids(moto_endpoint, queue_url, 1, timeout=1.5) == set()
        results = manager.complete_many(leases)
        assert results == [None] * 5
        assert all(lease.extensions >= 1 for lease in leases)
        stats = manager.stats()
        assert (stats.registered, stats.completed, stats.lost, stats.lapses) == (5, 5, 0, 0)
    finally:
        manager.close()


def test_the_manager_returns_once_its_renewer_renews_and_loses_nothing_it_registers(
    moto_endpoint: str, queue_url: str
) -> None:
    """The renewer process builds its backend (imports botocore, makes its client)
    before the manager's constructor returns: leases registered at once, even of
    messages received before the manager existed, are renewed from the start."""
    fill(moto_endpoint, queue_url, 3)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    messages: list[Any] = []
    while len(messages) < 3:  # received before the manager exists: their time runs
        messages += backend.receive(max_messages=3, wait_seconds=1, visibility_timeout=5)
    manager = LeaseManager(
        backend, renewer="process", visibility_timeout=5, timer_interval=0.2, minimal_life=0.5
    )
    try:
        assert manager.running  # before start(): the constructor waited for it
        leases = [manager.register(m) for m in messages]
        manager.start()
        assert drain_ids(moto_endpoint, queue_url, 1, timeout=7) == set()  # 1.4 timeouts
        for lease in leases:
            lease.complete()
        assert all(lease.extensions >= 1 for lease in leases)
        assert (manager.stats().completed, manager.stats().lost) == (3, 0)
    finally:
        manager.close()


def test_a_worker_receives_nothing_before_its_renewer_renews(
    moto_endpoint: str, queue_url: str
) -> None:
    fill(moto_endpoint, queue_url, 4)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    renewing_at_receive: list[bool] = []
    receive = backend.receive

    def watched(*args: Any, **kwargs: Any) -> Any:
        renewing_at_receive.append(worker.manager.running)
        return receive(*args, **kwargs)

    backend.receive = watched  # type: ignore[method-assign]
    worker = Worker(backend, lambda message: None, renewer="process", wait_seconds=1)
    stats = worker.run(until_idle=1.5)
    assert stats.completed == 4
    assert renewing_at_receive and all(renewing_at_receive)


def kill_a_holding_worker(endpoint: str, url: str, *mode: str) -> tuple[int, list[str], float]:
    """Start ``tests.renewer.worker_proc`` (20 leases, in ``mode``), SIGKILL it once it
    holds them: its renewer's pid, the ids it held, when it was killed."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.renewer.worker_proc", endpoint, url, "20", *mode],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **CHILD_ENV},
    )
    try:
        line = worker.stdout.readline() if worker.stdout else ""
        assert line.startswith("ready"), line
        _, renewer, *held = line.split()
        assert len(held) == 20
        worker.send_signal(signal.SIGKILL)
        worker.wait()
        return int(renewer), held, time.monotonic()
    finally:
        if worker.poll() is None:
            worker.kill()


def test_a_killed_worker_s_messages_come_back_at_once(moto_endpoint: str, queue_url: str) -> None:
    fill(moto_endpoint, queue_url, 20)
    renewer, held, killed = kill_a_holding_worker(moto_endpoint, queue_url)
    # Visibility 30 s: without the renewer's release nothing would come back sooner.
    got = drain_ids(moto_endpoint, queue_url, 20, timeout=20)
    took = time.monotonic() - killed
    assert got == set(held), f"{len(got)} of 20 back after {took:.1f}s"
    assert took < 20
    deadline = time.monotonic() + 10
    while alive(renewer) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(renewer), "the renewer outlived its worker"


def test_a_killed_renewer_that_no_other_can_replace_loses_its_leases(
    moto_endpoint: str, queue_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renewer dies and no other can start in its place (tests/renewer/
    test_takeover.py has the takeover itself): every lease it held is reported lost,
    a complete raises LeaseLost, and the next register starts a renewer again."""
    fill(moto_endpoint, queue_url, 6)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    reports: list[tuple[Any, str]] = []
    manager = LeaseManager(
        backend,
        renewer="process",
        visibility_timeout=30,
        on_lost=lambda lease, reason: reports.append((lease, reason)),
    )
    try:
        messages: list[Any] = []
        while len(messages) < 6:
            messages += backend.receive(max_messages=6 - len(messages), wait_seconds=1)
        leases = [manager.register(m) for m in messages[:5]]
        first = manager.renewer_pid
        monkeypatch.setattr(sys, "executable", "/bin/false")  # no renewer starts now
        os.kill(first, signal.SIGKILL)
        for lease in leases:
            assert lease.lost.wait(60), "a lease of the dead renewer was not reported"
        deadline = time.monotonic() + 10
        while len(reports) < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert {lease.id for lease, _ in reports} == {lease.id for lease in leases}
        assert all(reason == "renewer_died" for _, reason in reports)
        assert all("renewer process died" in (lease.reason or "") for lease, _ in reports)
        assert all(lease.state is LeaseState.LOST for lease in leases)
        with pytest.raises(LeaseLost):
            leases[0].complete()
        monkeypatch.undo()
        # New leases go to a new renewer.
        fresh = manager.register(messages[5])
        assert manager.renewer_pid not in (0, first)
        fresh.complete()
        assert fresh.state is LeaseState.COMPLETED
        stats = manager.stats()
        assert (stats.lost, stats.lost_reasons) == (5, {"renewer_died": 5})
    finally:
        manager.close()


def test_close_leaves_no_renewer_behind(moto_endpoint: str, queue_url: str) -> None:
    manager = LeaseManager(SQSBackend(make_client(moto_endpoint), queue_url), renewer="process")
    pid = manager.renewer_pid
    assert pid != os.getpid() and alive(pid)
    manager.close()
    assert not alive(pid)
    assert not manager.running


class RefreshingMNSKeys:
    """An MNS credentials provider of the user's own (an STS refresh): the renewer
    process cannot be sent it."""

    def get_credentials(self) -> Any:
        from mns.auth import Credentials

        from tests.services import MNS_ACCESS_ID, MNS_ACCESS_KEY

        return Credentials(MNS_ACCESS_ID, MNS_ACCESS_KEY, "")


def test_a_renewer_that_cannot_have_the_credentials_fails_the_manager_at_once(
    monkeypatch: pytest.MonkeyPatch, mns_server: Any
) -> None:
    from mns.account import Account

    from leasekeeper.backends.mns import MNSBackend

    monkeypatch.delenv("MNS_ACCESS_KEY_ID", raising=False)
    monkeypatch.delenv("MNS_ACCESS_KEY_SECRET", raising=False)
    name = f"renewer-{uuid.uuid4().hex[:12]}"
    mns_server.create_queue(name, visibility_timeout=30)
    queue = Account(mns_server.endpoint, credentials_provider=RefreshingMNSKeys()).get_queue(name)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"RefreshingMNSKeys.*cannot rebuild"):
        LeaseManager(MNSBackend(queue), renewer="process")
    assert time.monotonic() - started < 30


def test_what_cannot_be_rebuilt_elsewhere_is_refused_clearly() -> None:
    with pytest.raises(ConfigError, match="this process's memory"):
        LeaseManager(MemoryQueue(), renewer="process")
    with pytest.raises(ConfigError, match="wraps"):
        LeaseManager(FaultyBackend(MemoryQueue()), renewer="process")
    with pytest.raises(ConfigError, match="renewer"):
        LeaseManager(MemoryQueue(), renewer="fork")  # type: ignore[arg-type]


def test_the_process_renewer_needs_the_system_clock(moto_endpoint: str, queue_url: str) -> None:
    backend = SQSBackend(make_client(moto_endpoint), queue_url, clock=ManualClock())
    with pytest.raises(ConfigError, match="system clock"):
        LeaseManager(backend, clock=ManualClock(), renewer="process")


def test_a_worker_with_a_process_renewer(moto_endpoint: str, queue_url: str) -> None:
    from leasekeeper import Worker

    fill(moto_endpoint, queue_url, 10)
    done: list[str] = []

    def handler(message: Any) -> None:
        hold_the_gil(0.2)  # CPU-bound work that keeps the GIL
        done.append(message.id)

    worker = Worker(
        SQSBackend(make_client(moto_endpoint), queue_url),
        handler,
        renewer="process",
        concurrency=4,
        wait_seconds=1,
        visibility_timeout=10,
    )
    assert worker.manager.renewer_pid != os.getpid()
    stats = worker.run(until_idle=3)
    assert (stats.completed, stats.lost, stats.failed) == (10, 0, 0)
    assert len(set(done)) == 10
    assert worker.manager.closed


def test_the_default_managers_can_renew_in_a_process(moto_endpoint: str, queue_url: str) -> None:
    import leasekeeper

    fill(moto_endpoint, queue_url, 1)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    leasekeeper.configure(renewer="process", visibility_timeout=10)
    try:
        (message,) = backend.receive(max_messages=1, wait_seconds=1)
        with leasekeeper.lease(message) as held:
            assert leasekeeper.default_manager(backend).renewer_pid != os.getpid()
        assert held.state is LeaseState.COMPLETED
    finally:
        leasekeeper.shutdown()
        leasekeeper.configure()


def no_aws_credentials_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


def test_keys_given_in_code_only_reach_the_renewer_process(
    moto_endpoint: str,
    queue_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A boto3 client built with keys in code, in a process whose environment has
    none: the renewer process is sent them over its socket, so the default worker
    renews there, says nothing, and every job completes. Its spec, which goes to
    Spark and logs, holds no key."""
    no_aws_credentials_here(monkeypatch, tmp_path)
    client = make_client(moto_endpoint)  # the keys are the client's own
    fill(moto_endpoint, queue_url, 5)
    backend = SQSBackend(client, queue_url)
    assert "testing" not in repr(backend.spec()) and "aws_" not in repr(backend.spec())

    with caplog.at_level("WARNING", logger="leasekeeper"):
        worker = Worker(backend, lambda message: None, concurrency=2, wait_seconds=1)
        assert worker.manager.renewer.name == "process"
        stats = worker.run(until_idle=1.0)
    assert (stats.completed, stats.lost, stats.failed) == (5, 0, 0)
    assert [r.getMessage() for r in caplog.records if "renewer" in r.getMessage()] == []


def test_credentials_refreshed_by_a_provider_built_in_code_keep_the_worker_on_a_thread(
    moto_endpoint: str,
    queue_url: str,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The one case the renewer process cannot have: credentials that a provider of
    the user's refreshes. ``renewer="process"`` refuses; the default worker renews
    in a thread with one two-line WARNING; every job completes."""
    import boto3
    import botocore.session
    from botocore.config import Config
    from botocore.credentials import RefreshableCredentials

    no_aws_credentials_here(monkeypatch, tmp_path)

    def refresh() -> dict[str, str]:
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        return {
            "access_key": "testing",
            "secret_key": "testing",
            "token": "",
            "expiry_time": expiry,
        }

    session = botocore.session.get_session()
    session._credentials = RefreshableCredentials.create_from_metadata(
        metadata=refresh(), refresh_using=refresh, method="sts-refresh-of-my-own"
    )
    client = boto3.Session(botocore_session=session).client(
        "sqs", endpoint_url=moto_endpoint, region_name="us-east-1", config=Config(connect_timeout=2)
    )
    fill(moto_endpoint, queue_url, 3)
    backend = SQSBackend(client, queue_url)
    with pytest.raises(ConfigError, match="sts-refresh-of-my-own"):
        LeaseManager(backend, visibility_timeout=30, renewer="process")
    warning = runs_three_jobs_in_a_thread_and_warns(backend, caplog)
    assert len(warning.splitlines()) == 2 and warning.count("could not start") == 1
    assert "sts-refresh-of-my-own" in warning and "holds the GIL" in warning
    assert "spark" not in warning.lower()


def role_profiles(monkeypatch: pytest.MonkeyPatch, tmp_path: Any, endpoint: str) -> None:
    """A config file whose profile "role" assumes a role with profile "base"'s keys
    (STS is moto's too), and other keys in the environment: the default chain's."""
    no_aws_credentials_here(monkeypatch, tmp_path)
    config = tmp_path / "config"
    config.write_text(
        "[profile base]\naws_access_key_id = base-key\naws_secret_access_key = base-secret\n"
        "[profile role]\nrole_arn = arn:aws:iam::123456789012:role/jobs\n"
        "source_profile = base\nregion = us-east-1\n"
        "[profile other-role]\nrole_arn = arn:aws:iam::123456789012:role/others\n"
        "source_profile = base\nregion = us-east-1\n"
    )
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "someone-else")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "someone-else")


@pytest.mark.parametrize("chain", ["env", "assume-role"])
def test_a_role_assumed_through_a_profile_chosen_in_code_is_not_renewed_as_another_identity(
    chain: str,
    moto_endpoint: str,
    queue_url: str,
    monkeypatch: pytest.MonkeyPatch,
    *,
    tmp_path: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``boto3.Session(profile_name="role")``, a profile that assumes a role: the
    renewer process's own chain would find the environment's keys instead and renew
    as someone else: the environment's keys, or (``AWS_PROFILE``) another role.
    ``renewer="process"`` refuses and says why; the default worker renews in a
    thread, with the client's role, and says so once."""
    import boto3

    fill(moto_endpoint, queue_url, 3)  # (boto3's default session, before AWS_PROFILE)
    role_profiles(monkeypatch, tmp_path, moto_endpoint)
    if chain == "assume-role":  # (keys in the environment come first in the chain)
        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("AWS_PROFILE", "other-role")
    client = boto3.Session(profile_name="role").client("sqs")
    assumed = boto3.Session(profile_name="role").client("sts").get_caller_identity()
    assert ":assumed-role/jobs/" in assumed["Arn"]  # the client's identity is the role's
    backend = SQSBackend(client, queue_url)
    with pytest.raises(ConfigError, match=rf"\(assume-role\).*\({chain}\).*another identity"):
        LeaseManager(backend, visibility_timeout=30, renewer="process")
    warning = runs_three_jobs_in_a_thread_and_warns(backend, caplog)
    assert "a profile or role chosen in code" in warning and "AWS_PROFILE" in warning
    assert "someone-else" not in warning


def test_a_role_the_renewer_process_assumes_too_is_renewed_there(
    moto_endpoint: str, queue_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The same role named by ``AWS_PROFILE``: the renewer process's chain assumes
    it as the worker's did, so it renews there."""
    import boto3

    role_profiles(monkeypatch, tmp_path, moto_endpoint)
    monkeypatch.setenv("AWS_PROFILE", "role")
    client = boto3.Session().client("sqs")
    manager = LeaseManager(SQSBackend(client, queue_url), visibility_timeout=30, renewer="process")
    try:
        assert manager.renewer.name == "process"
    finally:
        manager.close()


@pytest.mark.parametrize("service", ["azure", "mns"])
def test_a_queue_opened_with_keys_in_code_only_renews_in_the_renewer_process(
    service: str,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As with SQS: an Azure queue client made from a connection string in code, an
    MNS queue from keys in code, in a process whose environment has none. The
    renewer process is sent the key; the default worker renews there."""
    for name in (
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "MNS_ACCESS_KEY_ID",
        "MNS_ACCESS_KEY_SECRET",
    ):
        monkeypatch.delenv(name, raising=False)
    name = f"renewer-{uuid.uuid4().hex[:12]}"
    backend: Any
    if service == "azure":
        from azure.storage.queue import QueueClient

        from leasekeeper.backends.azure import AzureQueueBackend

        client = QueueClient.from_connection_string(request.getfixturevalue("azurite"), name)
        client.create_queue()
        backend = AzureQueueBackend(client)
    else:
        from leasekeeper.backends.mns import MNSBackend
        from tests.services import sdk_queue

        server = request.getfixturevalue("mns_server")
        server.create_queue(name, visibility_timeout=30)
        backend = MNSBackend(sdk_queue(server, name))
    backend.send("job")
    with caplog.at_level("WARNING", logger="leasekeeper"):
        worker = Worker(backend, lambda message: None, wait_seconds=1)
        assert worker.manager.renewer.name == "process"
        stats = worker.run(until_idle=1.0)
    assert (stats.completed, stats.lost, stats.failed) == (1, 0, 0)
    assert [r.getMessage() for r in caplog.records if "renewer" in r.getMessage()] == []


class CallLog(Observer):
    """The delete calls' entries the renewer process made (forwarded to the worker)."""

    def __init__(self) -> None:
        self.deleted = 0

    def on_call(self, event: CallEvent) -> None:
        if event.operation == "delete":
            self.deleted += event.entries


def queue_depth(endpoint: str, url: str) -> int:
    """Messages still in the queue, visible or not."""
    names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
    found = make_client(endpoint).get_queue_attributes(QueueUrl=url, AttributeNames=names)
    return sum(int(found["Attributes"][name]) for name in names)


def test_jobs_done_before_their_first_renewal_cost_one_delete_each(
    moto_endpoint: str, queue_url: str
) -> None:
    """The renewer process holds a lease back until its first renewal nears; a job
    done before then is deleted once, counted registered and completed."""
    fill(moto_endpoint, queue_url, 12)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    manager = LeaseManager(backend, renewer="process", visibility_timeout=30)
    calls = CallLog()
    manager.add_observer(calls)
    try:
        leases: list[Any] = []
        while len(leases) < 12:
            leases += manager.register_many(backend.receive(max_messages=10, wait_seconds=1))
        assert manager.stats().registered == 12
        assert manager.complete_many(leases[:10]) == [None] * 10
        for lease in leases[10:]:
            lease.complete()
        assert all(lease.state is LeaseState.COMPLETED for lease in leases)
        assert all(lease.extensions == 0 for lease in leases)
        stats = manager.stats()
        assert (stats.registered, stats.completed, stats.lost, stats.in_flight) == (12, 12, 0, 0)
        assert queue_depth(moto_endpoint, queue_url) == 0
        deadline = time.monotonic() + 10
        while calls.deleted < 12 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # any second delete would have been told by now
        assert calls.deleted == 12
    finally:
        manager.close()


@pytest.mark.parametrize("stopped", ["after registering", "before registering"])
def test_jobs_done_before_their_first_renewal_are_deleted_by_the_worker_itself(
    moto_endpoint: str, queue_url: str, stopped: str
) -> None:
    """No round trip: the worker deletes a job's message itself while the renewer
    process holds its lease back - even with the renewer stopped (SIGSTOP), which
    could answer nothing. Stopped before the registers, it reads each with its
    drop when it runs again, and never holds them; counted all the same."""
    fill(moto_endpoint, queue_url, 12)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    manager = LeaseManager(backend, renewer="process", visibility_timeout=30)
    pid = manager.renewer_pid
    try:
        if stopped == "before registering":
            os.kill(pid, signal.SIGSTOP)
        leases: list[Any] = []
        while len(leases) < 12:
            leases += manager.register_many(backend.receive(max_messages=10, wait_seconds=1))
        os.kill(pid, signal.SIGSTOP)
        try:
            assert manager.complete_many(leases[:10]) == [None] * 10
            for lease in leases[10:]:
                lease.complete()
            assert all(lease.state is LeaseState.COMPLETED for lease in leases)
            assert queue_depth(moto_endpoint, queue_url) == 0
        finally:
            os.kill(pid, signal.SIGCONT)
        stats = manager.stats()  # the renewer's count and the worker's, together
        assert (stats.registered, stats.completed, stats.lost, stats.in_flight) == (12, 12, 0, 0)
    finally:
        manager.close()


def test_a_delete_the_worker_cannot_do_goes_by_the_renewer_s_rules(
    moto_endpoint: str, queue_url: str
) -> None:
    """The worker's own delete answered with an error is the renewer's to decide:
    here a receipt the service rejects, so the lease is lost (as with the thread
    renewer), and the good one beside it is deleted."""
    fill(moto_endpoint, queue_url, 2)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    manager = LeaseManager(backend, renewer="process", visibility_timeout=30)
    try:
        messages: list[Any] = []
        while len(messages) < 2:
            messages += backend.receive(max_messages=2, wait_seconds=1)
        bad = messages[0]
        bad.receipt = "not-a-receipt"
        leases = manager.register_many([bad, messages[1]])
        results = manager.complete_many(leases)
        assert isinstance(results[0], LeaseLost) and results[1] is None
        assert leases[0].state is LeaseState.LOST
        assert leases[1].state is LeaseState.COMPLETED
        stats = manager.stats()
        assert (stats.registered, stats.completed, stats.lost) == (2, 1, 1)
    finally:
        manager.close()


def test_a_lease_that_outlives_its_hold_is_renewed_and_counted_once(
    moto_endpoint: str, queue_url: str
) -> None:
    fill(moto_endpoint, queue_url, 2)
    backend = SQSBackend(make_client(moto_endpoint), queue_url)
    manager = held_back_manager(backend)
    try:
        quick, slow = receive_registered(backend, manager, 2)
        quick.complete()  # before its first renewal
        deadline = time.monotonic() + 15
        while slow.extensions < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert slow.extensions >= 2  # handed to the engine in time, renewed since
        assert drain_ids(moto_endpoint, queue_url, 1, timeout=1.5) == set()
        slow.complete()
        stats = manager.stats()
        assert (stats.registered, stats.completed, stats.lost, stats.lapses) == (2, 2, 0, 0)
        assert queue_depth(moto_endpoint, queue_url) == 0
    finally:
        manager.close()


def test_a_killed_worker_s_held_and_renewed_leases_all_come_back_at_once(
    moto_endpoint: str, queue_url: str
) -> None:
    """Half the leases held back by the renewer process, half renewed by its engine
    (received with a short timeout): the worker's death releases both at once."""
    fill(moto_endpoint, queue_url, 20)
    _, held, killed = kill_a_holding_worker(moto_endpoint, queue_url, "mixed")
    # Renewed ones are hidden 30 s past their last extend, held ones 30 s past
    # their receive: only the renewer's release brings them back sooner.
    got = drain_ids(moto_endpoint, queue_url, 20, timeout=12)
    took = time.monotonic() - killed
    assert got == set(held), f"{len(got)} of 20 back after {took:.1f}s"


GATEWAY_KEY = "x-gateway-key"  # a header the service's gateway wants on every call


def add_the_gateway_key(request: Any, **kwargs: Any) -> None:
    request.headers[GATEWAY_KEY] = "k1"


def refused_without_the_key(headers: Any) -> Any:
    """The gateway: SQS's AccessDenied for a call without the header it wants."""
    if headers.get(GATEWAY_KEY) == "k1":
        return None
    body = b'{"__type":"com.amazon.coral.service#AccessDeniedException","message":"no key"}'
    return 403, {"Content-Type": "application/x-amz-json-1.0"}, body


def test_a_hook_on_the_client_keeps_the_renewals_on_it_in_a_thread(
    moto_endpoint: str, queue_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A client whose calls a handler registered in code changes (here: a header a
    gateway in front of the service wants) cannot be made again in the renewer
    process, which would renew without it and be refused. ``auto`` renews in a
    thread, on the client itself; ``renewer="process"`` refuses; the WARNING names
    the handler's module."""
    port = int(urlsplit(moto_endpoint).port or 0)
    with ForwardProxy({"": ("127.0.0.1", port)}, answer_first=refused_without_the_key) as gate:
        client = make_client(gate.url)
        client.meta.events.register("before-sign.sqs", add_the_gateway_key)
        backend = SQSBackend(client, queue_url)
        problem = backend.credentials_problem()
        assert problem is not None and "(tests.renewer.test_process)" in problem
        with pytest.raises(ConfigError, match="event handlers registered in code"):
            LeaseManager(backend, renewer="process").start()

        fill(moto_endpoint, queue_url, 1)
        manager = LeaseManager(
            backend, renewer="auto", visibility_timeout=2, timer_interval=0.2, minimal_life=0.5
        )
        try:
            manager.start()
            assert manager.renewer.name == "thread"
            [message] = backend.receive(max_messages=1, visibility_timeout=2)
            renewed_twice_then_completed(manager, message)
        finally:
            manager.close()

        fill(moto_endpoint, queue_url, 3)
        caplog.clear()  # (the manager above said it too)
        warning = runs_three_jobs_in_a_thread_and_warns(backend, caplog)
        assert "event handlers registered in code" in warning
        assert gate.refused == 0


def test_the_gateway_refuses_a_call_without_the_key(moto_endpoint: str, queue_url: str) -> None:
    """What lets the test above fail: a client without the handler is refused."""
    port = int(urlsplit(moto_endpoint).port or 0)
    with ForwardProxy({"": ("127.0.0.1", port)}, answer_first=refused_without_the_key) as gate:
        with pytest.raises(Exception, match="AccessDenied"):
            make_client(gate.url).get_queue_attributes(QueueUrl=queue_url)
        assert gate.refused >= 1
