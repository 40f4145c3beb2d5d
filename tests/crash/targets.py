"""One queue on each local service (moto server, Azurite, the local MNS server),
behind the small ``QueueTarget`` interface the crash harness uses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from azure.storage.queue import QueueClient
from mns.queue import Message as SDKMessage

from leasekeeper.backends.azure import AzureQueueBackend
from leasekeeper.backends.base import Backend
from leasekeeper.backends.mns import MNSBackend
from leasekeeper.backends.sqs import SQSBackend
from leasekeeper.testing.mns_server import MNSServer


@dataclass
class SQSTarget:
    client: Any  # a boto3 SQS client on the moto server
    queue_url: str
    env: dict[str, str]
    kind: str = "sqs"

    def send(self, body: str) -> str:
        return str(self.client.send_message(QueueUrl=self.queue_url, MessageBody=body)["MessageId"])

    def remaining(self) -> int:
        """Delayed, then in flight, then visible: one request each, in that order.

        moto counts each attribute in a pass of its own over the queue, each at its
        own moment, so a message that turns visible between the passes for
        "visible" and "not visible" is counted in neither: asked for all three at
        once, right as a killed worker's messages came back, it answered 0 with 7
        messages in the queue. Counted in the order a message moves (delayed ->
        visible, in flight -> visible), a message is missed only if someone
        receives it between two requests - and then that worker holds it.
        """
        names = [
            "ApproximateNumberOfMessagesDelayed",
            "ApproximateNumberOfMessagesNotVisible",
            "ApproximateNumberOfMessages",
        ]
        total = 0
        for name in names:
            attributes = self.client.get_queue_attributes(
                QueueUrl=self.queue_url, AttributeNames=[name]
            )["Attributes"]
            total += int(attributes[name])
        return total

    def probe(self) -> Backend:
        return SQSBackend(self.client, self.queue_url)

    def deleted_count(self) -> int | None:
        return None


@dataclass
class AzureTarget:
    client: QueueClient
    env: dict[str, str]
    kind: str = "azure"

    def send(self, body: str) -> str:
        return str(self.client.send_message(body).id)

    def remaining(self) -> int:
        # Azurite counts invisible (leased) messages too.
        count = self.client.get_queue_properties().approximate_message_count
        return int(count or 0)

    def probe(self) -> Backend:
        return AzureQueueBackend(self.client)

    def deleted_count(self) -> int | None:
        return None


@dataclass
class MNSTarget:
    server: MNSServer
    name: str
    queue: Any  # an mns.queue.Queue of the test's own
    env: dict[str, str]
    kind: str = "mns"

    def send(self, body: str) -> str:
        return str(self.queue.send_message(SDKMessage(body)).message_id)

    def remaining(self) -> int:
        stats = self.server.queue_stats(self.name)
        return stats.visible + stats.in_flight + stats.delayed

    def probe(self) -> Backend:
        return MNSBackend(self.queue)

    def deleted_count(self) -> int | None:
        return self.server.queue_stats(self.name).deleted_count
