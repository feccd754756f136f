"""The key and the one-run claim of the vLLM server that ``steadyrl vllm-serve`` starts, on both sides.

On the server, ``ServerAuth`` is an ASGI middleware that vLLM loads with
``--middleware steadyrl.generation.server_auth.ServerAuth`` (``app.add_middleware``, after vLLM's own middleware, so
it is the outermost layer and sees every request before any route or other middleware does):

- Every request must carry ``Authorization: Bearer <key>`` (compared in constant time); any other gets 401 with a
  JSON body saying what is missing, and reaches nothing. The one exception is ``GET /health``, a liveness probe that
  tells only that the server is up (as the open port does) and changes nothing.
- The claim binds the server to one run: ``POST /steadyrl/claim`` with ``{"run", "output_dir", "host", "pid"}``
  takes it when it is free or already the same run's, else answers 409 naming the holder; ``POST
  /steadyrl/release`` frees it (the holder's own only); ``GET /steadyrl/claim`` shows the holder. A request that
  names another run than the holder in ``X-Steadyrl-Run`` gets 409 too. A run is its output_dir's path and the
  random id it keeps (``run_id``: ``.steadyrl-run-id``, made by its first trainer), so a restarted run of the same
  output_dir reclaims the server, and a run on another host whose output_dir has the same path does not. The claim
  lives in the server process: a restarted server is free.
- The weights: a claim that announces a push (``{"push": LABEL, "pusher": ID}``) is told whether to push (``"push":
  true``: the server holds other weights and no other process of the run is pushing LABEL), and ``POST
  /steadyrl/weights`` with ``{"run", "weights": LABEL}`` records that the holder's weights LABEL are loaded. A request
  with ``X-Steadyrl-Weights: LABEL`` (the trainer's completions) gets 412 unless this server process holds LABEL:
  a restarted server (which holds its startup weights), or one released or being pushed to, answers no completion
  with weights the trainer did not push.
- ``POST /steadyrl/lora_adapter?name=NAME`` (``server_adapters``): the claiming run's LoRA adapter, loaded for its
  completions; refused (409) to a request that does not name the holder's run.

The key is ``$STEADYRL_VLLM_SERVER_KEY``, else the first line of the file ``$STEADYRL_VLLM_SERVER_KEY_FILE``; else the
trainer reads ``default_key_file(port, host)`` (by the server's host and port), which ``steadyrl vllm-serve`` writes
(mode 0600) when given neither. The key is never logged, printed, checkpointed, or part of the run's fingerprint: only
where it came from is.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from ..cache import cache_dir
from .server_adapters import ADAPTER_PATH, AdapterError, AdapterStore, read_body

KEY_ENV = "STEADYRL_VLLM_SERVER_KEY"
KEY_FILE_ENV = "STEADYRL_VLLM_SERVER_KEY_FILE"
RUN_HEADER = "X-Steadyrl-Run"
CLAIM_PATH = "/steadyrl/claim"
RELEASE_PATH = "/steadyrl/release"
WEIGHTS_PATH = "/steadyrl/weights"
WEIGHTS_HEADER = "X-Steadyrl-Weights"
OPEN_ROUTES = {("GET", "/health")}  # reveal nothing, change nothing


LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "0.0.0.0", "::", "")
RUN_ID_NAME = ".steadyrl-run-id"


def default_key_file(port: int, host: str = "127.0.0.1") -> Path:
    """Where ``steadyrl vllm-serve --host host --port port`` writes the key it makes, and where a trainer of a server
    at ``host:port`` finds it: a server on this machine (loopback or every address) has ``port-PORT.key``, a server
    named by another host ``HOST-port-PORT.key``, so that a remote server never gets the local one's key."""
    name = f"port-{port}.key" if host in LOCAL_HOSTS else f"{host.strip('[]').replace('/', '_')}-port-{port}.key"
    return cache_dir() / "vllm-server-keys" / name


def write_new_key(path: str | os.PathLike) -> None:
    """A new random key in ``path``, readable by its owner only (mode 0600, written aside, then renamed)."""
    path = Path(path)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as file:
        file.write(secrets.token_urlsafe(32) + "\n")
    os.replace(tmp, path)


def read_key_file(path: str | os.PathLike) -> str:
    key = Path(path).read_text().strip()
    if not key:
        raise ValueError(f"{KEY_FILE_ENV}={str(path)!r} is empty: it must hold the server's key on its first line.")
    return key


@dataclass
class KeySource:
    """A key (None: none found) and, for error messages, where it came from (never the key itself)."""

    key: str | None
    where: str


def trainer_key(port: int, host: str = "127.0.0.1") -> KeySource:
    """The key a trainer sends to the server at ``host:port``: the environment's, else the key file's."""
    if os.environ.get(KEY_ENV):
        return KeySource(os.environ[KEY_ENV], f"${KEY_ENV}")
    named = os.environ.get(KEY_FILE_ENV)
    path = Path(named) if named else default_key_file(port, host)
    if path.is_file():
        return KeySource(read_key_file(path), f"the file {path}" + (f" (${KEY_FILE_ENV})" if named else ""))
    looked = f"${KEY_FILE_ENV}={named}" if named else f"${KEY_ENV}, ${KEY_FILE_ENV} or {path}"
    return KeySource(None, f"found no key ({looked})")


def server_key() -> str:
    """The key the server checks (the middleware's side)."""
    if os.environ.get(KEY_ENV):
        return os.environ[KEY_ENV]
    if os.environ.get(KEY_FILE_ENV):
        return read_key_file(os.environ[KEY_FILE_ENV])
    raise RuntimeError(
        f"steadyrl's ServerAuth middleware needs a key: set {KEY_ENV} or {KEY_FILE_ENV} in the server's environment "
        "(steadyrl vllm-serve does)."
    )


def run_id(output_dir: str | os.PathLike, create: bool = True) -> str | None:
    """The run a trainer claims the server for: ``output_dir``'s resolved path and the random id it keeps in
    ``.steadyrl-run-id`` (made there if missing), digested. The same for every process of a run and for a restarted
    run of that output_dir (or one moved to another host at the same path, id file included), and another for a run
    on another host whose output_dir has the same path (its own directory, its own id) or for a copy elsewhere.
    ``create=False``: None where output_dir has no id yet (nothing is written before a run claims a server)."""
    path = Path(output_dir) / RUN_ID_NAME
    token = read_run_token(path)
    if not create and not token:
        return None  # a run that never claimed a server
    if not token:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{RUN_ID_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        tmp.write_text(secrets.token_hex(16) + "\n")
        if token is None:  # missing: made atomically, never over an id another process made meanwhile
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
            tmp.unlink()
        else:  # empty: not written by steadyrl, which writes whole files
            os.replace(tmp, path)
        token = read_run_token(path)
    return hashlib.sha256(f"{os.path.realpath(output_dir)}\0{token}".encode()).hexdigest()[:32]


def read_run_token(path: Path) -> str | None:
    """The id in ``path`` (None: no such file)."""
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return None


def claim_body(output_dir: str | os.PathLike, run: str | None = None) -> dict:
    return dict(
        run=run or run_id(output_dir),
        output_dir=os.path.realpath(output_dir),
        host=socket.gethostname(),
        pid=os.getpid(),
        since=time.strftime("%Y-%m-%d %H:%M:%S"),
    )


def describe_holder(holder: dict) -> str:
    return (
        f"output_dir={holder.get('output_dir')!r} (process {holder.get('pid')} on host {holder.get('host')}, "
        f"claimed since {holder.get('since')})"
    )


class ServerAuth:
    """ASGI middleware: the key check on every route but ``GET /health``, and the claim routes (module docstring).

    Args:
        app: the application it guards (vLLM's).
        key: the key to require (default: ``server_key()``, from the environment).
    """

    def __init__(self, app, key: str | None = None) -> None:
        self.app = app
        self.key = (key or server_key()).encode()
        self.holder: dict | None = None
        self.weights: str | None = None  # the label of the holder's weights, once pushed to this server process
        self.pushing: dict | None = None  # {"weights": label, "by": pusher}: a push of the holder's under way
        self.started = time.strftime("%Y-%m-%d %H:%M:%S")
        self.adapters = AdapterStore()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            return await self.app(scope, receive, send)
        from starlette.datastructures import Headers

        method, path = scope.get("method", "GET"), scope["path"].removeprefix(scope.get("root_path", ""))
        if scope["type"] == "http" and (method, path) in OPEN_ROUTES:
            return await self.app(scope, receive, send)
        headers = Headers(scope=scope)
        problem = self.key_problem(headers.get("authorization"))
        if problem is not None:
            return await reply(scope, receive, send, 401, {"error": problem})
        if path == CLAIM_PATH and method == "POST":
            return await self.claim(scope, receive, send)
        if path == CLAIM_PATH and method == "GET":
            return await reply(scope, receive, send, 200, self.state())
        if path == RELEASE_PATH and method == "POST":
            body = await read_json(receive)
            released = self.holder is not None and self.holder.get("run") == body.get("run")
            if released:
                self.holder, self.weights, self.pushing = None, None, None
            return await reply(scope, receive, send, 200, {"released": released})
        if path == WEIGHTS_PATH and method == "POST":
            return await self.record_weights(scope, receive, send)
        run = headers.get(RUN_HEADER.lower())
        if run is not None and self.holder is not None and run != self.holder.get("run"):
            return await reply(scope, receive, send, 409, self.refusal())
        expected = headers.get(WEIGHTS_HEADER.lower())
        if expected is not None and expected != self.weights:
            return await reply(scope, receive, send, 412, self.without_weights(expected))
        if path == ADAPTER_PATH and method == "POST":
            return await self.load_adapter(scope, receive, send, run)
        return await self.app(scope, receive, send)

    async def load_adapter(self, scope, receive, send, run: str | None) -> None:
        if self.holder is None or run != self.holder.get("run"):
            problem = {
                "error": f"only the run that claimed the server loads adapters: send {RUN_HEADER} after "
                f"POST {CLAIM_PATH}"
            }
            return await reply(scope, receive, send, 409, problem)
        try:
            answer = await self.adapters.load(scope["app"], scope.get("query_string", b""), await read_body(receive))
        except AdapterError as err:
            return await reply(scope, receive, send, err.status, {"error": str(err)})
        return await reply(scope, receive, send, 200, answer)

    def key_problem(self, authorization: str | None) -> str | None:
        """Why ``authorization`` does not pass (None: it does)."""
        scheme, _, given = (authorization or "").partition(" ")
        if not authorization or scheme.lower() != "bearer":
            return (
                "missing key: send the header 'Authorization: Bearer <key>' with the key steadyrl vllm-serve "
                f"printed (${KEY_ENV} or its key file)"
            )
        if not hmac.compare_digest(given.strip().encode(), self.key):
            return f"wrong key: this server checks another key than the one sent (${KEY_ENV} or its key file)"
        return None

    async def claim(self, scope, receive, send) -> None:
        body = await read_json(receive)
        if not isinstance(body.get("run"), str):
            return await reply(scope, receive, send, 400, {"error": "a claim names its run: {'run': ..., ...}"})
        # no await between the check and the assignment: claims cannot interleave on the event loop
        if self.holder is not None and self.holder.get("run") != body["run"]:
            return await reply(scope, receive, send, 409, self.refusal())
        self.holder = {name: body.get(name) for name in ("run", "output_dir", "host", "pid", "since")}
        answer = self.state()
        if isinstance(body.get("push"), str):
            answer["push"] = self.take_push(body["push"], str(body.get("pusher")))
        return await reply(scope, receive, send, 200, answer)

    def take_push(self, label: str, pusher: str) -> bool:
        """Whether ``pusher`` is to push the holder's weights ``label``: not where they are loaded, nor while another
        process of the run pushes them (that one records them, and the others wait for it). Completions expecting
        other weights are refused from here on."""
        if self.weights == label:
            return False
        if self.pushing is not None and self.pushing["weights"] == label and self.pushing["by"] != pusher:
            return False
        self.weights, self.pushing = None, {"weights": label, "by": pusher}
        return True

    async def record_weights(self, scope, receive, send) -> None:
        body = await read_json(receive)
        if self.holder is None or body.get("run") != self.holder.get("run") or not isinstance(body.get("weights"), str):
            problem = {"error": f"only the run that claimed the server records its weights: POST {CLAIM_PATH} first"}
            return await reply(scope, receive, send, 409, problem)
        self.weights, self.pushing = body["weights"], None
        return await reply(scope, receive, send, 200, self.state())

    def state(self) -> dict:
        return {"holder": self.holder, "weights": self.weights, "started": self.started}

    def refusal(self) -> dict:
        return {"error": f"claimed by another run: {describe_holder(self.holder)}", "holder": self.holder}

    def without_weights(self, expected: str) -> dict:
        if self.holder is None:
            why = "it started anew, or its run released it, since: it holds no run's weights"
        else:
            why = "the run's weights are not pushed to it" if self.weights is None else f"it holds {self.weights}"
        return {
            "error": f"this server (started {self.started}) does not hold the weights {expected} the request expects: "
            f"{why}; claim it and push them (POST {CLAIM_PATH} with 'push')",
            **self.state(),
        }


async def read_json(receive) -> dict:
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    try:
        body = json.loads(b"".join(chunks) or b"{}")
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


async def reply(scope, receive, send, status: int, body: dict) -> None:
    if scope["type"] == "websocket":  # refuse the handshake (the client sees 403)
        from starlette.websockets import WebSocketClose

        return await WebSocketClose(code=1008)(scope, receive, send)
    from starlette.responses import JSONResponse

    await JSONResponse(body, status_code=status)(scope, receive, send)
