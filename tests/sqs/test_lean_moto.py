"""The benchmarks' lean moto (``moto_journal.without_attribute_scans``) answers as moto
does: it only skips the work, so a benchmark run on it measures the same service.

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
import json, time, uuid
from moto.sqs import models
from benchmarks.moto_journal import without_attribute_scans

CHECK = "is_message_valid_based_on_retention_period"
stock = getattr(models.SQSBackend, CHECK)
backend = models.SQSBackend("us-east-1", "123456789012")
backend.create_queue("lean", MessageRetentionPeriod="60")

def message(age):
    m = models.Message(uuid.uuid4().hex, "body")
    m.sent_timestamp = int((time.time() - age) * 1000)
    return m

# Kept, well inside the period; dropped, well past it (either side of 60 s).
messages = [message(age) for age in (0, 30, 90, 4 * 86400)]
before = [stock(backend, "lean", m) for m in messages]
without_attribute_scans()
replaced = getattr(models.SQSBackend, CHECK) is not stock
after = [getattr(backend, CHECK)("lean", m) for m in messages]
print(json.dumps({"before": before, "after": after, "replaced": replaced}))
"""


def test_the_retention_check_gives_moto_s_own_answer() -> None:
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
