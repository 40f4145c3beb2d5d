"""``leasekeeper send URL BODY... | -`` and ``leasekeeper stats URL``, run as a user
runs them (subprocesses), on every service the suite runs: moto (SQS, a FIFO queue,
a redrive policy), the local MNS server, Azurite and Redis. What a newcomer checks:
``send URL one two three`` queues three, and ``stats URL`` shows them."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from typing import Any

import pytest

from tests.command.test_worker_command import env_for
from tests.services import MNS_ACCESS_ID, MNS_ACCESS_KEY, free_port, make_client

pytestmark = pytest.mark.realtime


def leasekeeper(
    *args: str, env: dict[str, str], stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "leasekeeper", *args],
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def stats_of(url: str, env: dict[str, str], *extra: str) -> list[dict[str, Any]]:
    result = leasekeeper("stats", url, "--json", *extra, env=env)
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_send_three_then_stats_shows_them_on_sqs(moto_endpoint: str) -> None:
    env = env_for(moto_endpoint)
    name = f"send-{uuid.uuid4().hex[:8]}"
    admin = make_client(moto_endpoint)
    url = admin.create_queue(QueueName=name)["QueueUrl"]
    sent = leasekeeper("send", f"sqs://{name}", "one", "two", "three", env=env)
    assert sent.returncode == 0, sent.stderr
    ids = sent.stdout.split()
    assert len(ids) == 3 and len(set(ids)) == 3  # the new messages' ids, one a line
    assert sent.stderr.strip() == f"leasekeeper send: 3 message(s) sent to sqs://{name}"
    [row] = stats_of(f"sqs://{name}", env)
    assert (row["visible"], row["in_flight"], row["delayed"], row["total"]) == (3, 0, 0, 3)
    table = leasekeeper("stats", url, env=env)
    header, line = table.stdout.splitlines()
    assert header.split() == ["queue", "visible", "in", "flight", "delayed", "total"]
    assert line.split() == [url, "3", "0", "0", "3"]
    # Lines of stdin, with an attribute and a delay; empty lines are no message.
    more = leasekeeper(
        "send", url, "-", "--attribute", "kind=report", "--delay", "1", env=env, stdin="a\n\nb\n"
    )
    assert more.returncode == 0 and len(more.stdout.split()) == 2, more.stderr
    time.sleep(1.5)
    got = admin.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    bodies = {m["Body"]: m.get("MessageAttributes", {}) for m in got}
    assert bodies["a"]["kind"]["StringValue"] == "report" and "b" in bodies


def test_stats_shows_the_redrive_policys_dead_letter_queue(moto_endpoint: str) -> None:
    env = env_for(moto_endpoint)
    admin = make_client(moto_endpoint)
    suffix = uuid.uuid4().hex[:8]
    dead = admin.create_queue(QueueName=f"dead-{suffix}")["QueueUrl"]
    arn = admin.get_queue_attributes(QueueUrl=dead, AttributeNames=["QueueArn"])["Attributes"]
    policy = json.dumps({"deadLetterTargetArn": arn["QueueArn"], "maxReceiveCount": "3"})
    url = admin.create_queue(QueueName=f"live-{suffix}", Attributes={"RedrivePolicy": policy})[
        "QueueUrl"
    ]
    for body in ("x", "y"):
        admin.send_message(QueueUrl=dead, MessageBody=body)
    rows = stats_of(url, env)
    assert [(r["queue"], r["role"], r["found_by"], r["visible"]) for r in rows] == [
        (url, "", "", 0),
        (dead, "dead letters", "the redrive policy", 2),
    ]
    lines = leasekeeper("stats", url, env=env).stdout.splitlines()
    assert lines[2].split() == [dead, "(dead", "letters)", "2", "0", "0", "2"]


def test_a_fifo_queue_needs_a_group_and_gets_it(moto_endpoint: str) -> None:
    env = env_for(moto_endpoint)
    admin = make_client(moto_endpoint)
    name = f"ordered-{uuid.uuid4().hex[:8]}.fifo"
    url = admin.create_queue(QueueName=name, Attributes={"FifoQueue": "true"})["QueueUrl"]
    refused = leasekeeper("send", url, "x", env=env)
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"leasekeeper send: error: {url} is a FIFO queue: give each message a group (--group GROUP)"
    )
    sent = leasekeeper("send", url, "--group", "customer-42", "first", "second", env=env)
    assert sent.returncode == 0, sent.stderr
    got = admin.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, AttributeNames=["MessageGroupId"]
    )["Messages"]
    assert [(m["Body"], m["Attributes"]["MessageGroupId"]) for m in got] == [
        ("first", "customer-42"),
        ("second", "customer-42"),
    ]


def test_on_redis_with_a_dead_letter_stream_named(redis_url: str, moto_endpoint: str) -> None:
    env = env_for(moto_endpoint)
    stream = f"jobs-{uuid.uuid4().hex[:8]}"
    url = f"{redis_url}?stream={stream}&group=workers"
    sent = leasekeeper("send", url, "one", "two", "three", "-a", "kind=x", env=env)
    assert sent.returncode == 0, sent.stderr
    leasekeeper("send", f"{redis_url}?stream={stream}-dead&group=workers", "dead", env=env)
    rows = stats_of(url, env, "--dead-letter", f"{stream}-dead")
    assert [(r["visible"], r["in_flight"], r["delayed"]) for r in rows] == [(3, 0, 0), (1, 0, 0)]
    assert (rows[1]["role"], rows[1]["found_by"]) == ("dead letters", "--dead-letter")
    # The --group of SQS FIFO queues is refused here, with the reason.
    refused = leasekeeper("send", url, "--group", "g", "x", env=env)
    assert refused.returncode == 2 and "--group: for SQS FIFO queues" in refused.stderr


def test_on_mns(mns_server: Any, moto_endpoint: str) -> None:
    name = f"jobs-{uuid.uuid4().hex[:8]}"
    mns_server.create_queue(name)
    env = env_for(
        moto_endpoint, MNS_ACCESS_KEY_ID=MNS_ACCESS_ID, MNS_ACCESS_KEY_SECRET=MNS_ACCESS_KEY
    )
    url = f"mns://127.0.0.1:{mns_server.port}/{name}?secure=false"
    sent = leasekeeper("send", url, "one", "two", "three", env=env)
    assert sent.returncode == 0, sent.stderr
    [row] = stats_of(url, env)
    assert (row["visible"], row["in_flight"], row["delayed"], row["total"]) == (3, 0, 0, 3)


def test_on_azure_with_its_poison_queue(azurite: str, moto_endpoint: str) -> None:
    from azure.storage.queue import QueueClient

    env = env_for(moto_endpoint, AZURE_STORAGE_CONNECTION_STRING=azurite)
    name = f"jobs{uuid.uuid4().hex[:8]}"
    QueueClient.from_connection_string(azurite, name).create_queue()
    url = f"azure://devstoreaccount1/{name}"
    sent = leasekeeper("send", url, "one", "two", "three", env=env)
    assert sent.returncode == 0, sent.stderr
    [row] = stats_of(url, env)  # no <queue>-poison: no second row, and none made
    # Azure counts only a total (hidden messages included).
    assert (row["visible"], row["in_flight"], row["total"]) == (None, None, 3)
    poison = QueueClient.from_connection_string(azurite, f"{name}-poison")
    poison.create_queue()
    poison.send_message("dead")
    rows = stats_of(url, env)
    assert [(r["found_by"], r["total"]) for r in rows] == [("", 3), ("<queue>-poison", 1)]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["send", "memory://jobs", "x"], "'memory://jobs' is an in-memory queue: it lives only"),
        (["stats", "memory://jobs"], "'memory://jobs' is an in-memory queue"),
        (["send", "sqs://jobs", "-", "-"], "- (stdin) may be given once"),
        (["send", "sqs://jobs", "-a", "novalue", "x"], "--attribute 'novalue': give it as"),
        (
            ["stats", "redis://localhost:6379/0?stream=s", "--region", "eu-west-1"],
            "--region: for SQS queues",
        ),
    ],
)
def test_what_cannot_work_is_one_line_and_exit_2(
    args: list[str], words: str, moto_endpoint: str
) -> None:
    result = leasekeeper(*args, env=env_for(moto_endpoint))
    assert result.returncode == 2
    [line] = result.stderr.splitlines()
    assert line.startswith(f"leasekeeper {args[0]}: error: ") and words in line, line


def test_an_unreachable_queue_is_named_with_its_endpoint(moto_endpoint: str) -> None:
    port = free_port()
    env = env_for(moto_endpoint)
    del env["AWS_ENDPOINT_URL_SQS"]  # the URL's own origin is the endpoint
    started = time.monotonic()
    result = leasekeeper(
        "stats", f"http://127.0.0.1:{port}/000000000000/jobs", "--wait-for", "2", env=env
    )
    assert result.returncode == 2 and time.monotonic() - started < 30
    last = result.stderr.splitlines()[-1]
    assert last.startswith("leasekeeper stats: error: cannot reach the queue ")
    assert f"could not reach 127.0.0.1:{port} (" in last and "(tried for 2s)" in last


@pytest.mark.parametrize("command", ["send", "stats"])
def test_help_fits_a_terminal(command: str, moto_endpoint: str) -> None:
    env = {**env_for(moto_endpoint), "COLUMNS": "80"}
    result = leasekeeper(command, "--help", env=env)
    assert result.returncode == 0 and "URL" in result.stdout
    assert max(len(line) for line in result.stdout.splitlines()) < 80
