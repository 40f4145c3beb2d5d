"""The exceptions leasekeeper raises.

Every message here names message ids and error codes, never receipt handles:
a receipt authorises a delete, so it is treated as a secret everywhere.
"""

from __future__ import annotations

from typing import Literal

from leasekeeper.reasons import LostReason

ReceiveErrorKind = Literal["retry", "fatal"]

#: What each of leasekeeper's extras brings, as pip takes it (pyproject.toml's
#: optional-dependencies, which a test keeps in step): the hints of the ImportErrors
#: name these, a command that works however leasekeeper itself was installed.
EXTRAS = {
    "sqs": "boto3>=1.34",
    "mns": "aliyun-mns-sdk>=1.3",
    "azure": "azure-storage-queue>=12.8",
    "redis": "redis>=4.5",
    "otel": "opentelemetry-api>=1.27",
    "prometheus": "prometheus-client>=0.20",
}


def install_hint(extra: str) -> str:
    """The command that installs what the extra ``extra`` brings: ``pip install
    'boto3>=1.34'`` (the SDK from PyPI: leasekeeper itself is not published there)."""
    return f"pip install '{EXTRAS[extra]}' (what leasekeeper's {extra} extra brings)"


class LeaseError(Exception):
    """Base class of every error leasekeeper raises on purpose."""


class ConfigError(LeaseError, ValueError):
    """A configuration value, or a combination of values, cannot work.

    The message names the parameters, their values and the rule they break.
    """


class LeaseLost(LeaseError):
    """The lease on a message is gone: another worker may be processing it now.

    Raised by ``lease.check()``, by ``lease.complete()`` on a lost lease, and on
    leaving ``with manager.lease(msg):`` when the lease was lost meanwhile (in
    which case nothing is deleted).
    """

    def __init__(self, message_id: str, reason: str, lost_reason: LostReason | None = None) -> None:
        super().__init__(f"lease on message {message_id!r} lost: {reason}")
        self.message_id = message_id
        self.reason = reason
        #: Why, in leasekeeper's vocabulary (None where no loss was recorded: a lease
        #: released under its handler at shutdown).
        self.lost_reason = lost_reason

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message_id, self.reason, self.lost_reason))


class LeaseTooShort(LeaseError):
    """A message was registered with less than ``minimal_life`` of invisibility left.

    The scheduler could not be sure to extend it before it reappears, so it is
    refused instead of leased on hope.
    """

    def __init__(self, message_id: str, remaining: float, minimal_life: float) -> None:
        super().__init__(
            f"message {message_id!r} has {remaining:.3f}s of invisibility left, "
            f"less than minimal_life ({minimal_life:g}s): it could reappear before "
            "the first extend. Register at receipt: manager.receive(...) leases each "
            "message the instant it arrives (a message left waiting in a list burns "
            "its invisibility)"
        )
        self.message_id = message_id
        self.remaining = remaining
        self.minimal_life = minimal_life


class ManagerClosed(LeaseError):
    """The LeaseManager was closed; it takes no new leases."""


class BackendError(LeaseError):
    """The queue service gave an answer leasekeeper cannot recover from.

    ``kind`` is the outcome kind the backend reported ("fatal" for a missing
    queue or refused credentials, "retry" when transient errors outlasted the
    retry budget) and ``detail`` the service's error code.
    """

    def __init__(self, operation: str, message_id: str, kind: str, detail: str) -> None:
        super().__init__(f"{operation} of message {message_id!r} failed ({kind}): {detail}")
        self.operation = operation
        self.message_id = message_id
        self.kind = kind
        self.detail = detail


class ReceiveError(BackendError):
    """A backend's ``receive`` or ``send`` (or a queue read it needs) failed.

    Every backend's ``receive`` raises this one type for a failure of the service
    or of the way to it, so a receive loop needs one ``except`` and one question:
    ``retryable``. ``kind`` is "retry" (throttling, 5xx, network: try again after
    a pause) or "fatal" (the queue does not exist, the credentials are refused,
    the request is malformed: retrying cannot help). ``detail`` is the service's
    error code with a fixed phrase, never a receipt or a credential. Invalid
    arguments (a caller's bug) are ``ValueError``/``TypeError`` instead.

    ``ReceiveError(kind, detail, *, operation="receive", service="")``; the
    backends' own subclasses (``MNSQueueError``, ``AzureQueueError``) keep their
    names. A worker stops on a fatal one and backs off on a retryable one.
    """

    def __init__(
        self,
        kind: ReceiveErrorKind,
        detail: str,
        *,
        operation: str = "receive",
        service: str = "",
    ) -> None:
        if kind not in ("retry", "fatal"):
            raise ValueError(f"a ReceiveError's kind is 'retry' or 'fatal', got {kind!r}")
        where = f"{service} " if service else ""
        LeaseError.__init__(self, f"{where}{operation} failed ({kind}): {detail}")
        self.operation = operation
        self.message_id = ""
        self.kind = kind
        self.detail = detail
        self.service = service

    @property
    def retryable(self) -> bool:
        """True when trying again later can succeed (``kind == "retry"``)."""
        return self.kind == "retry"
