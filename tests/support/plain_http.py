"""A plain HTTP server of the standard library on 127.0.0.1 with a fixed answer: a proxy, a redirect, or a service
that is not a vLLM server, for the tests of the vLLM server's client (tests/generation/test_server_client.py) and
its error table rows."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@contextmanager
def http_server(status: int = 200, body: bytes = b'{"version": "0.32.0"}', headers: dict | None = None) -> Iterator:
    """A server on 127.0.0.1 answering every GET with ``status``, ``headers`` and ``body``; ``.seen`` lists the
    (path, Authorization header) of each request it got."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.server.seen.append((self.path, self.headers.get("Authorization")))
            self.send_response(status)
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.seen = []
    server.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
