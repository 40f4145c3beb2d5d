"""The benchmarks' lean moto (``moto_journal.without_attribute_scans`` and
``with_a_quick_clock``) answers as moto does: it only skips the work, so a
benchmark run on it measures the same service.

It runs in a process of its own: importing moto adds its botocore hook to every
client made afterwards, which would send this test session's calls off the lean path.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHECK = r"""
import datetime, json, time, uuid
from moto.sqs import models
from benchmarks.moto_journal import with_a_quick_clock, without_attribute_scans

CHECK = "is_message_valid_based_on_retention_period"
COUNTS = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible",
          "ApproximateNumberOfMessagesDelayed"]
stock = getattr(models.SQSBackend, CHECK)
backend = models.SQSBackend("us-east-1", "123456789012")
backend.create_queue("lean", MessageRetentionPeriod="60")

def message(age):
    m = models.Message(uuid.uuid4().hex, "body")
    m.sent_timestamp = int((time.time() - age) * 1000)
    return m

def fill(queue):
    # 5 visible, 3 of them received (in flight), 2 delayed: the three counts differ.
    backend.create_queue(queue)
    for i in range(5):
        backend.send_message(queue, f"now {i}")
    for i in range(2):
        backend.send_message(queue, f"later {i}", delay_seconds=600)
    backend.receive_message(queue, 3, 0, 30)
    every = backend.get_queue_attributes(queue, ["All"])
    return {
        "all": {k: v for k, v in every.items() if k in COUNTS},
        "named": backend.get_queue_attributes(queue, COUNTS),
    }

# Kept, well inside the period; dropped, well past it (either side of 60 s).
messages = [message(age) for age in (0, 30, 90, 4 * 86400)]
before = [stock(backend, "lean", m) for m in messages]
counts_before = fill("stock")
without_attribute_scans()
replaced = getattr(models.SQSBackend, CHECK) is not stock
after = [getattr(backend, CHECK)("lean", m) for m in messages]
counts_after = fill("patched")
# The quick clock reads the same seconds since the epoch, and converts a given time as moto does.
then = datetime.datetime(2026, 1, 2, 3, 4, 5, 600000)
stock_clock = (models.unix_time(), models.unix_time_millis(), models.unix_time(then))
with_a_quick_clock()
quick_clock = (models.unix_time(), models.unix_time_millis(), models.unix_time(then))
print(json.dumps({"before": before, "after": after, "replaced": replaced,
                  "counts_before": counts_before, "counts_after": counts_after,
                  "clocks": [stock_clock, quick_clock],
                  "quick": models.unix_time.__module__}))
"""


def test_the_lean_moto_gives_moto_s_own_answers() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHECK],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.splitlines()[-1])
    assert found["before"] == [True, True, False, False]  # moto's own check sees the period
    assert found["replaced"]
    assert found["after"] == found["before"]
    # GetQueueAttributes still counts, whether it asks for all or by name.
    expected = {
        "ApproximateNumberOfMessages": "2",
        "ApproximateNumberOfMessagesNotVisible": "3",
        "ApproximateNumberOfMessagesDelayed": "2",
    }
    for asked in ("all", "named"):
        assert {k: str(v) for k, v in found["counts_before"][asked].items()} == expected
        assert found["counts_after"][asked] == found["counts_before"][asked]
    (stock_s, stock_ms, stock_then), (quick_s, quick_ms, quick_then) = found["clocks"]
    assert found["quick"] == "benchmarks.moto_journal"  # the clock was replaced
    assert abs(quick_s - stock_s) < 5 and abs(quick_ms - stock_ms) < 5000  # the same epoch
    assert quick_then == stock_then == 1767323045.6
