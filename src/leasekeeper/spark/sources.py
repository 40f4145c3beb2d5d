"""Queue sources for ``leasekeeper.spark``: small picklable, secret-free descriptions of a
queue that build its backend where they are used (an executor for ``drain``, the
driver-side reader process for ``read_stream``).

Credentials never travel in a source: each process takes them from its own
environment or the cloud SDK's usual chain. ``build_backend`` is the one place a
source becomes a backend; ``source_options``/``source_from_options`` turn a source
into the string options of the ``"leasekeeper"`` streaming format and back.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from leasekeeper.backends.base import Backend
from leasekeeper.errors import LeaseError

# Secrets a connection string may carry; they must reach executors through their
# environment, not through a pickled spec that Spark ships and may log.
_SECRET_KEYS = ("accountkey=", "sharedaccesssignature=")


class Source(Protocol):
    """A picklable description of a queue that can build its backend on an executor."""

    def build(self) -> Backend: ...


@dataclass(frozen=True)
class SQSSource:
    """An SQS queue; credentials from the executor's AWS credential chain."""

    queue_url: str
    region: str | None = None
    endpoint_url: str | None = None

    def build(self) -> Backend:
        import boto3

        from leasekeeper.backends.sqs import SQSBackend

        client = boto3.client("sqs", region_name=self.region, endpoint_url=self.endpoint_url)
        return SQSBackend(client, self.queue_url)


@dataclass(frozen=True)
class MNSSource:
    """An Aliyun MNS queue; credentials from the executor's environment:
    ``MNS_ACCESS_KEY_ID``, ``MNS_ACCESS_KEY_SECRET`` and optionally ``MNS_SECURITY_TOKEN``."""

    endpoint: str
    queue_name: str

    def build(self) -> Backend:
        from mns.account import Account

        from leasekeeper.backends.mns import MNSBackend

        access_id = os.environ.get("MNS_ACCESS_KEY_ID")
        access_key = os.environ.get("MNS_ACCESS_KEY_SECRET")
        if not access_id or not access_key:
            raise LeaseError(
                "MNSSource needs MNS_ACCESS_KEY_ID and MNS_ACCESS_KEY_SECRET in the executor's "
                "environment (on a cluster: spark.executorEnv.MNS_ACCESS_KEY_ID etc.)"
            )
        token = os.environ.get("MNS_SECURITY_TOKEN", "")
        account = Account(self.endpoint, access_id, access_key, token)
        return MNSBackend(account.get_queue(self.queue_name))


@dataclass(frozen=True)
class AzureQueueSource:
    """An Azure Storage queue.

    With neither argument, the connection string comes from the executor's
    ``AZURE_STORAGE_CONNECTION_STRING``. ``account_url`` takes its credential from
    ``AZURE_STORAGE_SAS_TOKEN`` or ``AZURE_STORAGE_ACCOUNT_KEY`` in the executor's
    environment, else ``azure.identity.DefaultAzureCredential``. A
    ``connection_string`` given here must hold no secret (no AccountKey or
    SharedAccessSignature): it is pickled and shipped to every executor.
    """

    queue_name: str
    connection_string: str | None = None
    account_url: str | None = None

    def __post_init__(self) -> None:
        if self.connection_string is not None and any(
            key in self.connection_string.lower() for key in _SECRET_KEYS
        ):
            raise ValueError(
                "AzureQueueSource: this connection string holds a secret, and the source is "
                "pickled to every executor; set AZURE_STORAGE_CONNECTION_STRING in the "
                "executors' environment instead (spark.executorEnv.AZURE_STORAGE_CONNECTION_STRING)"
            )
        if self.connection_string is not None and self.account_url is not None:
            raise ValueError("AzureQueueSource: give connection_string or account_url, not both")

    def __repr__(self) -> str:
        where = self.account_url or ("connection string" if self.connection_string else "env")
        return f"AzureQueueSource(queue_name={self.queue_name!r}, via={where!r})"

    def build(self) -> Backend:
        from azure.storage.queue import QueueClient

        from leasekeeper.backends.azure import AzureQueueBackend

        if self.account_url is not None:
            credential: Any = os.environ.get("AZURE_STORAGE_SAS_TOKEN")
            if not credential:
                key = os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
                if key:
                    account = self.account_url.split("//", 1)[-1].split(".", 1)[0]
                    credential = {"account_name": account, "account_key": key}
            if not credential:
                from azure.identity import DefaultAzureCredential

                credential = DefaultAzureCredential()
            client = QueueClient(self.account_url, self.queue_name, credential=credential)
        else:
            conn = self.connection_string or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
            if not conn:
                raise LeaseError(
                    "AzureQueueSource needs AZURE_STORAGE_CONNECTION_STRING in the executor's "
                    "environment, or account_url"
                )
            client = QueueClient.from_connection_string(conn, self.queue_name)
        return AzureQueueBackend(client)


# The sources the streaming format knows, by the name its "backend" option takes.
SOURCE_KINDS: dict[str, type[SQSSource] | type[MNSSource] | type[AzureQueueSource]] = {
    "sqs": SQSSource,
    "mns": MNSSource,
    "azure": AzureQueueSource,
}


def build_backend(source: Source) -> Backend:
    """The backend ``source`` describes, built here, in this process (with this
    process's credentials). Every part of ``leasekeeper.spark`` builds through it."""
    return source.build()


def source_options(source: object) -> dict[str, str]:
    """``source`` as string options: ``backend`` (its kind) and its set fields."""
    for kind, cls in SOURCE_KINDS.items():
        if type(source) is cls:
            fields = dataclasses.fields(cls)
            options = {"backend": kind}
            for field in fields:
                value = getattr(source, field.name)
                if value is not None:
                    options[field.name] = str(value)
            return options
    raise TypeError(
        f"source must be SQSSource, MNSSource or AzureQueueSource, got {type(source).__name__}"
    )


def source_from_options(options: Mapping[str, str]) -> Source:
    """The source that string options describe (keys lower-case): ``backend`` names
    the kind (sqs, mns, azure), the other keys its fields. Unknown keys are left to
    the caller; a missing required field raises ValueError."""
    kind = options.get("backend", "").strip().lower()
    cls = SOURCE_KINDS.get(kind)
    if cls is None:
        raise ValueError(
            f"option 'backend' must be one of {', '.join(SOURCE_KINDS)}, got {kind or None!r}"
        )
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        value = options.get(field.name.lower())
        if value is not None and value != "":
            values[field.name] = value
        elif field.default is dataclasses.MISSING:
            raise ValueError(f"backend {kind!r} needs option {field.name!r}")
    return cls(**values)
