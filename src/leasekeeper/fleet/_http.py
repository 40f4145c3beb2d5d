"""The few HTTP calls the fleet makes: to the ECS agent and to a machine's metadata
service, on the link-local or loopback network.

``http.client`` directly, not ``urllib.request``: these endpoints must never be
reached through an ``HTTP_PROXY`` (a proxy would answer for another machine, or not
at all), and a call must be bounded by a timeout and read at most a small answer.
"""

from __future__ import annotations

import http.client
import urllib.parse
from collections.abc import Mapping
from typing import NamedTuple

__all__ = ["Answer", "call", "join"]

#: The most of an answer that is read: metadata answers are a few hundred bytes.
MAX_ANSWER = 64 * 1024


class Answer(NamedTuple):
    """An HTTP answer: its status and (up to ``MAX_ANSWER`` bytes of) its body."""

    status: int
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace").strip()


def join(base: str, path: str) -> str:
    """``base`` (an endpoint, with or without a trailing slash or a path of its own)
    and ``path`` (with or without a leading slash) as one URL."""
    return base.rstrip("/") + "/" + path.lstrip("/")


def call(
    method: str,
    url: str,
    *,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    timeout: float,
) -> Answer:
    """One request; the answer whatever its status. ``OSError`` (a refused or reset
    connection, a timeout: ``TimeoutError``) or ``http.client.HTTPException`` (a
    malformed answer) when there is none; ``ValueError`` for a URL that is not
    http(s)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"not an http(s) URL: {url!r}")
    connection_class = (
        http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    )
    connection = connection_class(parts.hostname, parts.port, timeout=timeout)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    try:
        connection.request(method, target, body=body, headers=dict(headers or {}))
        response = connection.getresponse()
        return Answer(response.status, response.read(MAX_ANSWER))
    finally:
        connection.close()
