"""SigV4 signing for the lean SQS path's requests, the same signature botocore's
``SigV4Auth`` makes for them, at a fraction of its CPU.

The lean path's requests always have the same shape: ``POST`` to the endpoint's
path, no query string, and the same few headers (``Content-Type``, ``Host``,
``X-Amz-Date``, ``X-Amz-Target``, ``x-amzn-query-mode``, and the session token
when there is one). So the canonical request is put together directly rather
than by botocore's generic header walk, and the signing key, four HMACs derived
from the secret, the date, the region and the service, is derived once a day
(or whenever the secret changes: a refreshable credentials object hands out new
keys, and each request takes the frozen set of the moment, as botocore does).
tests/sqs/test_sigv4.py checks the result against botocore's own signer.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from typing import Any
from urllib.parse import quote, urlsplit

__all__ = ["RequestSigner", "host_header"]

_ALGORITHM = "AWS4-HMAC-SHA256"
_SIGNED = "content-type;host;x-amz-date;x-amz-target;x-amzn-query-mode"
_SIGNED_WITH_TOKEN = (
    "content-type;host;x-amz-date;x-amz-security-token;x-amz-target;x-amzn-query-mode"
)


def host_header(url: str) -> str:
    """The Host header botocore signs for ``url``: the lowercase host name (an IPv6
    address in brackets), its port unless it is the scheme's default."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    if parts.port is not None and parts.port != {"http": 80, "https": 443}.get(parts.scheme):
        host = f"{host}:{parts.port}"
    return host


def normalized_path(path: str) -> str:
    """``path`` as botocore's signer normalises it: dot segments resolved
    (RFC 3986, 5.2.4) and empty segments dropped, its leading and trailing slash
    kept. (Its own, so signing needs none of botocore: the renewer process makes
    the lean path's requests without importing it.)"""
    kept: list[str] = []
    for segment in path.split("/"):
        if segment == "..":
            if kept:
                kept.pop()
        elif segment and segment != ".":
            kept.append(segment)
    first = "/" if path.startswith("/") else ""
    last = "/" if path.endswith("/") and kept else ""
    return first + "/".join(kept) + last or "/"


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode("utf-8"), hashlib.sha256).digest()


class RequestSigner:
    """Signs the lean path's POSTs to one endpoint for one region and service.

    ``headers(credentials, target, content_type, body)`` answers the headers to
    send (signed ones and ``Authorization``), given the frozen credentials of the
    moment (``access_key``, ``secret_key``, ``token``). Thread-safe: the cached
    key is replaced whole.
    """

    def __init__(self, url: str, region: str, service: str) -> None:
        self.host = host_header(url)
        path = url.split("://", 1)[-1].partition("/")[2].partition("?")[0]
        self._path = quote(normalized_path("/" + path), safe="/~")
        self._region = region
        self._service = service
        self._scope_tail = f"/{region}/{service}/aws4_request"
        # (date, secret) -> signing key: one entry, swapped whole (no lock needed to read)
        self._key: tuple[str, str, bytes] = ("", "", b"")
        self._lock = threading.Lock()
        self.clock = time.time

    def _signing_key(self, date: str, secret: str) -> bytes:
        found = self._key
        if found[0] == date and found[1] == secret:
            return found[2]
        with self._lock:
            key = _hmac(("AWS4" + secret).encode("utf-8"), date)
            key = _hmac(key, self._region)
            key = _hmac(key, self._service)
            key = _hmac(key, "aws4_request")
            self._key = (date, secret, key)
        return key

    def headers(
        self, credentials: Any, target: str, content_type: str, body: bytes
    ) -> dict[str, str]:
        timestamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(self.clock()))
        date = timestamp[:8]
        token = credentials.token
        # the canonical headers, in the sorted order of their lowercase names
        if token:
            canonical_headers = (
                f"content-type:{content_type}\nhost:{self.host}\nx-amz-date:{timestamp}\n"
                f"x-amz-security-token:{' '.join(token.split())}\n"
                f"x-amz-target:{target}\nx-amzn-query-mode:true\n"
            )
            signed = _SIGNED_WITH_TOKEN
        else:
            canonical_headers = (
                f"content-type:{content_type}\nhost:{self.host}\nx-amz-date:{timestamp}\n"
                f"x-amz-target:{target}\nx-amzn-query-mode:true\n"
            )
            signed = _SIGNED
        canonical = (
            f"POST\n{self._path}\n\n{canonical_headers}\n{signed}\n"
            f"{hashlib.sha256(body).hexdigest()}"
        )
        scope = date + self._scope_tail
        to_sign = (
            f"{_ALGORITHM}\n{timestamp}\n{scope}\n"
            f"{hashlib.sha256(canonical.encode('utf-8')).hexdigest()}"
        )
        key = self._signing_key(date, credentials.secret_key)
        signature = hmac.new(key, to_sign.encode("utf-8"), hashlib.sha256).hexdigest()
        headers = {
            "Content-Type": content_type,
            "X-Amz-Target": target,
            "x-amzn-query-mode": "true",
            "X-Amz-Date": timestamp,
            "Authorization": (
                f"{_ALGORITHM} Credential={credentials.access_key}/{scope}, "
                f"SignedHeaders={signed}, Signature={signature}"
            ),
        }
        if token:
            headers["X-Amz-Security-Token"] = token
        return headers
