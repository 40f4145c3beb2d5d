"""``leasekeeper worker`` in an elastic fleet, run as users run it: a subprocess on
moto's SQS, with its default renewer (a renewer process), against local stand-ins
of the ECS agent and the metadata services answering as documented
(tests/fleet/clouds.py).

Issue 47's scenarios: three 2 s jobs under ``--scale-in-protection`` are protected
before the first starts and unprotected after the last ends in at most four PUTs; an
agent answering 500 costs at most two warning lines; outside ECS the command says so
and works on; ``/livez`` and ``/readyz``, and after SIGTERM with a job running
``/readyz`` is 503 while ``/livez`` is 200; a spot notice 8 s ahead while two 20 s
jobs run puts both messages back before the notice's time and nothing is received
after it; ``--backlog-every 2`` with 20 queued messages.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from tests.fleet.clouds import CloudServer
from tests.services import CHILD_ENV, free_port, make_client

JOBS = textwrap.dedent(
    """
    import os, time

    def _say(word, message):
        os.write(1, f"{word} {message.body} {time.time():.6f}\\n".encode())

    def two(message):
        _say("start", message)
        time.sleep(2)
        _say("done", message)

    def six(message):
        _say("start", message)
        time.sleep(6)
        _say("done", message)

    def twenty(message):
        _say("start", message)
        time.sleep(20)
        _say("done", message)
    """
)

# 2 s visibility renewed when 1.2 s remain, as the other command tests.
TIMING = [
    "--visibility-timeout", "2", "--timer-interval", "0.2", "--minimal-life", "0.5",
    "--extend-threshold", "1.2",
]  # fmt: skip

pytestmark = [pytest.mark.realtime, pytest.mark.slow]


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "jobs.py").write_text(JOBS)
    return tmp_path


@pytest.fixture
def queue_url(moto_endpoint: str) -> Iterator[str]:
    admin = make_client(moto_endpoint)
    url: str = admin.create_queue(
        QueueName=f"fleet-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "2"}
    )["QueueUrl"]
    yield url
    admin.delete_queue(QueueUrl=url)


def env_for(moto_endpoint: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, **CHILD_ENV, "AWS_ENDPOINT_URL_SQS": moto_endpoint}
    env.pop("ECS_AGENT_URI", None)
    return {**env, **extra}


class Lines:
    """A pipe's lines, read by a thread as they come; ``wait_for`` blocks until one
    matches (the test waits for what the worker says, never for a guessed time)."""

    def __init__(self, pipe: IO[str]) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._done = False
        self._thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self._thread.start()

    def _read(self, pipe: IO[str]) -> None:
        for line in pipe:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._done = True
            self._changed.notify_all()

    def wait_for(self, match: Callable[[list[str]], bool], timeout: float = 60.0) -> list[str]:
        with self._changed:
            assert self._changed.wait_for(lambda: match(self.lines) or self._done, timeout), (
                f"not seen in {timeout}s: {self.lines}"
            )
            assert match(self.lines), f"the pipe ended first: {self.lines}"
            return list(self.lines)

    def count(self, word: str) -> Callable[[list[str]], int]:
        return lambda lines: sum(line.startswith(word + " ") for line in lines)

    def close(self) -> list[str]:
        self._thread.join(30)
        return self.lines


class Command:
    """``leasekeeper worker ARGS`` running, its stdout and stderr read as they come."""

    def __init__(self, workdir: Path, env: dict[str, str], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "leasekeeper", "worker", *args],
            cwd=workdir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.out = Lines(self.proc.stdout)
        self.err = Lines(self.proc.stderr)

    def started(self, count: int) -> list[str]:
        return self.out.wait_for(lambda lines: self.out.count("start")(lines) >= count)

    def finish(self, timeout: float = 90.0) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.out.close()
            self.err.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def times(lines: list[str], word: str) -> list[float]:
    return [float(line.split()[2]) for line in lines if line.startswith(word + " ")]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def queue_counts(client: Any, url: str) -> tuple[int, int]:
    found = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(found["ApproximateNumberOfMessages"]), int(
        found["ApproximateNumberOfMessagesNotVisible"]
    )


# ------------------------------------------------------------------ ECS scale-in protection


def three_protected_jobs(
    moto_endpoint: str, queue_url: str, workdir: Path, cloud: CloudServer
) -> tuple[Command, int]:
    """Three 2 s jobs, one after another, under --scale-in-protection, to the end."""
    client = make_client(moto_endpoint)
    for i in range(3):
        client.send_message(QueueUrl=queue_url, MessageBody=f"job-{i}")
    command = Command(
        workdir,
        env_for(moto_endpoint, ECS_AGENT_URI=cloud.agent_uri),
        "jobs:two", "--sqs", queue_url, "--scale-in-protection", "--concurrency", "1",
        "--until-idle", "3", "--status-every", "0", *TIMING,
    )  # fmt: skip
    try:
        return command, command.finish()
    finally:
        command.stop()


def test_three_jobs_are_protected_before_the_first_and_unprotected_after_the_last(
    moto_endpoint: str, queue_url: str, workdir: Path, cloud: CloudServer
) -> None:
    client = make_client(moto_endpoint)
    command, code = three_protected_jobs(moto_endpoint, queue_url, workdir, cloud)
    err = "\n".join(command.err.lines)
    assert code == 0, err
    out = command.out.lines
    starts, ends = times(out, "start"), times(out, "done")
    assert len(starts) == len(ends) == 3, out  # one after another: concurrency 1
    puts = cloud.state.puts()
    assert 2 <= len(puts) <= 4, [p.body for p in puts]
    assert all(1 <= p.body["ExpiresInMinutes"] <= 2880 for p in puts), [p.body for p in puts]
    assert puts[0].body["ProtectionEnabled"] is True and puts[0].at < min(starts)
    assert puts[-1].body["ProtectionEnabled"] is False and puts[-1].at > max(ends)
    # Never unprotected while a job ran.
    for put in puts:
        if put.body["ProtectionEnabled"] is False:
            assert not any(s <= put.at <= e for s, e in zip(starts, ends, strict=True))
    assert "ECS scale-in protection: the task is protected" in err
    assert queue_counts(client, queue_url) == (0, 0)


def test_an_agent_answering_500_costs_at_most_two_warnings_and_the_jobs_run(
    moto_endpoint: str, queue_url: str, workdir: Path, cloud: CloudServer
) -> None:
    cloud.state.ecs_mode = "error"
    client = make_client(moto_endpoint)
    command, code = three_protected_jobs(moto_endpoint, queue_url, workdir, cloud)
    err = command.err.lines
    assert code == 0, err
    assert len(times(command.out.lines, "done")) == 3
    warnings = [line for line in err if " WARNING " in line and "scale-in protection" in line]
    assert 1 <= len(warnings) <= 2, err
    assert "HTTP 500: ServerException" in warnings[0]
    assert cloud.state.puts(), "the agent was asked"
    assert queue_counts(client, queue_url) == (0, 0)


def test_outside_ecs_scale_in_protection_says_so_and_works_on(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    client = make_client(moto_endpoint)
    client.send_message(QueueUrl=queue_url, MessageBody="only")
    command = Command(
        workdir,
        env_for(moto_endpoint),
        "jobs:two", "--sqs", queue_url, "--scale-in-protection",
        "--until-idle", "1", "--status-every", "0", *TIMING,
    )  # fmt: skip
    try:
        code = command.finish()
    finally:
        command.stop()
    err = command.err.lines
    assert code == 0, err
    said = [line for line in err if "ECS_AGENT_URI is not set" in line]
    assert len(said) == 1, err
    assert len(times(command.out.lines, "done")) == 1


# ------------------------------------------------------------------ probes


def test_probes_answer_and_readyz_turns_503_on_sigterm_while_the_job_finishes(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    client = make_client(moto_endpoint)
    client.send_message(QueueUrl=queue_url, MessageBody="long")
    port = free_port()
    probes = f"http://127.0.0.1:{port}"
    command = Command(
        workdir,
        env_for(moto_endpoint),
        "jobs:six", "--sqs", queue_url, "--health-port", str(port),
        "--health-addr", "127.0.0.1", "--status-every", "0", *TIMING,
    )  # fmt: skip
    try:
        command.started(1)  # receiving, and the job runs (6 s)
        live, ready = get(f"{probes}/livez"), get(f"{probes}/readyz")
        assert live[0] == 200 and "process renewer" in live[1], live
        assert ready == (200, "ok: receiving\n")
        command.proc.send_signal(signal.SIGTERM)
        command.err.wait_for(lambda lines: any("SIGTERM: stopping" in x for x in lines))
        draining, alive = get(f"{probes}/readyz"), get(f"{probes}/livez")
        assert command.proc.poll() is None and not times(command.out.lines, "done")
        code = command.finish()
    finally:
        command.stop()
    assert draining[0] == 503 and "draining" in draining[1], draining
    assert alive[0] == 200, alive
    assert code == 0, command.err.lines
    assert len(times(command.out.lines, "done")) == 1  # it finished
    assert queue_counts(client, queue_url) == (0, 0)  # and was deleted


# ------------------------------------------------------------------ interruption notices


def test_a_spot_notice_8s_ahead_gives_both_jobs_back_before_its_time(
    moto_endpoint: str, queue_url: str, workdir: Path, cloud: CloudServer
) -> None:
    client = make_client(moto_endpoint)
    for body in ("first", "second"):
        client.send_message(QueueUrl=queue_url, MessageBody=body)
    command = Command(
        workdir,
        env_for(moto_endpoint, AWS_EC2_METADATA_SERVICE_ENDPOINT=cloud.url),
        "jobs:twenty", "--sqs", queue_url, "--interruption-notice", "aws",
        "--concurrency", "4", "--status-every", "0", *TIMING,
    )  # fmt: skip
    back: dict[str, tuple[float, int]] = {}
    try:
        command.started(2)
        notice_at = time.time() + 8
        cloud.state.spot_action = {
            "action": "terminate",
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(notice_at)),
        }
        notice_at = float(int(notice_at))  # the notice says whole seconds
        command.err.wait_for(lambda lines: any("interruption notice:" in x for x in lines))
        client.send_message(QueueUrl=queue_url, MessageBody="after")  # must not be handled
        while len(back) < 3 and time.time() < notice_at + 10:
            got = client.receive_message(
                QueueUrl=queue_url,
                MaxNumberOfMessages=10,
                WaitTimeSeconds=1,
                VisibilityTimeout=60,
                AttributeNames=["ApproximateReceiveCount"],
            )
            for message in got.get("Messages", []):
                count = int(message["Attributes"]["ApproximateReceiveCount"])
                back[message["Body"]] = (time.time(), count)
        code = command.finish()
    finally:
        command.stop()
    err = command.err.lines
    assert code == 0, err
    assert set(back) == {"first", "second", "after"}, (back, err)
    assert back["first"][0] < notice_at and back["second"][0] < notice_at, (back, notice_at)
    # Received once by the worker, once here; the one sent after the notice was never
    # handled (a long poll out when it came gives what it brings back at once).
    assert back["first"][1] == back["second"][1] == 2 and back["after"][1] <= 2, back
    assert sorted(line.split()[1] for line in command.out.lines if line.startswith("start")) == [
        "first",
        "second",
    ]
    assert any("interruption notice: AWS spot instance-action terminate" in x for x in err), err
    # IMDSv2: a token asked for with its TTL, then sent with every read.
    calls = cloud.state.calls
    tokens = [c for c in calls if c.path == "/latest/api/token"]
    reads = [c for c in calls if c.path == "/latest/meta-data/spot/instance-action"]
    assert tokens and all(
        c.method == "PUT" and c.headers.get("X-aws-ec2-metadata-token-ttl-seconds") == "21600"
        for c in tokens
    )
    assert reads and all(
        c.headers.get("X-aws-ec2-metadata-token") in cloud.state.tokens for c in reads
    )


# ------------------------------------------------------------------ autoscaling signals


def test_backlog_every_2_with_20_queued_messages(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    client = make_client(moto_endpoint)
    for i in range(0, 20, 10):
        client.send_message_batch(
            QueueUrl=queue_url,
            Entries=[{"Id": str(n), "MessageBody": f"job-{n}"} for n in range(i, i + 10)],
        )
    port = free_port()
    metrics = f"http://127.0.0.1:{port}/metrics"
    command = Command(
        workdir,
        env_for(moto_endpoint),
        "jobs:two", "--sqs", queue_url, "--metrics-port", str(port), "--backlog-every", "2",
        "--concurrency", "4", "--status-every", "0", *TIMING,
    )  # fmt: skip

    def gauge(name: str, until: Callable[[float], bool], what: str) -> float:
        """The gauge once it reads what ``until`` wants (it is counted every 2 s)."""
        deadline = time.monotonic() + 30
        while True:
            text = get(metrics)[1]
            found = [line.split()[-1] for line in text.splitlines() if line.startswith(name)]
            if found and until(float(found[0])):
                return float(found[0])
            assert time.monotonic() < deadline, f"{what}: {found}"
            time.sleep(0.2)

    try:
        command.started(4)
        backlog = gauge("leasekeeper_queue_backlog_messages{", lambda _: True, "counted")
        assert 8 <= backlog <= 20
        busy = gauge("leasekeeper_worker_busy_ratio", lambda _: True, "busy")
        assert busy in (0.25, 0.5, 0.75, 1.0)  # of four handlers (1.0 unless one just ended)
        # Counted again as the worker works: two rounds of four done.
        command.out.wait_for(lambda lines: command.out.count("done")(lines) >= 8)
        gauge("leasekeeper_queue_backlog_messages{", lambda n: n < backlog, "counted again")
        command.proc.send_signal(signal.SIGTERM)
        code = command.finish()
    finally:
        command.stop()
    assert code == 0, command.err.lines
    with contextlib.suppress(Exception):
        client.purge_queue(QueueUrl=queue_url)
