"""Queues by URL: ``leasekeeper.connect(url, **options) -> Backend``.

A URL's scheme names a *factory* ``(url, **options) -> Backend`` registered in the
entry-point group ``leasekeeper.backends``. leasekeeper's own backends register
there as any other package would, in its ``pyproject.toml``::

    [project.entry-points."leasekeeper.backends"]
    sqs = "leasekeeper.backends.sqs.scheme:sqs"
    https = "leasekeeper.backends.sqs.scheme:sqs"
    http = "leasekeeper.backends.sqs.scheme:sqs"
    mns = "leasekeeper.backends.schemes:mns"
    azure = "leasekeeper.backends.schemes:azure"
    memory = "leasekeeper.backends.schemes:memory"
    redis = "leasekeeper.backends.schemes:redis"
    rediss = "leasekeeper.backends.schemes:redis"

so a third-party package adds a queue service by declaring one more line in its
own ``pyproject.toml``, with no code in leasekeeper. (Those lines are also
``leasekeeper.backends.urls.OWN_SCHEMES``, which count where leasekeeper's own
metadata is missing: a vendored copy, a source tree on ``PYTHONPATH``.)
``connect`` remembers the URL and the options on the backend it returns: that
backend's ``spec()`` is a ``URLSpec``, which calls ``connect`` again in another process (the renewer
process, a Spark executor), so a plug-in backend works there too.

Credentials never travel in a URLSpec: a password in the URL, and options that
are secrets, are dropped from it (and from every repr and log line), so the other
process takes its credentials from its own environment, as each factory documents.

This module gathers the names: URLs and the entry points live in
``leasekeeper.backends.urls``, ``connect`` and the specs in
``leasekeeper.backends.spec``.
"""

from __future__ import annotations

from leasekeeper.backends.spec import URLSpec, connect, spec_of
from leasekeeper.backends.urls import (
    ENTRY_POINT_GROUP,
    QueueURL,
    factory_for,
    installed_schemes,
    parse_url,
    redact_url,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "QueueURL",
    "URLSpec",
    "connect",
    "factory_for",
    "installed_schemes",
    "parse_url",
    "redact_url",
    "spec_of",
]
