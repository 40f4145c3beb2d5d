"""drain() on PySpark local mode against moto's SQS server."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from leasekeeper import LeaseConfig, Message
from leasekeeper.spark import SQSSource, run_drain
from tests.helpers import hold_the_gil
from tests.services import free_port
from tests.sqs.conftest import make_client

pytestmark = pytest.mark.slow

VISIBILITY = 2
CONFIG = LeaseConfig(
    visibility_timeout=VISIBILITY, timer_interval=0.2, minimal_life=0.5, release_delay=120
)
# Two rounds of 4 tasks x 10 handlers: each job is renewed past its timeout, and a
# second round runs on Python workers (and managers) that the first one left.
LONG_JOBS = 80


def fill(client: Any, url: str, n: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, 10):
        entries = [
            {"Id": str(i), "MessageBody": f"job-{start + i:04d}"} for i in range(min(10, n - start))
        ]
        answer = client.send_message_batch(QueueUrl=url, Entries=entries)
        ids += [entry["MessageId"] for entry in answer["Successful"]]
    return ids


def queue_depth(client: Any, url: str) -> int:
    attributes = client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def journal(path: Path) -> Callable[[Message], None]:
    """A picklable recorder of handler runs, appended to a file (executors are processes)."""
    target = str(path)

    def record(message: Message) -> None:
        with open(target, "a") as f:  # O_APPEND: one short line is written atomically
            f.write(f"{message.id} {message.receive_count} {os.getpid()}\n")

    return record


def runs(path: Path) -> Counter[str]:
    return Counter(line.split()[0] for line in path.read_text().splitlines())


def test_long_jobs_are_completed_and_every_rerun_is_on_record(
    spark: Any, moto_endpoint: str, make_queue: Any, tmp_path: Path
) -> None:
    # On an idle machine every job runs once. Under heavy load a renewal can come too
    # late (a lapse: the lease is lost, rule 5) and the message runs again; then the
    # output must say so - every run leaves its row - and nothing is lost.
    client = make_client(moto_endpoint)
    url = make_queue(VISIBILITY)
    sent = fill(client, url, LONG_JOBS)
    record = journal(tmp_path / "runs.log")

    def handler(message: Message) -> dict[str, str]:
        record(message)
        time.sleep(3 * VISIBILITY)  # 3x the visibility timeout
        return {"body": str(message.body)}

    result = run_drain(
        spark,
        SQSSource(url, region="us-east-1", endpoint_url=moto_endpoint),
        handler,
        output=str(tmp_path / "out"),
        partitions=4,
        config=CONFIG,
        idle_seconds=3,
    )
    rows = result.frame.collect()
    assert len(rows) == LONG_JOBS
    assert sorted(r["id"] for r in rows) == sorted(sent)
    assert {r["status"] for r in rows} == {"completed"}
    assert all(r["output"].startswith('{"body": "job-') for r in rows)
    assert queue_depth(client, url) == 0
    report = result.report
    assert (report.completed, report.released, report.lost) == (LONG_JOBS, 0, 0)
    handled = runs(tmp_path / "runs.log")
    assert set(handled) == set(sent)
    # Every run of a handler left exactly one row (the result counts them as attempts).
    assert {r["id"]: r["attempts"] for r in rows} == dict(handled)
    once = [r for r in rows if r["attempts"] == 1]
    # A job that ran once was renewed past its 2 s timeout while it ran 6 s.
    assert all(r["extensions"] >= 2 for r in once)
    print(f"\n{LONG_JOBS - len(once)} of {LONG_JOBS} jobs ran more than once (lapses under load)")


def test_a_process_renewer_renews_through_handlers_that_hold_the_gil(
    spark: Any, moto_endpoint: str, make_queue: Any, tmp_path: Path
) -> None:
    # Each handler holds its Python worker's GIL for 1.5x the visibility timeout, as a
    # big regex or a pandas call does: a renewer thread in that process could not run
    # (the lease would lapse and be lost); the renewer process beside it does.
    client = make_client(moto_endpoint)
    url = make_queue(VISIBILITY)
    sent = fill(client, url, 6)
    record = journal(tmp_path / "runs.log")

    def handler(message: Message) -> str:
        record(message)
        hold_the_gil(1.5 * VISIBILITY)
        return "ok"

    result = run_drain(
        spark,
        SQSSource(url, region="us-east-1", endpoint_url=moto_endpoint),
        handler,
        output=str(tmp_path / "out"),
        partitions=2,
        batch_size=3,
        config=CONFIG,
        idle_seconds=2,
        renewer="process",
    )
    rows = result.frame.collect()
    assert sorted(r["id"] for r in rows) == sorted(sent)
    assert {r["status"] for r in rows} == {"completed"}
    # Held 3 s at a 2 s timeout, every message was received once: renewed meanwhile.
    # (Its row's extension count may lag: the renewer's notices reach the worker
    # when its GIL is free, and the row is written before the delete.)
    assert all(r["attempts"] == 1 and r["receive_count"] == 1 for r in rows), rows
    handled = runs(tmp_path / "runs.log")
    assert len(handled) == 6 and max(handled.values()) == 1, "a message was handled twice"
    assert queue_depth(client, url) == 0


def renewer_children() -> list[int]:
    """The renewer processes this process started (``leasekeeper.renewers._main``)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                ppid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError):
            continue
        if ppid == os.getpid() and b"leasekeeper.renewers._main" in command:
            found.append(int(entry))
    return found


def test_an_executor_s_renewer_process_that_dies_is_replaced_and_loses_nothing(
    spark: Any, moto_endpoint: str, make_queue: Any, tmp_path: Path
) -> None:
    """Each Python worker's renewer process (the default, ``renewer="auto"``) is
    SIGKILLed at the first job it renews, as the OOM killer would, and the jobs run
    on for 1.5 visibility timeouts: a new renewer process takes their leases over,
    every job runs once and completes, none is lost."""
    visibility = 6
    config = LeaseConfig(
        visibility_timeout=visibility, timer_interval=0.5, minimal_life=1.0, release_delay=120
    )
    client = make_client(moto_endpoint)
    url = make_queue(visibility)
    sent = fill(client, url, 6)
    record = journal(tmp_path / "runs.log")
    kills = str(tmp_path / "kills")
    os.mkdir(kills)

    def handler(message: Message) -> str:
        record(message)
        try:  # once a Python worker: the first of its jobs to get here
            flag = os.open(f"{kills}/{os.getpid()}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            renewers = renewer_children()
            for pid in renewers:
                os.kill(pid, signal.SIGKILL)
            os.write(flag, str(len(renewers)).encode())
            os.close(flag)
        time.sleep(1.5 * visibility)
        return "ok"

    result = run_drain(
        spark,
        SQSSource(url, region="us-east-1", endpoint_url=moto_endpoint),
        handler,
        output=str(tmp_path / "out"),
        partitions=2,
        batch_size=3,
        config=config,
        idle_seconds=2,
    )
    killed = [int(Path(kills, name).read_text()) for name in os.listdir(kills)]
    # (each Python worker's: this drain's, and any an earlier drain's manager still
    # holding leases keeps there)
    assert killed and all(n >= 1 for n in killed), f"renewer processes killed: {killed}"
    rows = result.frame.collect()
    assert sorted(r["id"] for r in rows) == sorted(sent)
    assert {r["status"] for r in rows} == {"completed"}
    assert all(r["attempts"] == 1 and r["receive_count"] == 1 for r in rows), rows
    handled = runs(tmp_path / "runs.log")
    assert len(handled) == 6 and max(handled.values()) == 1, "a message was handled twice"
    assert result.report.lost == 0
    assert queue_depth(client, url) == 0


def test_dead_python_workers_messages_are_taken_over(
    spark: Any, moto_endpoint: str, make_queue: Any, tmp_path: Path
) -> None:
    client = make_client(moto_endpoint)
    url = make_queue(VISIBILITY)
    fill(client, url, 200)
    doomed = {f"job-{n:04d}" for n in (3, 57, 101, 150, 199)}

    def handler(message: Message) -> str:
        if message.body in doomed and message.receive_count == 1:
            os._exit(13)  # the Python worker dies mid-message, leases and all
        time.sleep(0.2)
        return "ok"

    result = run_drain(
        spark,
        SQSSource(url, region="us-east-1", endpoint_url=moto_endpoint),
        handler,
        output=str(tmp_path / "out"),
        partitions=4,
        config=CONFIG,
        idle_seconds=4,
    )
    rows = {r["id"]: r for r in result.frame.collect()}
    assert len(rows) == 200
    assert {r["status"] for r in rows.values()} == {"completed"}
    bodies = {r["id"]: r for r in rows.values()}
    retried = [r for r in bodies.values() if r["receive_count"] >= 2]
    assert len(retried) >= 5  # the 5 doomed ones at least (their batch-mates may lapse too)
    assert queue_depth(client, url) == 0


def test_failing_handlers_release_and_keep_their_messages(
    spark: Any, moto_endpoint: str, make_queue: Any, tmp_path: Path
) -> None:
    client = make_client(moto_endpoint)
    url = make_queue(VISIBILITY)
    fill(client, url, 200)
    failing = {f"job-{n:04d}" for n in range(0, 200, 20)}

    def handler(message: Message) -> int:
        if message.body in failing:
            raise ValueError(f"cannot handle {message.body}")
        return 1

    result = run_drain(
        spark,
        SQSSource(url, region="us-east-1", endpoint_url=moto_endpoint),
        handler,
        output=str(tmp_path / "out"),
        partitions=4,
        config=CONFIG,
        idle_seconds=2,
    )
    rows = result.frame.collect()
    released = [r for r in rows if r["status"] == "released"]
    assert len(rows) == 200 and len(released) == 10
    assert all(r["error"].startswith("ValueError: cannot handle job-") for r in released)
    assert queue_depth(client, url) == 10  # still there, released with a long delay
    assert result.report.released == 10 and result.report.completed == 190


def test_drain_on_the_local_mns_server(spark: Any, mns_server: Any, tmp_path: Path) -> None:
    """The same drain code on Aliyun MNS: long jobs, failures, one row per message."""
    from mns.account import Account
    from mns.queue import Message as MNSMessage

    from leasekeeper.spark import MNSSource
    from tests.mns.conftest import ACCESS_ID, ACCESS_KEY

    name = f"drain-{os.getpid()}"
    mns_server.create_queue(name, visibility_timeout=VISIBILITY)
    queue = Account(mns_server.endpoint, ACCESS_ID, ACCESS_KEY).get_queue(name)
    for n in range(60):
        queue.send_message(MNSMessage(f"job-{n:04d}"))
    record = journal(tmp_path / "runs.log")

    def handler(message: Message) -> str:
        record(message)
        time.sleep(1.5 * VISIBILITY)
        if message.body == "job-0007":
            raise RuntimeError("unlucky seven")
        return str(message.body)

    result = run_drain(
        spark,
        MNSSource(mns_server.endpoint, name),
        handler,
        output=str(tmp_path / "out"),
        partitions=2,
        config=CONFIG,
        idle_seconds=3,
    )
    rows = result.frame.collect()
    assert len(rows) == 60
    assert Counter(r["status"] for r in rows) == {"completed": 59, "released": 1}
    assert max(runs(tmp_path / "runs.log").values()) == 1, "a message was handled twice"
    stats = mns_server.queue_stats(name)
    assert stats.visible + stats.in_flight + stats.delayed == 1  # only the released one


def test_drain_a_queue_by_url_on_redis_streams(spark: Any, redis_url: str, tmp_path: Path) -> None:
    """``drain(queue=URL)``: executors build the backend from the URL alone."""
    import leasekeeper
    from leasekeeper.spark import drain

    url = f"{redis_url}?stream=drain-{os.getpid()}&group=g&visibility_timeout={VISIBILITY}"
    producer = leasekeeper.connect(url, consumer="producer")
    for n in range(30):
        producer.send(f"job-{n:04d}")  # type: ignore[attr-defined]
    record = journal(tmp_path / "runs.log")

    def handler(message: Message) -> str:
        record(message)
        time.sleep(1.5 * VISIBILITY)  # renewed meanwhile
        return str(message.body)

    frame = drain(
        spark,
        queue=url,
        handler=handler,
        output=str(tmp_path / "out"),
        partitions=2,
        config=CONFIG,
        idle_seconds=3,
        batch_size=15,
    )
    rows = frame.collect()
    assert sorted(r["output"] for r in rows) == sorted(f'"job-{n:04d}"' for n in range(30))
    assert {r["status"] for r in rows} == {"completed"}
    assert max(runs(tmp_path / "runs.log").values()) == 1, "a message was handled twice"
    assert producer.receive() == []  # every entry acknowledged and deleted


def test_a_fifo_queue_is_drained_in_each_groups_order(
    spark: Any, moto_endpoint: str, make_queue: Any, tmp_path: Path
) -> None:
    """Two tasks on a FIFO queue of three groups: each group's messages run one at a
    time, in order; a failure mid-group sends the rest of the group back with it, and
    nothing later of the group runs before its retry."""
    client = make_client(moto_endpoint)
    url = make_queue(30, fifo=True)
    bodies = [f"{group}:{index}" for group in "abc" for index in range(6)]
    for start in range(0, len(bodies), 10):
        client.send_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(n), "MessageBody": body, "MessageGroupId": body[0]}
                for n, body in enumerate(bodies[start : start + 10])
            ],
        )
    target = str(tmp_path / "runs.log")

    def handler(message: Message) -> str:
        with open(target, "a") as f:  # O_APPEND: executors are processes
            f.write(f"begin {message.body} {message.receive_count}\n")
        time.sleep(0.05)
        ok = not (message.body == "b:2" and message.receive_count == 1)
        with open(target, "a") as f:
            f.write(f"{'end' if ok else 'failed'} {message.body} {message.receive_count}\n")
        if not ok:
            raise ValueError("the first try of b:2 fails")
        return str(message.group)

    result = run_drain(
        spark,
        SQSSource(url, region="us-east-1", endpoint_url=moto_endpoint),
        handler,
        output=str(tmp_path / "out"),
        partitions=2,
        config=LeaseConfig(visibility_timeout=30, release_delay=0.5, release_backoff=1.0),
        idle_seconds=4,
    )
    events = [line.split() for line in Path(target).read_text().splitlines()]
    began = {
        g: [int(b[2:]) for kind, b, _ in events if kind == "begin" and b[0] == g] for g in "abc"
    }
    done = {g: [int(b[2:]) for kind, b, _ in events if kind == "end" and b[0] == g] for g in "abc"}
    assert done == {group: list(range(6)) for group in "abc"}
    assert began["b"] == [0, 1, 2, 2, 3, 4, 5] and began["a"] == began["c"] == list(range(6))
    active: Counter[str] = Counter()
    for kind, body, _ in events:  # never two of a group at once, in either task
        active[body[0]] += 1 if kind == "begin" else -1
        assert active[body[0]] <= 1
    rows = result.frame.collect()
    assert {r["status"] for r in rows} == {"completed"} and len(rows) == 18
    assert {r["output"] for r in rows} == {'"a"', '"b"', '"c"'}
    assert queue_depth(client, url) == 0


def test_a_queue_that_cannot_be_reached_fails_the_drain_naming_the_endpoint(
    spark: Any, tmp_path: Path
) -> None:
    """docs/guide.md, "When a service cannot be reached": a task's receive that
    fails fails the task; Spark tries it again up to spark.task.maxFailures times
    (8 here), then the drain raises with the error that names host:port."""
    port = free_port()
    started = time.monotonic()
    with pytest.raises(Exception) as raised:
        run_drain(
            spark,
            queue=f"http://127.0.0.1:{port}/000000000000/jobs",
            handler=print,
            output=str(tmp_path / "out"),
            partitions=2,
            idle_seconds=1,
        )
    took = time.monotonic() - started
    assert f"ReceiveError: SQS receive failed (retry): could not reach 127.0.0.1:{port} (" in str(
        raised.value
    )
    assert took < 120, took  # 8 attempts of one refused connection each
