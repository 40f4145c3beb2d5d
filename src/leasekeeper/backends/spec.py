"""Backend specs: picklable descriptions that build an equivalent backend elsewhere.

``backend.spec()`` on an SQS, MNS or Azure backend returns one of these; its
``build()`` makes a backend on the same queue, endpoint and region in another
process - the out-of-process renewer, a Spark executor. A spec never holds a
credential: the building process takes its own from its environment or the
SDK's default chain, as each spec documents. (The renewer process inherits the
worker's environment, so a worker whose client found its credentials there finds
them again; one built with explicit keys must put them in the environment too.)

Each spec lives in its backend's module, beside the backend it describes and
builds (``leasekeeper.backends.sqs.SQSSpec``, ``...mns.MNSSpec``,
``...azure.AzureQueueSpec``); this module names them all and the protocol they
share. ``leasekeeper.spark``'s ``SQSSource``, ``MNSSource`` and
``AzureQueueSource`` are the same classes under their older names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from leasekeeper.backends.base import Backend

__all__ = ["BackendSpec"]  # and, on first use: SQSSpec, MNSSpec, AzureQueueSpec


@runtime_checkable
class BackendSpec(Protocol):
    """A picklable description of a queue that can build its backend elsewhere."""

    def build(self) -> Backend: ...


def __getattr__(name: str) -> Any:
    # The spec classes are imported on first use, from their backends' modules:
    # importing this module must not need every service's SDK.
    if name == "SQSSpec":
        from leasekeeper.backends.sqs import SQSSpec

        return SQSSpec
    if name == "MNSSpec":
        from leasekeeper.backends.mns import MNSSpec

        return MNSSpec
    if name == "AzureQueueSpec":
        from leasekeeper.backends.azure import AzureQueueSpec

        return AzureQueueSpec
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
