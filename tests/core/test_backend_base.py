"""The helpers every backend shares: Message.with_backend and redact."""

from __future__ import annotations

import re

from leasekeeper.backends.base import REDACTED, redact
from leasekeeper.backends.memory import MemoryQueue
from leasekeeper.testing import ManualClock


def test_with_backend_copies_the_message_but_names_the_wrapper(clock: ManualClock) -> None:
    inner = MemoryQueue(30.0, clock=clock)
    outer = MemoryQueue(30.0, clock=clock, name="wrapper")
    inner.send("payload")
    message = inner.receive()[0]
    copy = message.with_backend(outer)
    assert copy is not message and copy.backend is outer and message.backend is inner
    fields = ("id", "body", "receipt", "received_at", "visibility_timeout", "receive_count")
    fields += ("raw", "deadline_hint", "hard_deadline", "visible_until")
    assert [getattr(copy, f) for f in fields] == [getattr(message, f) for f in fields]
    assert message.receipt not in repr(copy)


def test_redact_blanks_secrets_as_written_and_url_quoted_then_patterns() -> None:
    secret = "AQEB/x+y=="
    text = f"bad handle {secret} in url ?ReceiptHandle=AQEB%2Fx%2By%3D%3D and key=abc123"
    out = redact(text, [secret, ""], [(re.compile(r"(key=)\w+"), r"\1" + REDACTED)])
    assert secret not in out and "AQEB%2F" not in out and "abc123" not in out
    assert out == f"bad handle {REDACTED} in url ?ReceiptHandle={REDACTED} and key={REDACTED}"
    assert redact("nothing secret here") == "nothing secret here"
