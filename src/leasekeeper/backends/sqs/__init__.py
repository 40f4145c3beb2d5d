"""Amazon SQS: ``SQSBackend`` on a boto3 client, and everything SQS needs, in one
package shaped as a plug-in backend is (see docs/design.md, "Module map"):

- ``backend``: ``SQSBackend``; ``errors``: its error table, ``classify_error``
  and ``classify_exception``; ``attempts``: a FIFO receive that failed in transit,
  asked again with its ReceiveRequestAttemptId;
- ``scheme``: the factory of the ``sqs://``, ``https://`` and ``http://`` URL
  schemes (``leasekeeper.backends.sqs.scheme:sqs``, the entry point
  ``pyproject.toml`` registers in the ``leasekeeper.backends`` group, as a plug-in
  registers its own);
- ``rebuild``: the client read so another process can make one like it;
  ``spec``: ``SQSSpec``, the spec of earlier versions; ``credentials``: what to
  tell a process with no AWS credentials or region;
- the lean call path of the hot calls: ``lean`` (``LeanPath``), ``responses`` (its
  answers read as botocore reads them), ``sigv4`` (its signer), ``keepalive`` (its
  HTTP/1.1 connections), ``wrappers`` (who wraps botocore's calls: a tracer, for
  whom the calls go through the client).

Importing it needs boto3 installed (not imported: the renewer process's lean path
renews without botocore)::

    from leasekeeper.backends.sqs import SQSBackend

    backend = SQSBackend(boto3.client("sqs"), queue_url)

See docs/backends/sqs.md.
"""

from __future__ import annotations

from leasekeeper.backends.sqs.backend import SQSBackend
from leasekeeper.backends.sqs.errors import classify_error, classify_exception, scrub
from leasekeeper.backends.sqs.spec import SQSSpec

__all__ = ["SQSBackend", "SQSSpec", "classify_error", "classify_exception", "scrub"]
