"""A stand-in for a misconfigured vLLM server, for the error table only: it answers the requests steadyrl's
start-up check makes (``GET /health``, ``GET /version`` and the development-mode
``GET /server_info?config_format=json``) with a version and a ``model_config`` of the test's choosing, or 404 for
``/server_info`` as a server without VLLM_SERVER_DEV_MODE does. Starting a real server takes ~30 s;
tests/test_vllm_server.py checks the same refusals (another model, a shorter context) and every behaviour against
a real one."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from steadyrl.toy import toy_model_path


def model_config(**changes) -> dict:
    """What a server of the toy model started by ``steadyrl vllm-serve --max-model-len 256`` reports, changed."""
    model = toy_model_path()
    config = dict(model=model, served_model_name=model, max_model_len=256, dtype="torch.float32",
                  logprobs_mode="processed_logprobs")  # fmt: skip
    return {**config, **changes}


def start(config: dict | None, version: str = "0.32.0") -> tuple[str, ThreadingHTTPServer]:
    """(URL, server) of a stand-in of vLLM ``version`` reporting ``config`` (``None``: no development routes);
    ``server.shutdown()`` stops it."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path == "/health":
                self._answer(200, b"")
            elif self.path == "/version":
                self._answer(200, json.dumps({"version": version}).encode())
            elif self.path.startswith("/server_info") and config is not None:
                self._answer(200, json.dumps({"vllm_config": {"model_config": config}}).encode())
            else:
                self._answer(404, b'{"detail": "Not Found"}')

        def _answer(self, code: int, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server
