"""A stand-in for a vLLM server, for the error table and the fast tests of the key and the claim: a small Starlette
app answering the requests steadyrl makes (``GET /health``, ``GET /version``, the development-mode
``GET /server_info?config_format=json``, ``POST /collective_rpc``, ``POST /reset_prefix_cache``, and
``POST /v1/completions`` with one fixed token) with a version and a ``model_config`` of the test's
choosing, or 404 for ``/server_info`` as a server without VLLM_SERVER_DEV_MODE does. It records which weights (the
path last reloaded) answered each completion, and restarts on its port as a new server process would.

It is guarded by steadyrl's own middleware (``ServerAuth``, added with ``app.add_middleware`` as vLLM's
``--middleware`` adds it) unless ``auth=False``, and its key is written where ``steadyrl vllm-serve`` writes one
(``default_key_file(port)``), so a trainer finds it the same way. Starting a real server takes ~30 s;
tests/integration/generation/test_vllm_server.py checks the same refusals and every behaviour against a real one."""

from __future__ import annotations

import atexit
import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from steadyrl.generation.server_auth import ServerAuth, default_key_file, read_key_file, write_new_key
from steadyrl.toy import toy_model_path


def model_config(**changes) -> dict:
    """What a server of the toy model started by ``steadyrl vllm-serve --max-model-len 256`` reports, changed."""
    model = toy_model_path()
    config = dict(
        model=model,
        served_model_name=model,
        max_model_len=256,
        dtype="torch.float32",
        logprobs_mode="processed_logprobs",
    )
    return {**config, **changes}


class StandIn:
    """A running stand-in: ``url``, ``key``, the ``rpc_calls`` it received (method, kwargs), the weights it
    ``loaded`` (the last ``reload_weights`` path; None: its startup weights) and the ``answered`` completions
    (seed, the weights they were computed with); ``shutdown()`` stops it and removes its key file, ``restart()``
    starts it again on the same port, as a new server process (no claim, no weights pushed)."""

    def __init__(self, config: dict | None, version: str, auth: bool) -> None:
        self.config, self.version, self.auth = config, version, auth
        self.rpc_calls: list[tuple[str, dict]] = []
        self.answered: list[tuple[int, str | None]] = []
        self.port = 0
        self.serve(new_key=True)

    def serve(self, new_key: bool) -> None:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.key_file = default_key_file(self.port)
        if new_key:
            write_new_key(self.key_file)
            atexit.register(self.key_file.unlink, missing_ok=True)  # also where a test never shuts it down
        self.key = read_key_file(self.key_file)
        self.loaded: str | None = None
        app = Starlette(
            routes=[
                Route("/health", lambda request: Response(b""), methods=["GET"]),
                Route("/version", lambda request: JSONResponse({"version": self.version}), methods=["GET"]),
                Route("/server_info", self.server_info(self.config), methods=["GET"]),
                Route("/collective_rpc", self.collective_rpc, methods=["POST"]),
                Route("/reset_prefix_cache", lambda request: Response(b""), methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
            ]
        )
        if self.auth:
            app.add_middleware(ServerAuth, key=self.key)
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]}, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        """Stop answering (the port refuses connections), as a killed server does; the key file stays."""
        self.server.should_exit = True
        self.thread.join(timeout=10)

    def restart(self, config: dict | None = None, new_key: bool = False) -> None:
        """Start again on the same port: a new server process, reporting ``config`` if given, with a new key in its
        port's key file if ``new_key`` (as ``steadyrl vllm-serve`` without --key-file does)."""
        if self.thread.is_alive():
            self.stop()
        self.config = config or self.config
        self.serve(new_key)

    @staticmethod
    def server_info(config: dict | None):
        def answer(request: Request) -> Response:
            if config is None:  # no development routes
                return JSONResponse({"detail": "Not Found"}, status_code=404)
            return JSONResponse({"vllm_config": {"model_config": config}})

        return answer

    async def collective_rpc(self, request: Request) -> Response:
        body = await request.json()
        self.rpc_calls.append((body["method"], body.get("kwargs", {})))
        if body["method"] == "reload_weights":
            self.loaded = body.get("kwargs", {}).get("weights_path")
        return JSONResponse({"results": [None]})

    async def completions(self, request: Request) -> Response:
        """One token, the same for every prompt (the tests of the claim need an answer, not a model's); the request's
        seed is recorded with the weights that answered it."""
        self.answered.append(((await request.json()).get("seed"), self.loaded))
        return JSONResponse({"choices": [{"token_ids": [5], "logprobs": {"token_logprobs": [-0.5]}}]})

    def shutdown(self) -> None:
        self.stop()
        self.key_file.unlink(missing_ok=True)

    def server_close(self) -> None:
        """Nothing more to close (``shutdown`` closed the socket): ``http.server``'s name, kept for the callers."""


def start(config: dict | None, version: str = "0.32.0", auth: bool = True) -> tuple[str, StandIn]:
    """(URL, server) of a stand-in of vLLM ``version`` reporting ``config`` (``None``: no development routes),
    guarded by steadyrl's middleware unless ``auth=False``; ``server.shutdown()`` stops it."""
    server = StandIn(config, version, auth)
    return server.url, server
