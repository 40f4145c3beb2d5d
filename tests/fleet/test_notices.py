"""Interruption notices: each cloud's source against a local server answering the
documented shapes (404 while there is none, the JSON or text when there is one,
IMDSv2 tokens asked for with their TTL and checked), the watch's timing on a
ManualClock, and a worker drained by a notice (real time, MemoryQueue)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from leasekeeper import Message, Worker
from leasekeeper.aio import AsyncWorker
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.fleet import (
    AlibabaSpotNotices,
    AwsSpotNotices,
    AzureScheduledEvents,
    InterruptionWatch,
    Notice,
    NoticeError,
)
from leasekeeper.fleet.notices import AWS_IPV6, aws_metadata_endpoint, notice_source, parse_iso
from leasekeeper.testing import ManualClock
from tests.fleet.clouds import CloudServer
from tests.services import free_port


def iso(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


# ------------------------------------------------------------------ AWS (IMDSv2)


def test_aws_reads_instance_action_with_an_imdsv2_token(cloud: CloudServer) -> None:
    source = AwsSpotNotices(cloud.url)
    assert source.poll() is None  # 404: no notice
    cloud.state.spot_action = {"action": "terminate", "time": "2026-03-01T12:00:08Z"}
    notice = source.poll()
    assert notice == Notice(
        parse_iso("2026-03-01T12:00:08Z"),
        "AWS spot instance-action terminate at 2026-03-01T12:00:08Z",
    )
    assert notice.at == 1772366408.0
    [token] = [c for c in cloud.state.calls if c.path == "/latest/api/token"]  # kept
    assert (
        token.method == "PUT" and token.headers["X-aws-ec2-metadata-token-ttl-seconds"] == "21600"
    )
    reads = [c for c in cloud.state.calls if c.path.endswith("/spot/instance-action")]
    assert len(reads) == 2 and all(
        c.headers["X-aws-ec2-metadata-token"] in cloud.state.tokens for c in reads
    )


def test_a_token_the_service_no_longer_takes_is_asked_for_again(cloud: CloudServer) -> None:
    source = AwsSpotNotices(cloud.url)
    assert source.poll() is None
    cloud.state.tokens.clear()  # the service forgot it (expired, restarted)
    cloud.state.spot_action = {"action": "stop", "time": "2026-03-01T12:00:00Z"}
    notice = source.poll()
    assert notice is not None and "stop" in notice.what
    assert len([c for c in cloud.state.calls if c.path == "/latest/api/token"]) == 2


def test_the_token_is_renewed_before_it_expires(cloud: CloudServer, clock: ManualClock) -> None:
    source = AwsSpotNotices(cloud.url, clock=clock)
    source.poll()
    clock.advance(21600 - 61)
    source.poll()
    clock.advance(2)
    source.poll()
    assert len([c for c in cloud.state.calls if c.path == "/latest/api/token"]) == 2


def test_an_imdsv1_only_service_is_read_without_a_token(cloud: CloudServer) -> None:
    cloud.state.ec2_tokens = False
    cloud.state.spot_action = {"action": "hibernate", "time": "2026-03-01T12:00:00Z"}
    notice = AwsSpotNotices(cloud.url).poll()
    assert notice is not None and "hibernate" in notice.what
    reads = [c for c in cloud.state.calls if c.path.endswith("/spot/instance-action")]
    assert "X-aws-ec2-metadata-token" not in reads[0].headers


def test_aws_failures_are_notice_errors(cloud: CloudServer) -> None:
    with pytest.raises(NoticeError, match="ConnectionRefusedError"):
        AwsSpotNotices(f"http://127.0.0.1:{free_port()}", timeout=2).poll()
    cloud.state.spot_action = {"unexpected": "shape"}
    with pytest.raises(NoticeError, match="not as documented"):
        AwsSpotNotices(cloud.url).poll()


def test_the_aws_endpoint_is_found_as_botocore_finds_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "config"
    config.write_text("[default]\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", raising=False)
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", raising=False)
    assert aws_metadata_endpoint() == "http://169.254.169.254"
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE", "IPv6")
    assert aws_metadata_endpoint() == AWS_IPV6
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9/")
    assert aws_metadata_endpoint() == "http://127.0.0.1:9/"
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT")
    monkeypatch.delenv("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE")
    config.write_text("[default]\nec2_metadata_service_endpoint = http://127.0.0.1:8/\n")
    assert aws_metadata_endpoint() == "http://127.0.0.1:8/"
    assert AwsSpotNotices().endpoint == "http://127.0.0.1:8/"


# ------------------------------------------------------------------ Azure Scheduled Events


def azure_event(kind: str, vm: str, not_before: str, **extra: object) -> dict[str, object]:
    return {
        "EventId": f"{kind}-{vm}-0001",
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": [vm],
        "EventStatus": "Scheduled",
        "NotBefore": not_before,
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
        **extra,
    }


def test_azure_reads_preempt_and_terminate_for_this_vm_only(cloud: CloudServer) -> None:
    source = AzureScheduledEvents(cloud.url)
    assert source.poll() is None  # "Events": []
    when = "Mon, 02 Mar 2026 12:00:30 GMT"
    cloud.state.azure_events = [
        azure_event("Reboot", "worker-vm_3", when),  # not a way to go
        azure_event("Preempt", "worker-vm_7", when),  # another VM of the scale set
    ]
    assert source.poll() is None
    cloud.state.azure_events.append(azure_event("Preempt", "worker-vm_3", when))
    notice = source.poll()
    assert notice == Notice(
        1772452830.0, f"Azure Preempt not before {when}", "Preempt-worker-vm_3-0001"
    )
    gets = [c for c in cloud.state.calls if c.path.startswith("/metadata/")]
    assert all(c.headers["Metadata"] == "true" for c in gets)
    assert all("api-version=" in c.path for c in gets)
    source.acknowledge(notice)
    assert cloud.state.azure_started == ["Preempt-worker-vm_3-0001"]
    [post] = [c for c in cloud.state.calls if c.method == "POST"]
    assert post.body == {"StartRequests": [{"EventId": "Preempt-worker-vm_3-0001"}]}


def test_an_azure_event_under_way_is_due_now(cloud: CloudServer, clock: ManualClock) -> None:
    cloud.state.azure_events = [
        azure_event("Terminate", "worker-vm_3", "", EventStatus="Started"),
    ]
    notice = AzureScheduledEvents(cloud.url, clock=clock).poll()
    assert notice is not None and notice.at == clock.wall() and "Terminate" in notice.what


# ------------------------------------------------------------------ Alibaba Cloud


def test_alibaba_reads_termination_time_in_hardened_mode(cloud: CloudServer) -> None:
    source = AlibabaSpotNotices(cloud.alibaba_url)
    assert source.poll() is None
    cloud.state.alibaba_time = "2026-03-01T12:05:00Z"
    notice = source.poll()
    assert notice is not None and notice.at == parse_iso("2026-03-01T12:05:00Z")
    token = next(c for c in cloud.state.calls if c.path == "/alibaba/latest/api/token")
    assert token.headers["X-aliyun-ecs-metadata-token-ttl-seconds"] == "21600"
    reads = [c for c in cloud.state.calls if c.path.endswith("/termination-time")]
    assert all(c.headers["X-aliyun-ecs-metadata-token"] in cloud.state.tokens for c in reads)


def test_sources_by_name(cloud: CloudServer) -> None:
    assert isinstance(notice_source("alibaba", cloud.alibaba_url), AlibabaSpotNotices)
    assert notice_source("azure").endpoint == "http://169.254.169.254"  # type: ignore[attr-defined]
    assert notice_source("alibaba").endpoint == "http://100.100.100.200"  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="one of aws, azure, alibaba, got 'gcp'"):
        notice_source("gcp")


# ------------------------------------------------------------------ the watch, on a ManualClock


class Scripted:
    """A ``NoticeSource`` that answers what the test says."""

    name = "scripted"

    def __init__(self) -> None:
        self.answers: list[Notice | Exception | None] = []
        self.polled = threading.Semaphore(0)
        self.acknowledged: list[Notice] = []

    def poll(self) -> Notice | None:
        try:
            answer = self.answers.pop(0) if self.answers else None
            if isinstance(answer, Exception):
                raise answer
            return answer
        finally:
            self.polled.release()

    def acknowledge(self, notice: Notice) -> None:
        self.acknowledged.append(notice)


def test_the_watch_polls_every_few_seconds_and_drains_by_the_notice_less_a_margin(
    clock: ManualClock, caplog: pytest.LogCaptureFixture
) -> None:
    source = Scripted()
    source.answers = [None, NoticeError("connection refused"), NoticeError("again"), None]
    drained: list[float] = []
    done = threading.Event()
    watch = InterruptionWatch(
        source,
        lambda deadline: (drained.append(deadline), done.set()),
        clock=clock,
        every=5.0,
        margin=10,
    )
    watch.started()
    try:
        for _ in range(4):
            assert source.polled.acquire(timeout=30)
            assert clock.wait_for_sleepers(1)
            clock.advance(5.0)
        source.answers = [Notice(clock.wall() + 120.0, "test notice", "event-1")]
        assert source.polled.acquire(timeout=30) and done.wait(30)
        assert drained == [pytest.approx(clock.now() + 110.0)]
    finally:
        watch.stopped()
    assert watch.polls == 5 and watch.failures == 2
    assert source.acknowledged == [watch.notice]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2  # the failures, once; the notice
    assert "cannot ask the metadata service: connection refused" in warnings[0]
    assert "interruption notice: test notice" in warnings[1]


def test_the_watch_stops_polling_when_the_worker_stops(clock: ManualClock) -> None:
    source = Scripted()
    watch = InterruptionWatch(source, lambda deadline: None, clock=clock)
    watch.started()
    assert source.polled.acquire(timeout=30) and clock.wait_for_sleepers(1)
    watch.stopped()
    clock.advance(60.0)
    assert watch.polls == 1 and source.acknowledged == []


def test_interruption_notice_takes_a_cloud_a_source_or_a_watch() -> None:
    queue = MemoryQueue(30.0)
    with pytest.raises(ValueError, match="interruption_notice must be one of aws"):
        Worker(queue, print, renewer="thread", interruption_notice="gce")
    with pytest.raises(TypeError, match="interruption_notice takes"):
        Worker(queue, print, renewer="thread", interruption_notice=5)  # type: ignore[arg-type]
    source = Scripted()
    worker = Worker(queue, print, renewer="thread", interruption_notice=source)
    [watch] = list(worker.listeners)
    assert isinstance(watch, InterruptionWatch) and watch.source is source
    assert watch.drain == worker.drain and watch.clock is worker.clock
    worker.manager.close()


# ------------------------------------------------------------------ a worker, real time


@pytest.mark.realtime
def test_a_notice_releases_unfinished_messages_before_the_machine_goes(
    cloud: CloudServer,
) -> None:
    queue = MemoryQueue(30.0)
    queue.send_many(["slow-1", "slow-2", "quick"])
    running = threading.Semaphore(0)
    finish = threading.Event()
    done: list[str] = []

    def handler(message: Message) -> None:
        if message.body == "quick":
            done.append(message.body)
            return
        running.release()
        finish.wait(30)

    watch = InterruptionWatch(AwsSpotNotices(cloud.url), every=0.1, margin=1.0)
    worker = Worker(
        queue,
        handler,
        concurrency=3,
        wait_seconds=0.05,
        renewer="thread",
        interruption_notice=watch,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert running.acquire(timeout=30) and running.acquire(timeout=30)
        goes_at = time.time() + 3.0
        cloud.state.spot_action = {"action": "terminate", "time": iso(goes_at)}
        thread.join(30)
        released_at = time.time()
        assert not thread.is_alive()
    finally:
        finish.set()
        thread.join(30)
    assert released_at < int(goes_at)  # back before the machine goes, a margin ahead
    assert queue.visible_count() == 2 and done == ["quick"]  # the quick one was deleted
    assert worker.stats.completed == 1 and worker.stats.received == 3


@pytest.mark.realtime
def test_azure_is_told_to_go_ahead_once_the_worker_drained(cloud: CloudServer) -> None:
    queue = MemoryQueue(30.0)
    queue.send("job")
    started = threading.Event()

    def handler(message: Message) -> None:
        started.set()
        time.sleep(0.3)

    watch = InterruptionWatch(AzureScheduledEvents(cloud.url), every=0.1, margin=1.0)
    worker = Worker(queue, handler, wait_seconds=0.05, renewer="thread", interruption_notice=watch)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        assert started.wait(30)
        not_before = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
        cloud.state.azure_events = [azure_event("Preempt", "worker-vm_3", not_before)]
    finally:
        thread.join(30)
    assert not thread.is_alive()
    assert worker.stats.completed == 1 and len(queue) == 0  # finished well within the notice
    assert cloud.state.azure_started == ["Preempt-worker-vm_3-0001"]


SCRIPT = textwrap.dedent(
    """
    import json, sys, threading, time
    from leasekeeper import Worker
    from leasekeeper.backends.memory import MemoryQueue
    from leasekeeper.fleet import InterruptionWatch, Notice

    running = threading.Event()

    class Soon:
        name = "soon"
        def poll(self):  # once the job runs: a notice a minute ahead
            return Notice(time.time() + 60, "a notice") if running.is_set() else None
        def acknowledge(self, notice):
            pass

    queue = MemoryQueue(30.0)
    queue.send("job")
    def handler(message):
        print("started", flush=True)
        running.set()
        time.sleep(3.0)
    watch = InterruptionWatch(Soon(), every=0.1, margin=1.0)
    worker = Worker(queue, handler, wait_seconds=0.05, shutdown_timeout=5, renewer="thread",
                    interruption_notice=watch)
    stats = worker.run()
    print(json.dumps({"completed": stats.completed, "left": len(queue)}), flush=True)
    """
)


@pytest.mark.realtime
def test_sigterm_during_a_notice_s_drain_is_a_first_signal_not_a_second(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline().strip() == "started"
    line = ""
    while "interruption notice:" not in line:  # the notice drains the worker first
        line = proc.stderr.readline()
        assert line, "the worker never saw the notice"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    # The running handler finished: the signal did not skip the wait.
    assert json.loads(out.strip().splitlines()[-1]) == {"completed": 1, "left": 0}
    assert "second signal" not in err


@pytest.mark.realtime
def test_an_async_worker_is_drained_by_a_notice_the_same_way() -> None:
    queue = MemoryQueue(30.0)
    queue.send("long")
    source = Scripted()
    started = threading.Event()

    async def handler(message: Message) -> None:
        started.set()
        await asyncio.sleep(30)

    async def main() -> None:
        watch = InterruptionWatch(source, every=0.1, margin=1.0)
        worker = AsyncWorker(
            queue, handler, wait_seconds=0.05, renewer="thread", interruption_notice=watch
        )
        running = asyncio.ensure_future(worker.run())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        source.answers = [Notice(time.time() + 2.0, "soon")]
        await asyncio.wait_for(running, 20)  # not the handler's 30 s
        assert worker.stats.completed == 0

    began = time.monotonic()
    asyncio.run(main())
    assert time.monotonic() - began < 15
    assert queue.visible_count() == 1  # released, a margin before the notice's time
