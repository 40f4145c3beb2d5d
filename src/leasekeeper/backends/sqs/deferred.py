"""A boto3 SQS client made on its first use, and the lean path that makes the hot
calls meanwhile: what the renewer process of a worker whose client allows it
builds (``scheme.sqs``'s ``defer_client``), so that renewing imports no botocore
until a call needs the client.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from leasekeeper.backends.sqs.lean import LeanPath, Route

__all__ = ["DeferredClient", "StaticCredentials", "renewal_options"]

log = logging.getLogger("leasekeeper.backends.sqs")


class StaticCredentials(NamedTuple):
    """Fixed keys, as botocore's credentials hand them to a signer."""

    access_key: str
    secret_key: str
    token: str | None = None

    def get_frozen_credentials(self) -> StaticCredentials:
        return self


class DeferredClient:
    """A boto3 SQS client made on its first use, and the lean path that makes the hot
    calls meanwhile (and after) with fixed keys: what the renewer process of a
    worker whose client allows it builds (``scheme.sqs``'s ``defer_client``), so
    that renewing never imports botocore unless a call needs the client. Every
    attribute but ``lean`` and ``made`` is the client's."""

    def __init__(self, make: Callable[[], Any], route: Route, keys: StaticCredentials) -> None:
        self._make = make
        self._client: Any = None
        self._lock = threading.RLock()
        self._on_made: list[Callable[[Any], None]] = []
        self.lean = LeanPath(route, keys, self.made, existing=self.existing)

    def existing(self) -> Any:
        """The client if it is made, else None (nothing is made)."""
        return self._client

    def made(self) -> Any:
        """The client, made now if it is not yet."""
        with self._lock:
            if self._client is None:
                log.debug("making the SQS client a call needs")
                self._client = self._make()
                for adopt in self._on_made:
                    adopt(self._client)
                self._on_made.clear()
            return self._client

    def when_made(self, adopt: Callable[[Any], None]) -> None:
        """Call ``adopt(client)`` once the client is made (now if it is)."""
        with self._lock:
            if self._client is None:
                self._on_made.append(adopt)
                return
        adopt(self._client)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.made(), name)

    def __repr__(self) -> str:
        return f"DeferredClient({self.lean.endpoint!r}, made={self._client is not None})"


def renewal_options(lean: LeanPath | None, secrets: Mapping[str, Any]) -> dict[str, Any]:
    """The factory options that let the renewer process make the hot calls of a
    client whose ``lean`` path is in use and whose fixed keys are among ``secrets``
    without botocore (``defer_client``), over the same TLS verification."""
    if lean is None or not secrets.get("aws_secret_access_key"):
        return {}
    return {
        "defer_client": True,
        "verify": lean.route.verify,
        "lean_user_agent": lean.route.user_agent,
    }
