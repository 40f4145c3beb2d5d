"""SQS's errors: the table of codes (``ERRORS``), ``classify_error`` for a code (a
ClientError's or a batch entry's), ``classify_exception`` for what a boto3 call
raised, and ``scrub``, which takes receipts out of a text. Both call paths raise
botocore's exceptions, so one table classifies both. See docs/backends/sqs.md,
"Errors", and docs/backend-semantics.md for what SQS really answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from leasekeeper.backends.contract import OutcomeKind
from leasekeeper.backends.shared import REDACTED, ErrorTable, clean_code, redact
from leasekeeper.backends.sqs.credentials import aws_configuration
from leasekeeper.backends.sqs.lean import LazyModule

if TYPE_CHECKING:
    from botocore import exceptions as boto
else:
    boto = LazyModule("botocore.exceptions")

__all__ = [
    "ERRORS",
    "classify_error",
    "classify_exception",
    "classify_with_text",
    "scrub",
]

_LEGACY_PREFIX = "AWS.SimpleQueueService."

# Codes after dropping the legacy "AWS.SimpleQueueService." prefix. "bug": whole-call
# errors that mean leasekeeper sent a malformed request.
ERRORS = ErrorTable(
    lost="ReceiptHandleIsInvalid MessageNotInflight",
    retry="""
    RequestThrottled ThrottlingException Throttling ThrottledException
    TooManyRequestsException RequestLimitExceeded ServiceUnavailable
    ServiceUnavailableException InternalError InternalFailure InternalServerError
    RequestTimeout RequestTimeoutException KmsThrottled KMS.ThrottlingException
    """,
    fatal="""
    NonExistentQueue QueueDoesNotExist AccessDenied AccessDeniedException
    InvalidClientTokenId SignatureDoesNotMatch InvalidSignatureException
    UnrecognizedClientException IncompleteSignature MissingAuthenticationToken
    InvalidAccessKeyId ExpiredToken ExpiredTokenException RequestExpired InvalidSecurity
    OptInRequired NotAuthorized UnsupportedOperation InvalidAddress KmsAccessDenied
    KmsDisabled KmsInvalidKeyUsage KmsInvalidState KmsNotFound KmsOptInRequired
    """,
    bug="""
    TooManyEntriesInBatchRequest EmptyBatchRequest BatchEntryIdsNotDistinct
    InvalidBatchEntryId BatchRequestTooLong MissingParameter InvalidParameterCombination
    InvalidAction ValidationError ValidationException MalformedQueryString
    InvalidQueryParameter SerializationException
    """,
)
_INVALID_PARAMETER = frozenset({"InvalidParameterValue", "InvalidParameterValueException"})

# InvalidParameterValue is told apart by its message text: (lower-cased phrase, kind, note).
_INVALID_PARAMETER_CASES: tuple[tuple[str, OutcomeKind, str], ...] = (
    ("beyond the limit", "capped", "total visibility beyond the limit [43200 seconds]"),
    # extend of a handle whose message is no longer in flight (deleted, re-received)
    ("does not exist or is not available", "lost", "message not in flight"),
    # FIFO: delete/extend with an expired handle
    ("receipt handle has expired", "lost", "receipt handle expired"),
    # any other reason the handle itself is refused
    ("parameter receipthandle is invalid", "lost", "receipt handle refused"),
)

# A receipt handle is a long base64-like token; scrub anything that looks like one.
_REDACTIONS = ((re.compile(r"[A-Za-z0-9+/=_-]{32,}"), REDACTED),)


def _short(code: str) -> str:
    return code[len(_LEGACY_PREFIX) :] if code.startswith(_LEGACY_PREFIX) else code


def scrub(text: str, receipts: Iterable[str] = ()) -> str:
    """``text`` with the given receipts and anything handle-like replaced."""
    return redact(text, receipts, _REDACTIONS)


def classify_error(
    code: str,
    query_code: str = "",
    message: str = "",
    *,
    status: int | None = None,
    sender_fault: bool | None = None,
) -> tuple[OutcomeKind, str]:
    """Map an SQS error to an outcome kind and a detail that quotes no receipt.

    ``code``/``query_code`` are ``Error.Code``/``Error.QueryErrorCode`` of a
    ClientError (or a ``Failed`` entry's ``Code``), ``message`` the error message
    (read only to tell the InvalidParameterValue cases apart, never returned),
    ``status`` the HTTP status and ``sender_fault`` a ``Failed`` entry's flag.

    Unrecognised codes are "retry" (rule 5: a lease is declared lost only on a
    definitive answer; the manager stops retrying when the lease's deadline
    passes), so a new transient error cannot end healthy leases.
    """
    codes = [c for c in (clean_code(code), clean_code(query_code)) if c]
    shorts = {_short(c) for c in codes}
    detail = " / ".join(dict.fromkeys(codes)) or "unknown error"
    kind: OutcomeKind = "retry"
    note = ""
    known = ERRORS.kind(*shorts)
    if shorts & _INVALID_PARAMETER:
        text = message.lower() if isinstance(message, str) else ""
        kind, note = "fatal", "request rejected (a leasekeeper bug? please report)"
        for phrase, case_kind, case_note in _INVALID_PARAMETER_CASES:
            if phrase in text:
                kind, note = case_kind, case_note
                break
    elif known is not None:
        kind = known
        if known == "fatal" and not shorts & ERRORS.fatal - ERRORS.bug:
            note = "malformed request (a leasekeeper bug, please report)"
    elif status is not None and status >= 500:
        note = f"HTTP {status}"
    elif sender_fault is False:
        note = "server fault"
    else:
        note = "unrecognised"
    return kind, f"{detail}: {note}" if note else detail


# botocore's exceptions (named: their module is imported when one is raised)
_NOT_CONFIGURED = (
    "NoCredentialsError",
    "PartialCredentialsError",
    "UnknownCredentialError",
    "ProfileNotFound",
    "InvalidConfigError",
    "BaseEndpointResolverError",
)


def classify_with_text(exc: BaseException) -> tuple[OutcomeKind, str, str]:
    """(kind, detail, message text) for an exception a boto3 call raised: the text is
    the service's message, for a log line once its receipts are scrubbed."""
    if isinstance(exc, boto.ClientError):
        error: Mapping[str, Any] = exc.response.get("Error", {}) or {}
        meta: Mapping[str, Any] = exc.response.get("ResponseMetadata", {}) or {}
        status = meta.get("HTTPStatusCode")
        message = str(error.get("Message", "") or "")
        kind, detail = classify_error(
            str(error.get("Code", "") or ""),
            str(error.get("QueryErrorCode", "") or ""),
            message,
            status=status if isinstance(status, int) else None,
        )
        return kind, detail, message
    name = type(exc).__name__  # botocore's text may quote a request's receipts: never kept
    if isinstance(exc, (boto.ConnectionError, boto.HTTPClientError)):
        return "retry", name, ""
    if isinstance(
        exc, tuple(getattr(boto, error) for error in _NOT_CONFIGURED)
    ):  # which variable is missing, and where it goes
        return "fatal", f"{name}: {aws_configuration(exc)}", ""
    if isinstance(exc, boto.ParamValidationError):
        return "fatal", f"{name}: malformed request (a leasekeeper bug, please report)", ""
    return "retry", name, ""


def classify_exception(exc: BaseException) -> tuple[OutcomeKind, str]:
    """``classify_error`` for an exception a boto3 SQS call raised (a ClientError or
    a botocore connection/configuration error): its outcome kind, and a detail that
    names the error code and never quotes the request or the service's message.
    Useful around your own ``receive`` loop: "fatal" means stop, "retry" back off."""
    kind, detail, _ = classify_with_text(exc)
    return kind, detail
