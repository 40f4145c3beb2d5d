"""What the counting proxy saw on one queue, in the terms the tests assert: messages
received, renewals (leasekeeper's ChangeMessageVisibilityBatch) and deletes, per
receipt."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from tests.frameworks.sqs_proxy import Call, CountingProxy

RENEW = "ChangeMessageVisibilityBatch"
DELETES = ("DeleteMessage", "DeleteMessageBatch")


@dataclass
class Renewal:
    at: float
    receipt: str
    timeout: int


class Traffic:
    """The calls on the queue named ``queue`` (its URL ends with it)."""

    def __init__(self, proxy: CountingProxy, queue: str) -> None:
        self.calls: list[Call] = [
            call for call in proxy.snapshot() if call.queue_url.endswith(f"/{queue}")
        ]

    def received(self) -> Counter[str]:
        """How many times each message id was received."""
        return Counter(message["MessageId"] for call in self.calls for message in call.received())

    def receipts(self) -> dict[str, str]:
        """Receipt -> message id, of every message received."""
        return {
            message["ReceiptHandle"]: message["MessageId"]
            for call in self.calls
            for message in call.received()
        }

    def renewals(self) -> list[Renewal]:
        return [
            Renewal(call.at, str(entry["ReceiptHandle"]), int(entry["VisibilityTimeout"]))
            for call in self.calls
            if call.action == RENEW
            for entry in call.request.get("Entries", [])
        ]

    def deleted_at(self) -> dict[str, float]:
        """Receipt -> when its delete was answered."""
        return {
            receipt: call.at
            for call in self.calls
            if call.action in DELETES and call.status == 200
            for receipt in call.receipts()
        }

    def renewed_after_delete(self) -> list[Renewal]:
        """Renewals sent after their message's delete was answered (never expected)."""
        deleted = self.deleted_at()
        # A renewal's "at" is when its answer came back: one that was in flight when
        # the delete was sent would be answered before it (the lease's op lock).
        return [r for r in self.renewals() if r.receipt in deleted and r.at > deleted[r.receipt]]

    def receipts_by_label(self, label_of: Callable[[str], str]) -> dict[str, list[str]]:
        """Task label -> the receipts of its receives, read from the bodies received
        (``label_of(body)``)."""
        out: dict[str, list[str]] = {}
        for call in self.calls:
            for message in call.received():
                out.setdefault(label_of(message["Body"]), []).append(message["ReceiptHandle"])
        return out

    def renewals_of(self, receipt: str) -> list[Renewal]:
        return [renewal for renewal in self.renewals() if renewal.receipt == receipt]

    def per_task_calls(self) -> Counter[str]:
        """Calls by action, empty receives left out (they are per idle second, not
        per task)."""
        return Counter(
            call.action
            for call in self.calls
            if not (call.action == "ReceiveMessage" and not call.received())
        )
