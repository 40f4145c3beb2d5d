"""The benchmarks' lean moto (``moto_journal.without_attribute_scans``) answers as moto
does: it only skips the work, so a benchmark run on it measures the same service."""

from __future__ import annotations

import time
import uuid

import pytest
from benchmarks.moto_journal import without_attribute_scans
from moto.sqs import models

CHECK = "is_message_valid_based_on_retention_period"


def _message(age_seconds: float) -> models.Message:
    message = models.Message(uuid.uuid4().hex, "body")
    message.sent_timestamp = int((time.time() - age_seconds) * 1000)  # type: ignore[assignment]
    return message


def test_the_retention_check_gives_moto_s_own_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    stock = getattr(models.SQSBackend, CHECK)
    monkeypatch.setattr(models.SQSBackend, CHECK, stock)  # put back after the test
    backend = models.SQSBackend("us-east-1", "123456789012")
    name = f"lean-{uuid.uuid4().hex[:8]}"
    backend.create_queue(name, MessageRetentionPeriod="60")
    # Kept, well inside the period; and dropped, well past it (either side of 60 s).
    messages = [_message(age) for age in (0, 30, 90, 4 * 86400)]
    expected = [stock(backend, name, m) for m in messages]
    assert expected == [True, True, False, False]  # moto's own check sees the period

    without_attribute_scans()

    assert getattr(models.SQSBackend, CHECK) is not stock
    assert [getattr(backend, CHECK)(name, m) for m in messages] == expected
