"""Plain HTTP servers of the standard library on 127.0.0.1: one with a fixed answer (a proxy, a redirect, or a
service that is not a vLLM server, for the tests of the vLLM server's client,
tests/unit/generation/test_server_client.py, and its error table rows), and a reward service that answers
errors or refuses connections for a while (tests/integration/resume/test_faults.py)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
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


class RewardService:
    """A reward service on 127.0.0.1 that a reward function calls over HTTP: POST ``/score`` with a JSON object
    answers ``{"scores": score(that object)}``. It can misbehave as a real one does: ``fail(n, status)`` answers the
    next ``n`` requests with that status, ``down_for(seconds)`` closes its port (connections are refused) and opens
    it again on the same port after ``seconds``. ``answered`` lists the status of each request it got."""

    def __init__(self, score: Callable[[dict], list]) -> None:
        self.score, self.failures, self.answered = score, [], []
        self.lock, self.reopening = threading.Lock(), None
        self.server = self._serve(0)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/score"

    def _serve(self, port: int) -> ThreadingHTTPServer:
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with service.lock:
                    status = service.failures.pop(0) if service.failures else 200
                    service.answered.append(status)
                body = json.dumps({"scores": service.score(request)} if status == 200 else {"error": "overloaded"})
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def fail(self, count: int, status: int = 500) -> None:
        with self.lock:
            self.failures += [status] * count

    def down_for(self, seconds: float) -> None:
        port = self.server.server_address[1]
        self.close()

        def reopen() -> None:
            self.server = self._serve(port)

        self.reopening = threading.Timer(seconds, reopen)
        self.reopening.daemon = True
        self.reopening.start()

    def close(self) -> None:
        if self.reopening is not None:
            self.reopening.cancel()
            self.reopening.join()
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def reward_service(score: Callable[[dict], list]) -> Iterator[RewardService]:
    service = RewardService(score)
    try:
        yield service
    finally:
        service.close()
