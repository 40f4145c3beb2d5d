"""``SQSSpec``: an SQS queue described by its URL, region and endpoint, the spec of
earlier versions (``backend.spec()`` is a ``URLSpec`` now; ``leasekeeper.spark``'s
``SQSSource`` is this class). It builds through ``connect``, as every spec does.
"""

from __future__ import annotations

from dataclasses import dataclass

from leasekeeper.backends.contract import Backend
from leasekeeper.backends.spec import connect

__all__ = ["SQSSpec"]


@dataclass(frozen=True)
class SQSSpec:
    """An SQS queue; credentials from the building process's AWS credential chain
    (environment, shared config/credentials files, instance or task role)."""

    queue_url: str
    region: str | None = None
    endpoint_url: str | None = None
    client_retries: bool = False  # SQSBackend's: leave botocore's retries on its calls

    def build(self) -> Backend:
        return connect(
            self.queue_url,
            region=self.region,
            endpoint_url=self.endpoint_url,
            client_retries=self.client_retries,
        )
