"""A plain HTTP forward proxy for the tests: a client configured with it sends
``METHOD http://host:port/path`` here, and it forwards the request to where
``routes`` says that host is. A host only the routes know (``*.invalid``) cannot be
reached but through the proxy, so a process that does not use it fails. The
request reaches the service with the service's own host name (an emulator that
reads an account from the host, as Azurite does, sees its usual one)."""

from __future__ import annotations

import http.client
import ssl
import threading
from collections import Counter
from collections.abc import Callable
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from tests.helpers import Served

Answer = tuple[int, dict[str, str], bytes]

_HOP_BY_HOP = {"connection", "proxy-connection", "keep-alive", "proxy-authorization"}


class ForwardProxy(Served):
    """``with ForwardProxy({"queue.invalid": ("127.0.0.1", 10001)}) as proxy:``;
    ``proxy.url`` to configure a client with, ``proxy.forwarded`` counts the
    requests it forwarded by method. ``tls``: (certificate, key) files, for a proxy
    that clients reach over TLS (``https://``); ``client_ca``: the CA whose client
    certificates it requires there. ``answer_first``: called with each request's
    headers; an (status, headers, body) it returns is the answer, and the request
    goes no further (``proxy.refused`` counts them)."""

    def __init__(
        self,
        routes: dict[str, tuple[str, int]],
        tls: tuple[Path, Path] | None = None,
        client_ca: Path | None = None,
        answer_first: Callable[[Message], Answer | None] | None = None,
    ) -> None:
        self.routes = routes
        self.answer_first = answer_first
        self.refused = 0  # requests answer_first answered
        self.forwarded: Counter[str] = Counter()
        self._counts_lock = threading.Lock()  # guards forwarded
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _forward(self) -> None:
                target = urlsplit(self.path)
                route = proxy.routes.get(target.hostname or "")
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                if route is None:
                    self.send_error(502, f"no route to {target.hostname}")
                    return
                own = proxy.answer_first(self.headers) if proxy.answer_first else None
                if own is not None:  # the service behind it would answer so (a gateway's rule)
                    status, extra, data = own
                    with proxy._counts_lock:
                        proxy.refused += 1
                    self.send_response(status)
                    for name, value in {**extra, "Content-Length": str(len(data))}.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                    return
                headers = {
                    k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP | {"host"}
                }
                headers["Host"] = f"{route[0]}:{route[1]}"  # the service's own name for itself
                upstream = http.client.HTTPConnection(*route, timeout=30)
                try:
                    path = target.path + (f"?{target.query}" if target.query else "")
                    upstream.request(self.command, path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                with proxy._counts_lock:
                    proxy.forwarded[self.command] += 1
                self.send_response(answer.status, answer.reason)
                for name, value in answer.getheaders():
                    if name.lower() not in _HOP_BY_HOP | {"content-length", "transfer-encoding"}:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        scheme = "http"
        if tls is not None:  # a TLS proxy: clients speak TLS to it (certificate, key)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*tls)
            if client_ca is not None:  # and present a certificate this CA signed
                context.verify_mode = ssl.CERT_REQUIRED
                context.load_verify_locations(cafile=client_ca)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="forward-proxy", daemon=True
        )

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
