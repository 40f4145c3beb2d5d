"""Backend specs: picklable descriptions that build an equivalent backend elsewhere.

``backend.spec()`` returns one; its ``build()`` makes a backend on the same queue,
endpoint and region in another process - the out-of-process renewer, a Spark
executor. Every backend's is a ``URLSpec`` (``leasekeeper.backends.registry``): its
URL and options, built again with ``leasekeeper.connect``, so a backend of another
package, connected by URL, is rebuilt the same way. A spec never holds a
credential: the building process takes its own from its environment or the SDK's
default chain, as each backend's ``from_url`` (``leasekeeper.backends.schemes``)
documents. (The renewer process inherits the worker's environment, so a worker
whose client found its credentials there finds them again; one built with explicit
keys must put them in the environment too.)

``SQSSpec``, ``MNSSpec`` and ``AzureQueueSpec`` are the specs of earlier versions,
kept with their fields (``leasekeeper.spark``'s ``SQSSource``, ``MNSSource`` and
``AzureQueueSource`` are the same classes); each builds through ``connect`` too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from leasekeeper.backends.registry import URLSpec, connect, spec_of

if TYPE_CHECKING:
    from leasekeeper.backends.base import Backend

__all__ = ["AzureQueueSpec", "BackendSpec", "MNSSpec", "SQSSpec", "URLSpec", "spec_of"]


@runtime_checkable
class BackendSpec(Protocol):
    """A picklable description of a queue that can build its backend elsewhere."""

    def build(self) -> Backend: ...


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


@dataclass(frozen=True)
class MNSSpec:
    """An Aliyun MNS queue; credentials from the building process's environment:
    ``MNS_ACCESS_KEY_ID``, ``MNS_ACCESS_KEY_SECRET`` and optionally
    ``MNS_SECURITY_TOKEN`` (on a Spark cluster: ``spark.executorEnv.*``)."""

    endpoint: str
    queue_name: str

    def build(self) -> Backend:
        scheme, _, host = self.endpoint.rstrip("/").partition("://")
        return connect(f"mns://{host}/{self.queue_name}", secure=scheme != "http")


# Secrets a connection string may carry: they must reach another process through
# its environment, not through a pickled spec that may be shipped and logged.
SECRET_KEYS = ("accountkey=", "sharedaccesssignature=")


@dataclass(frozen=True)
class AzureQueueSpec:
    """An Azure Storage queue.

    With neither ``connection_string`` nor ``account_url``, the connection string
    comes from ``AZURE_STORAGE_CONNECTION_STRING`` in the building process's
    environment. With ``account_url``, the credential comes from
    ``AZURE_STORAGE_SAS_TOKEN`` or ``AZURE_STORAGE_ACCOUNT_KEY`` (for account
    ``account_name``, or the first label of the URL's host), else from
    ``AZURE_STORAGE_CONNECTION_STRING``, else ``azure.identity.DefaultAzureCredential``.
    A ``connection_string`` given here must hold no secret (no AccountKey or
    SharedAccessSignature): the spec is pickled and shipped.
    """

    queue_name: str
    connection_string: str | None = None
    account_url: str | None = None
    account_name: str | None = None

    def __post_init__(self) -> None:
        if self.connection_string is not None and any(
            key in self.connection_string.lower() for key in SECRET_KEYS
        ):
            raise ValueError(
                f"{type(self).__name__}: this connection string holds a secret, and the spec "
                "is pickled and shipped; set AZURE_STORAGE_CONNECTION_STRING in the building "
                "process's environment instead (the renewer inherits the worker's; on Spark, "
                "the executors' environment: spark.executorEnv.AZURE_STORAGE_CONNECTION_STRING)"
            )
        if self.connection_string is not None and self.account_url is not None:
            raise ValueError(
                f"{type(self).__name__}: give connection_string or account_url, not both"
            )

    def __repr__(self) -> str:
        where = self.account_url or ("connection string" if self.connection_string else "env")
        return f"{type(self).__name__}(queue_name={self.queue_name!r}, via={where!r})"

    def build(self) -> Backend:
        account = self.account_name
        if account is None and self.account_url is not None:
            account = self.account_url.split("//", 1)[-1].split(".", 1)[0]
        options: dict[str, Any] = {"account_url": self.account_url}
        if self.connection_string is not None:
            options = {"connection_string": self.connection_string}
        return connect(f"azure://{account or ''}/{self.queue_name}", **options)
