"""``leasekeeper worker mod:fn --queue A --queue B --weights 3,1``: one worker on two
queues, run as a user runs it (a subprocess, on moto)."""

from __future__ import annotations

import subprocess
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.command.test_worker_command import command, env_for
from tests.services import make_client

pytestmark = pytest.mark.realtime

JOBS = textwrap.dedent(
    """
    import os
    from leasekeeper import current_lease

    def handle(message):
        queue = current_lease().message.backend.queue_url.rsplit("/", 1)[-1]
        os.write(1, f"did {queue} {message.body}\\n".encode())
    """
)


@pytest.fixture
def two_queues(moto_endpoint: str) -> Iterator[list[str]]:
    admin = make_client(moto_endpoint)
    urls = [
        admin.create_queue(QueueName=f"{kind}-{uuid.uuid4().hex[:8]}")["QueueUrl"]
        for kind in ("urgent", "bulk")
    ]
    yield urls
    for url in urls:
        admin.delete_queue(QueueUrl=url)


def test_two_queues_with_weights_run_each_job_once(
    moto_endpoint: str, two_queues: list[str], tmp_path: Path
) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    client = make_client(moto_endpoint)
    for url in two_queues:
        for n in range(6):
            client.send_message(QueueUrl=url, MessageBody=f"job{n}")
    urgent, bulk = two_queues
    result = subprocess.run(
        command(
            "jobs:handle",
            "--queue",
            urgent,
            "--queue",
            bulk,
            "--weights",
            "3,1",
            "--until-idle",
            "2",
            "--status-every",
            "0.5",
        ),
        cwd=tmp_path,
        env=env_for(moto_endpoint),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    done = sorted(result.stdout.split("\n")[:-1])
    names = [url.rsplit("/", 1)[-1] for url in two_queues]
    assert done == sorted(f"did {name} job{n}" for name in names for n in range(6))
    # The start line names both queues and their weights; the status line counts each.
    assert f"{names[0]} (weight 3)" in result.stderr and f"{names[1]} (weight 1)" in result.stderr
    assert f"{names[0]} 6/0, {names[1]} 6/0 done/failed" in result.stderr
    for url in two_queues:
        left = client.get_queue_attributes(
            QueueUrl=url, AttributeNames=["ApproximateNumberOfMessages"]
        )["Attributes"]["ApproximateNumberOfMessages"]
        assert left == "0"


@pytest.mark.parametrize(
    ("queues", "extra", "words"),
    [
        (2, ["--weights", "3"], "--weights 3 gives 1 weight(s) for 2 queues: give one a queue"),
        (2, ["--weights", "3,x"], "expected integers >= 1 separated by commas (3,1), got '3,x'"),
        # As typed, with or without "=": the value's own message, not argparse's
        # "expected one argument" (it takes "-1,1" for a flag).
        (2, ["--weights=-1,1"], "argument --weights: expected integers >= 1 separated by"),
        (2, ["--weights", "-1,1"], "expected integers >= 1 separated by commas (3,1), got '-1,1'"),
        (2, ["--weights", "0,1"], "expected integers >= 1 separated by commas (3,1), got '0,1'"),
        # One queue: refused, not ignored (the Python API raises on it too).
        (1, ["--weights", "3,1"], "--weights 3,1 shares the receives among several queues"),
    ],
)
def test_weights_that_do_not_fit_the_queues_exit_2(
    moto_endpoint: str,
    two_queues: list[str],
    tmp_path: Path,
    *,
    queues: int,
    extra: list[str],
    words: str,
) -> None:
    (tmp_path / "jobs.py").write_text(JOBS)
    given = [word for url in two_queues[:queues] for word in ("--queue", url)]
    result = subprocess.run(
        command("jobs:handle", *given, *extra),
        cwd=tmp_path,
        env=env_for(moto_endpoint),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("flag", ["--sqs", "--queue"])
def test_a_repeated_queue_flag_serves_every_queue(
    moto_endpoint: str, two_queues: list[str], tmp_path: Path, flag: str
) -> None:
    """``--sqs A --sqs B`` is one worker on both queues, as ``--queue A --queue B`` is
    (it served only B, silently)."""
    (tmp_path / "jobs.py").write_text(JOBS)
    client = make_client(moto_endpoint)
    for url in two_queues:
        client.send_message(QueueUrl=url, MessageBody="job")
    result = subprocess.run(
        command("jobs:handle", flag, two_queues[0], flag, two_queues[1], "--until-idle", "1"),
        cwd=tmp_path,
        env=env_for(moto_endpoint),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    names = [url.rsplit("/", 1)[-1] for url in two_queues]
    assert sorted(result.stdout.splitlines()) == sorted(f"did {name} job" for name in names)


def test_help_shows_several_queues_and_weights() -> None:
    result = subprocess.run(
        command("--help"), capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0
    assert "--queue URL [--queue URL ... [--weights W,W,...]]" in result.stdout
    assert "--weights W,W,..." in result.stdout and "Repeat it" in result.stdout


def test_each_repeated_queue_flag_names_one_queue_each() -> None:
    """What ``--mns E Q --mns E Q2``, ``--azure A --azure B`` and one ``--sqs`` give
    the backends' builder: one queue's flags each."""
    from leasekeeper.command._reach import each_queue, one_queue
    from leasekeeper.command.worker import parser

    def queues(*args: str) -> list[tuple[object, ...]]:
        parsed = parser().parse_args(["jobs:handle", *args])
        return [(one.sqs, one.mns, one.azure, one.queue) for one in each_queue(parsed)]

    endpoint = "http://127.0.0.1:9"
    assert queues("--mns", endpoint, "a", "--mns", endpoint, "b") == [
        (None, [endpoint, "a"], None, None),
        (None, [endpoint, "b"], None, None),
    ]
    assert queues("--azure", "a", "--azure", "b") == [
        (None, None, "a", None),
        (None, None, "b", None),
    ]
    assert queues("--sqs", "http://q/1/a") == [("http://q/1/a", None, None, None)]
    assert queues("--queue", "sqs://a", "--queue", "sqs://b") == [
        (None, None, None, ["sqs://a"]),
        (None, None, None, ["sqs://b"]),
    ]
    one = parser().parse_args(["jobs:handle", "--mns", endpoint, "a"])
    assert one_queue(one_queue(one)).mns == [endpoint, "a"]  # one queue's stays one
