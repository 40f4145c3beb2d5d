"""The backend contract and what the backends share, re-exported from the modules
that define them: ``from leasekeeper.backends.base import Backend, CloudBackend``
keeps working.

- ``contract``: ``Backend`` (the whole contract a backend author needs: what each
  method takes, returns and raises, and which answers mean lost, retry, capped or
  fatal), ``Handle``, ``Outcome``, ``Message``, ``Sender``;
- ``shared``: the argument checks and rounding, receipt scrubbing, the clock-skew
  allowance for a service's timestamps, the margin before a service's cap, and
  ``ErrorTable`` (a service's error codes by the outcome each means);
- ``cloud``: ``ThreadClients`` (one SDK client per thread) and ``CloudBackend``,
  the base of the SQS, MNS, Azure and Redis backends;
- ``forwarding``: ``ForwardingBackend``, the base of wrappers (fault injection,
  latency, spies).

``tests/contract`` checks every backend against the contract. What each service
really does, and where the local stand-ins differ from it:
docs/backend-semantics.md.
"""

from leasekeeper.backends.cloud import C, CloudBackend, ReadOnce, ThreadClients
from leasekeeper.backends.contract import (
    NO_ATTRIBUTES,
    OK,
    Backend,
    BackendSpec,
    Counter,
    Handle,
    Message,
    Operation,
    Outcome,
    OutcomeKind,
    QueueCounts,
    Sender,
)
from leasekeeper.backends.forwarding import ForwardingBackend
from leasekeeper.backends.shared import (
    CODE_SHAPE,
    REDACTED,
    SKEW_MARGIN,
    Codes,
    ErrorTable,
    Redactions,
    T,
    cap_margin,
    check_attributes,
    check_body,
    check_count,
    check_lease_age,
    check_seconds,
    chunked,
    clean_code,
    codes,
    epoch_seconds,
    is_seconds,
    receive_count,
    redact,
    said,
    text_body,
    whole_seconds,
)

__all__ = [
    "Backend",
    "BackendSpec",
    "C",
    "CODE_SHAPE",
    "CloudBackend",
    "Codes",
    "Counter",
    "ErrorTable",
    "ForwardingBackend",
    "Handle",
    "Message",
    "NO_ATTRIBUTES",
    "OK",
    "Operation",
    "Outcome",
    "OutcomeKind",
    "QueueCounts",
    "REDACTED",
    "ReadOnce",
    "Redactions",
    "SKEW_MARGIN",
    "Sender",
    "T",
    "ThreadClients",
    "cap_margin",
    "check_attributes",
    "check_body",
    "check_count",
    "check_lease_age",
    "check_seconds",
    "chunked",
    "clean_code",
    "codes",
    "epoch_seconds",
    "is_seconds",
    "receive_count",
    "redact",
    "said",
    "text_body",
    "whole_seconds",
]
