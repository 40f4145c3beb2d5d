"""``leasekeeper worker MODULE:HANDLER``, run as a user runs it: a subprocess.

The scenario of issue 15 on moto: 8 jobs of 3 s at a 2 s visibility timeout run
exactly once each while another consumer polls the queue, and SIGTERM ends the
command with exit code 0; for a plain handler (a Worker) and an async one (an
AsyncWorker). Then what a user gets wrong: every such error is one line on stderr
and exit code 2.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from leasekeeper import LeaseConfig
from tests.services import CHILD_ENV, MNS_ACCESS_ID, free_port, make_client

JOBS = textwrap.dedent(
    """
    import asyncio, os, time

    def _say(word, message):
        os.write(1, f"{word} {message.body}\\n".encode())

    def handle(message):
        _say("start", message)
        time.sleep(3)
        _say("done", message)

    async def handle_async(message):
        _say("start", message)
        await asyncio.sleep(3)
        _say("done", message)

    def quick(message):
        _say("did", message)

    def two_args(message, context):
        pass

    VALUE = 42
    """
)

# 2 s visibility renewed when 1.2 s remain (room for a late wake-up on a loaded machine).
TIMING = [
    "--visibility-timeout", "2", "--timer-interval", "0.2", "--minimal-life", "0.5",
    "--extend-threshold", "1.2",
]  # fmt: skip


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "jobs.py").write_text(JOBS)
    (tmp_path / "broken.py").write_text("raise RuntimeError('broken at import')\n")
    return tmp_path


@pytest.fixture
def queue_url(moto_endpoint: str) -> Iterator[str]:
    admin = make_client(moto_endpoint)
    url: str = admin.create_queue(
        QueueName=f"cmd-{uuid.uuid4().hex[:12]}", Attributes={"VisibilityTimeout": "2"}
    )["QueueUrl"]
    yield url
    with contextlib.suppress(admin.exceptions.QueueDoesNotExist):  # a test deleted it
        admin.delete_queue(QueueUrl=url)


def env_for(moto_endpoint: str, **extra: str) -> dict[str, str]:
    env = {**os.environ, **CHILD_ENV, "AWS_ENDPOINT_URL_SQS": moto_endpoint}
    for name in ("MNS_ACCESS_KEY_ID", "MNS_ACCESS_KEY_SECRET", "AZURE_STORAGE_CONNECTION_STRING"):
        env.pop(name, None)
    return {**env, **extra}


def command(*args: str) -> list[str]:
    return [sys.executable, "-m", "leasekeeper", "worker", *args]


def run_command(
    moto_endpoint: str, workdir: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``leasekeeper worker ARGS`` to its end."""
    return subprocess.run(
        command(*args),
        cwd=workdir,
        env=env_for(moto_endpoint) if env is None else env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Spy:
    """A second consumer polling the queue with its own client, from a thread."""

    def __init__(self, endpoint: str, url: str) -> None:
        self.client = make_client(endpoint)
        self.url = url
        self.received: list[str] = []
        self.polls = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            response = self.client.receive_message(
                QueueUrl=self.url, MaxNumberOfMessages=10, VisibilityTimeout=30, WaitTimeSeconds=1
            )
            self.polls += 1
            self.received += [m["Body"] for m in response.get("Messages", [])]

    def __enter__(self) -> Spy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.realtime
@pytest.mark.slow
@pytest.mark.parametrize(
    ("handler", "renewer"), [("jobs:handle", "thread"), ("jobs:handle_async", "process")]
)
def test_eight_jobs_of_3s_at_2s_run_once_each_and_sigterm_exits_0(
    moto_endpoint: str, queue_url: str, workdir: Path, handler: str, renewer: str
) -> None:
    client = make_client(moto_endpoint)
    bodies = [f"job-{i}" for i in range(8)]
    for body in bodies:
        client.send_message(QueueUrl=queue_url, MessageBody=body)
    proc = subprocess.Popen(
        command(
            handler,
            "--sqs",
            queue_url,
            "--concurrency",
            "8",
            "--renewer",
            renewer,
            "--status-every",
            "1",
            *TIMING,
        ),
        cwd=workdir,
        env=env_for(moto_endpoint),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        lines = [proc.stdout.readline().strip() for _ in range(8)]
        assert sorted(lines) == sorted(f"start {b}" for b in bodies), lines
        with Spy(moto_endpoint, queue_url) as spy:  # all 8 are leased and running now
            lines += [proc.stdout.readline().strip() for _ in range(8)]
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    lines += out.split()
    assert sorted(line for line in lines if line.startswith("done")) == sorted(
        f"done {b}" for b in bodies
    )
    assert sum(line.startswith("start") for line in lines) == 8  # once each
    assert spy.polls > 0 and spy.received == [], "a leased message reached another consumer"
    attributes = client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])
    counts = attributes["Attributes"]
    assert counts["ApproximateNumberOfMessages"] == "0"  # all deleted
    assert counts["ApproximateNumberOfMessagesNotVisible"] == "0"
    kind = "AsyncWorker" if handler.endswith("_async") else "Worker"
    assert f"{kind} running {handler}" in err and f"renewer {renewer}" in err
    status = [line for line in err.splitlines() if line.startswith("leasekeeper worker: in flight")]
    assert status and "done 8, failed 0, lost 0" in status[-1]
    assert "Traceback" not in err
    # The signal was said at once, at WARNING (what it waits for: nothing, here).
    assert "WARNING leasekeeper.worker: SIGTERM: stopping" in err


@pytest.mark.realtime
def test_until_idle_drains_and_exits_0(moto_endpoint: str, queue_url: str, workdir: Path) -> None:
    client = make_client(moto_endpoint)
    client.send_message(QueueUrl=queue_url, MessageBody="only")
    (workdir / "quick.py").write_text("def handle(message):\n    print('did', message.body)\n")
    script = Path(sys.executable).parent / "leasekeeper"  # the console script, as installed
    result = subprocess.run(
        [
            str(script),
            "worker",
            "quick:handle",
            "--sqs",
            queue_url,
            "--until-idle",
            "1",
            "--status-every",
            "0",
        ],
        cwd=workdir,
        env=env_for(moto_endpoint),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["did", "only"]


@pytest.mark.realtime
def test_a_queue_deleted_while_the_worker_runs_exits_1(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    client = make_client(moto_endpoint)
    client.send_message(QueueUrl=queue_url, MessageBody="first")
    proc = subprocess.Popen(
        command("jobs:quick", "--sqs", queue_url, "--status-every", "0"),
        cwd=workdir,
        env=env_for(moto_endpoint),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["did", "first"]  # it runs
        client.delete_queue(QueueUrl=queue_url)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, err
    assert "leasekeeper worker: stopped: the queue refused for good" in err


def test_an_unknown_queue_exits_2_before_any_receive(moto_endpoint: str, workdir: Path) -> None:
    missing = f"{moto_endpoint}/123456789012/no-such-queue-{uuid.uuid4().hex[:8]}"
    result = run_command(moto_endpoint, workdir, "jobs:handle", "--sqs", missing)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"leasekeeper worker: error: the queue {missing} cannot be used: ")
    assert "QueueDoesNotExist" in line and "check the queue URL, the region" in line


def test_an_unknown_queue_given_by_queue_is_named_by_its_url(
    moto_endpoint: str, workdir: Path
) -> None:
    there = f"{moto_endpoint}/123456789012/" + "there-" + uuid.uuid4().hex[:8]
    make_client(moto_endpoint).create_queue(QueueName=there.rsplit("/", 1)[1])
    missing = f"{moto_endpoint}/123456789012/no-such-queue-{uuid.uuid4().hex[:8]}"
    args = ("jobs:handle", "--queue", there, "--queue", missing)
    result = run_command(moto_endpoint, workdir, *args)
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"leasekeeper worker: error: the queue {missing} cannot be used: ")
    assert "QueueDoesNotExist" in line and "check the URL" in line


# ------------------------------------------------------------------ errors: exit 2, one line


def shadow_boto3(tmp_path: Path) -> str:
    """A directory for PYTHONPATH in which ``boto3`` is not installed: neither
    importable nor found (``importlib.util.find_spec``), as pip would leave it."""
    folder = tmp_path / "no-sdk"
    folder.mkdir(parents=True)
    (folder / "sitecustomize.py").write_text("import sys\n\nsys.modules['boto3'] = None\n")
    return str(folder)


BAD = {
    "no queue": (["jobs:handle"], "one of the arguments --sqs --mns --azure --queue is required"),
    "two queues": (
        ["jobs:handle", "--sqs", "http://q", "--azure", "q"],
        "not allowed with argument",
    ),
    "unknown flag": (["jobs:handle", "--sqs", "http://q", "--bogus"], "unrecognized arguments"),
    "not a number": (
        ["jobs:handle", "--sqs", "http://q", "--visibility-timeout", "soon"],
        "argument --visibility-timeout: expected a number > 0, got 'soon'",
    ),
    "not an integer": (
        ["jobs:handle", "--sqs", "http://q", "--concurrency", "2.5"],
        "argument --concurrency: expected an integer >= 1, got '2.5'",
    ),
    "bad config": (
        ["jobs:handle", "--sqs", "http://q", "--visibility-timeout", "2"],
        "--visibility-timeout (2) must exceed --timer-interval (1) + --minimal-life (2)",
    ),
    "bad renewer": (
        ["jobs:handle", "--sqs", "http://q", "--renewer", "fork"],
        "argument --renewer: invalid choice",
    ),
    "no colon": (["jobs.handle", "--sqs", "http://q"], "must be MODULE:HANDLER"),
    "no module": (["nosuch:handle", "--sqs", "http://q"], "no module named 'nosuch'"),
    "no attribute": (["jobs:nosuch", "--sqs", "http://q"], "module 'jobs' has no 'nosuch'"),
    "not callable": (["jobs:VALUE", "--sqs", "http://q"], "'jobs:VALUE' is an int, not a callable"),
    "negative concurrency": (
        ["jobs:handle", "--sqs", "http://q", "--concurrency", "-5"],
        "argument --concurrency: expected an integer >= 1, got '-5'",
    ),
    "zero concurrency": (
        ["jobs:handle", "--sqs", "http://q", "--concurrency", "0"],
        "argument --concurrency: expected an integer >= 1, got '0'",
    ),
    "two parameters": (
        ["jobs:two_args", "--sqs", "http://q"],
        "the handler 'jobs:two_args' cannot be called with one message: it takes "
        "(message, context) (missing a required argument: 'context'); give it one parameter",
    ),
    "mns credentials": (
        ["jobs:handle", "--mns", "http://127.0.0.1:9", "q"],
        "--mns needs MNS_ACCESS_KEY_ID and MNS_ACCESS_KEY_SECRET in the environment",
    ),
    "azure credentials": (
        ["jobs:handle", "--azure", "q"],
        "--azure needs AZURE_STORAGE_CONNECTION_STRING in the environment",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_usage_error_is_one_line_and_exit_2(case: str, moto_endpoint: str, workdir: Path) -> None:
    args, expected = BAD[case]
    result = subprocess.run(
        command(*args),
        cwd=workdir,
        env=env_for(moto_endpoint),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("leasekeeper worker: error: ") and expected in lines[0]


def test_a_setting_beyond_the_queues_limit_is_named_by_its_flag(
    moto_endpoint: str, workdir: Path
) -> None:
    args = ["jobs:handle", "--queue", "memory://jobs", "--visibility-timeout", "50000"]
    result = run_command(moto_endpoint, workdir, *args)
    assert result.returncode == 2
    last = result.stderr.splitlines()[-1]
    assert last.startswith(
        "leasekeeper worker: error: --visibility-timeout (50000) exceeds the backend's "
        "max_visibility (43200)"
    )
    assert "visibility_timeout (" not in last  # the flag as typed, not the Python name


def test_a_missing_sdk_is_one_line_and_exit_2(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    env = env_for(moto_endpoint, PYTHONPATH=shadow_boto3(workdir))
    result = subprocess.run(
        command("jobs:handle", "--sqs", queue_url),
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "leasekeeper worker: error: leasekeeper.backends.sqs needs boto3, which is not "
        "installed: pip install 'boto3>=1.34' (what leasekeeper's sqs extra brings)"
    ]


def test_an_import_failure_shows_where_it_failed(moto_endpoint: str, workdir: Path) -> None:
    """The handler's module imports a helper that fails on its line 2: the error says
    so, with the frames of the user's code (file and line), importlib's left out."""
    (workdir / "failing.py").write_text("import helper\n\ndef handle(message):\n    pass\n")
    (workdir / "helper.py").write_text('CONFIG = {}\nTIMEOUT = CONFIG["timeout"]\n')
    result = run_command(moto_endpoint, workdir, "failing:handle", "--sqs", "http://q")
    assert result.returncode == 2
    first, *frames = result.stderr.splitlines()
    assert first == "leasekeeper worker: error: importing 'failing' failed: KeyError: 'timeout'"
    text = "\n".join(frames)
    assert f'File "{workdir / "failing.py"}", line 1, in <module>' in text
    assert f'File "{workdir / "helper.py"}", line 2, in <module>' in text
    assert 'TIMEOUT = CONFIG["timeout"]' in text
    assert "importlib" not in text and "leasekeeper" not in text.replace(str(workdir), "")
    broken = run_command(moto_endpoint, workdir, "broken:handle", "--sqs", "http://q")
    assert broken.returncode == 2
    assert "importing 'broken' failed: RuntimeError: broken at import" in broken.stderr
    assert f'File "{workdir / "broken.py"}", line 1' in broken.stderr
    (workdir / "typo.py").write_text("def handle(message):\n    return (\n")
    typo = run_command(moto_endpoint, workdir, "typo:handle", "--sqs", "http://q")
    assert typo.returncode == 2 and "SyntaxError" in typo.stderr
    assert f'File "{workdir / "typo.py"}", line 2' in typo.stderr


def test_metrics_port_serves_the_worker_s_leases(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    client = make_client(moto_endpoint)
    for i in range(3):
        client.send_message(QueueUrl=queue_url, MessageBody=f"job-{i}")
    port = free_port()
    proc = subprocess.Popen(
        command(
            "jobs:handle",
            "--sqs",
            queue_url,
            "--metrics-port",
            str(port),
            "--metrics-addr",
            "127.0.0.1",
            *TIMING,
        ),
        cwd=workdir,
        env=env_for(moto_endpoint),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        started = [proc.stdout.readline() for _ in range(3)]  # every job is running (3 s)
        assert all(line.startswith("start ") for line in started), started
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            scraped = answer.read().decode()
        in_flight = [
            line for line in scraped.splitlines() if line.startswith("leasekeeper_leases_in_flight")
        ]
        assert in_flight == ["leasekeeper_leases_in_flight 3.0"], scraped
        assert "leasekeeper_leases_registered_total 3.0" in scraped
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err


def test_metrics_port_is_checked_first(moto_endpoint: str, queue_url: str, workdir: Path) -> None:
    result = subprocess.run(
        command("jobs:handle", "--sqs", queue_url, "--metrics-port", "0", "--until-idle", "0.5"),
        cwd=workdir,
        env=env_for(moto_endpoint),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2 and "expected an integer >= 1, got '0'" in result.stderr


def test_metrics_port_without_the_extra_says_what_it_needs(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    hidden = workdir / "hidden" / "prometheus_client"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text(
        "raise ImportError(\"No module named 'prometheus_client'\")\n"
    )
    result = subprocess.run(
        command("jobs:handle", "--sqs", queue_url, "--metrics-port", "9999", "--until-idle", "0.5"),
        cwd=workdir,
        env=env_for(moto_endpoint, PYTHONPATH=str(workdir / "hidden")),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    # The hint once, naming a command that works (leasekeeper is not on PyPI).
    assert line == (
        "leasekeeper worker: error: --metrics-port: leasekeeper.prometheus needs "
        "prometheus_client: pip install 'prometheus-client>=0.20' (what leasekeeper's "
        "prometheus extra brings)"
    )


# ------------------------------------------------------------------ --help


def test_help_reads_like_a_man_page() -> None:
    result = subprocess.run(
        command("--help"), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0
    text = result.stdout
    for section in ("usage:", "queue (one kind of flag", "lease settings", "environment:",
                    "exit status:", "example:"):  # fmt: skip
        assert section in text
    for flag in ("--sqs QUEUE_URL", "--mns ENDPOINT QUEUE", "--azure QUEUE", "--concurrency",
                 "--renewer", "--log-level", "--status-every", "--metrics-port",
                 "--metrics-addr"):  # fmt: skip
        assert flag in text
    for variable in ("AWS_ENDPOINT_URL_SQS", "MNS_ACCESS_KEY_ID", "AZURE_STORAGE_CONNECTION_STRING",
                     "AZURE_STORAGE_ACCOUNT_URL"):  # fmt: skip
        assert variable in text
    lines = text.splitlines()
    for field in dataclasses.fields(LeaseConfig):
        flag = "--" + field.name.replace("_", "-")
        (at,) = [i for i, line in enumerate(lines) if line.startswith(f"  {flag} ")]
        explained = " ".join(lines[at : at + 2]).split(flag, 1)[1]
        assert len(explained.split()) > 4, f"{flag} is not explained"


def test_leasekeeper_help_lists_the_worker_command() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "leasekeeper", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0 and "worker" in result.stdout


@pytest.mark.realtime
def test_refused_credentials_exit_2_and_are_never_shown(
    moto_endpoint: str, mns_server: Any, workdir: Path
) -> None:
    """A secret that the service refuses stops the command before anything is
    received (exit 2, one line) without ever showing it, even at debug level."""
    name = f"cmd-{uuid.uuid4().hex[:12]}"
    mns_server.create_queue(name)
    secret = "s3cr3t-" + uuid.uuid4().hex
    env = env_for(moto_endpoint, MNS_ACCESS_KEY_ID=MNS_ACCESS_ID, MNS_ACCESS_KEY_SECRET=secret)
    result = subprocess.run(
        command("jobs:handle", "--mns", mns_server.endpoint, name, "--log-level", "debug"),
        cwd=workdir,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert (
        len(errors) == 1 and f"the queue {mns_server.endpoint} {name} cannot be used" in errors[0]
    )
    assert "MNS_ACCESS_KEY_ID" in errors[0]
    assert secret not in result.stdout + result.stderr


# ------------------------------------------------------------------ SQS: credentials, region


def without_aws_settings(moto_endpoint: str, **extra: str) -> dict[str, str]:
    """The environment of a machine with no AWS credentials, region or endpoint set."""
    env = env_for(moto_endpoint)
    for name in list(env):
        if name.startswith("AWS_"):
            del env[name]
    return {
        **env,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
        **extra,
    }


def test_no_credentials_exit_2_naming_the_variables(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    env = without_aws_settings(moto_endpoint, AWS_REGION="us-east-1")
    result = run_command(moto_endpoint, workdir, "jobs:handle", "--sqs", queue_url, env=env)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "leasekeeper worker: error: --sqs found no AWS credentials: set AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN for temporary ones), or AWS_PROFILE for "
        "a profile of ~/.aws/credentials"
    ]


@pytest.mark.realtime
def test_aws_region_and_endpoint_url_are_honoured(moto_endpoint: str, workdir: Path) -> None:
    """The queue exists in eu-west-1 only; AWS_DEFAULT_REGION says us-east-1, and the
    endpoint comes from --endpoint-url alone."""
    eu = boto3_client(moto_endpoint, "eu-west-1")
    url = eu.create_queue(QueueName=f"cmd-eu-{uuid.uuid4().hex[:12]}")["QueueUrl"]
    try:
        eu.send_message(QueueUrl=url, MessageBody="in-eu")
        env = without_aws_settings(
            moto_endpoint,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing",
            AWS_REGION="eu-west-1",
            AWS_DEFAULT_REGION="us-east-1",
        )
        result = run_command(
            moto_endpoint, workdir, "jobs:quick", "--sqs", url, "--endpoint-url", moto_endpoint,
            "--until-idle", "0.5", "--status-every", "0", env=env,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["did", "in-eu"]
    finally:
        eu.delete_queue(QueueUrl=url)


def boto3_client(endpoint: str, region: str) -> Any:
    import boto3

    return boto3.client(
        "sqs",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.mark.parametrize(
    ("flags", "environment", "region"),
    [
        (["--region", "ap-south-1"], {"AWS_REGION": "eu-west-1"}, "ap-south-1"),
        ([], {"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-east-1"}, "eu-west-1"),
        ([], {"AWS_DEFAULT_REGION": "us-east-2"}, "us-east-2"),
        ([], {}, None),  # the AWS configuration files decide
    ],
)
def test_the_region_comes_from_the_flag_then_aws_region_then_aws_default_region(
    monkeypatch: pytest.MonkeyPatch, flags: list[str], environment: dict[str, str], region: Any
) -> None:
    from leasekeeper.command.worker import parser, sqs_region

    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    args = parser().parse_args(["jobs:handle", "--sqs", "http://127.0.0.1:9/1/q", *flags])
    assert sqs_region(args) == region
    aws = parser().parse_args(["j:h", "--sqs", "https://sqs.sa-east-1.amazonaws.com/1/q"])
    assert sqs_region(aws) == "sa-east-1"  # the queue lives where its URL says


# ------------------------------------------------------------------ numbers, --version


def test_every_bad_number_gets_the_same_message(capsys: pytest.CaptureFixture[str]) -> None:
    from leasekeeper.command.worker import main

    for flag in ("--concurrency", "--batch-size", "--metrics-port", "--max-concurrency"):
        for bad in ("-5", "0", "2.5", "many", "1e999"):
            with pytest.raises(SystemExit) as exited:
                main(["jobs:handle", "--sqs", "http://q", flag, bad])
            assert exited.value.code == 2
            [line] = capsys.readouterr().err.splitlines()
            assert f"argument {flag}: expected an integer >= 1, got '{bad}'" in line
    for flag in ("--visibility-timeout", "--timer-interval", "--until-idle"):
        for bad in ("-5", "0", "nan", "inf", "soon"):
            with pytest.raises(SystemExit):
                main(["jobs:handle", "--sqs", "http://q", flag, bad])
            assert f"argument {flag}: expected a number > 0, got '{bad}'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["jobs:handle", "--sqs", "http://q", "--extend-threshold", "soon"])
    assert "expected a number > 0 or 'auto', got 'soon'" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--version"], ["worker", "--version"]])
def test_version(args: list[str]) -> None:
    from leasekeeper import __version__

    result = subprocess.run(
        [sys.executable, "-m", "leasekeeper", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout) == (0, f"leasekeeper {__version__}\n")


@pytest.mark.parametrize("args", [["--help"], ["worker", "--help"], ["config", "--help"]])
def test_help_is_plain_text_for_a_terminal(args: list[str]) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "leasekeeper", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert result.returncode == 0
    for markup in ("``", ":class:", ":func:", ":meth:", "`_"):
        assert markup not in result.stdout
    assert not re.search(r"^\s*\.\. \w+::", result.stdout, re.MULTILINE)  # no directives
    assert "%%" not in result.stdout  # argparse's escape of a "%", escaped once only
    assert max(len(line) for line in result.stdout.splitlines()) < 80  # an 80-column terminal


def test_no_region_anywhere_is_a_usage_error_naming_the_ways_to_give_one(
    monkeypatch: pytest.MonkeyPatch, moto_endpoint: str
) -> None:
    from leasekeeper.command.worker import UsageError, build_backend, parser

    for name, value in without_aws_settings(moto_endpoint).items():
        monkeypatch.setenv(name, value)
    for name in [n for n in os.environ if n.startswith("AWS_") and n not in ("AWS_CONFIG_FILE",
                 "AWS_SHARED_CREDENTIALS_FILE", "AWS_EC2_METADATA_DISABLED")]:  # fmt: skip
        monkeypatch.delenv(name)
    args = parser().parse_args(["jobs:handle", "--sqs", f"{moto_endpoint}/123456789012/q"])
    with pytest.raises(
        UsageError, match="--sqs found no AWS region: pass --region, or set AWS_REGION"
    ):
        build_backend(args)


LEASED_JOBS = textwrap.dedent(
    """
    import os
    from leasekeeper import leased

    @leased
    def handle(message):
        os.write(1, f"did {message.body}\\n".encode())

    def poison(message):
        raise RuntimeError("always fails")
    """
)


def test_a_leased_handler_runs_once_and_each_message_is_deleted_once(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    (workdir / "decorated.py").write_text(LEASED_JOBS)
    client = make_client(moto_endpoint)
    for n in range(3):
        client.send_message(QueueUrl=queue_url, MessageBody=f"job-{n}")
    result = run_command(
        moto_endpoint,
        workdir,
        "decorated:handle",
        "--sqs",
        queue_url,
        "--until-idle",
        "1.5",
        "--status-every",
        "0",
        *TIMING,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.split()[1::2]) == ["job-0", "job-1", "job-2"]
    assert "is @leased" in result.stderr  # the one INFO line
    assert "lost" not in result.stderr.lower()  # no second delete counted lost


def test_max_receives_and_dead_letter_move_a_poison_message(
    moto_endpoint: str, queue_url: str, workdir: Path
) -> None:
    (workdir / "decorated.py").write_text(LEASED_JOBS)
    client = make_client(moto_endpoint)
    dead_name = f"cmd-dead-{uuid.uuid4().hex[:8]}"
    client.send_message(QueueUrl=queue_url, MessageBody="poison")
    result = run_command(
        moto_endpoint,
        workdir,
        "decorated:poison",
        "--sqs",
        queue_url,
        "--max-receives",
        "2",
        "--dead-letter",
        dead_name,
        "--release-delay",
        "0.1",
        "--until-idle",
        "1.5",
        "--status-every",
        "0",
        *TIMING,
    )
    assert result.returncode == 0, result.stderr
    dead_url = client.get_queue_url(QueueName=dead_name)["QueueUrl"]
    try:
        got = client.receive_message(QueueUrl=dead_url, WaitTimeSeconds=1)
        assert [m["Body"] for m in got.get("Messages", [])] == ["poison"]
        left = client.receive_message(QueueUrl=queue_url, WaitTimeSeconds=0)
        assert left.get("Messages", []) == []
    finally:
        client.delete_queue(QueueUrl=dead_url)
    failures = [line for line in result.stderr.splitlines() if "handler failed" in line]
    assert len(failures) == 2 and "dead-letter" in failures[-1]
