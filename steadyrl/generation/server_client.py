"""A small HTTP client for a running ``vllm serve``: its health, its settings, token-in token-out completions, the
development-mode routes the weight push uses, and steadyrl's claim of the server for one run (``server_auth``).
Every request carries the server's key and, once a run is named, its id. Standard library only (``urllib``): no proxy
for a server on this machine, and no redirect followed (it would carry the key to wherever it points)."""

from __future__ import annotations

import contextlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from .server_adapters import ADAPTER_PATH
from .server_auth import (
    CLAIM_PATH,
    KEY_ENV,
    KEY_FILE_ENV,
    LOCAL_HOSTS,
    RELEASE_PATH,
    RUN_HEADER,
    WEIGHTS_HEADER,
    WEIGHTS_PATH,
    KeySource,
    claim_body,
    describe_holder,
    run_id,
    trainer_key,
)

GENERATE_PATH = "/inference/v1/generate"  # vLLM's token-in token-out route, which takes images
SERVE_HINT = "start one with 'steadyrl vllm-serve --model MODEL --port PORT' (docs/vllm-server.md)"


class VLLMServerError(RuntimeError):
    """The vLLM server could not be reached (``unreachable``: no answer at all), or refused or failed a request, or
    serves something else than the trainer needs."""

    def __init__(self, message: str, unreachable: bool = False, status: int | None = None) -> None:
        super().__init__(message)
        self.unreachable = unreachable
        self.status = status  # the HTTP status of a refusal


class NoRedirects(urllib.request.HTTPRedirectHandler):
    """Leaves a redirect unfollowed: urllib would send the request, ``Authorization`` header included, to its
    target; the 3xx answer comes back as an error instead."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


def opener(host: str | None) -> urllib.request.OpenerDirector:
    """urllib's opener without redirects, and without the environment's proxies for a server on this machine (a
    proxy would see the key and answer for a server it cannot reach)."""
    proxies = urllib.request.ProxyHandler({}) if (host or "") in LOCAL_HOSTS else urllib.request.ProxyHandler()
    return urllib.request.build_opener(proxies, NoRedirects)


class ServerClient:
    """JSON over HTTP to one vLLM server.

    Args:
        base_url: the server's address, e.g. ``"http://127.0.0.1:8000"``.
        timeout: seconds to wait for any one answer.
        key: the server's key and where it came from (default: ``trainer_key`` for the URL's port).
        output_dir: the run the requests are for (``claim`` binds the server to it); None: no run.

    Example::

        client = ServerClient("http://127.0.0.1:8000", timeout=240, output_dir="out/run")
        client.health()
        client.claim()
        settings = client.model_settings()
    """

    def __init__(
        self, base_url: str, timeout: float, key: KeySource | None = None, output_dir: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        url = urlparse(self.base_url)
        self.port, self.host = url.port or (443 if url.scheme == "https" else 80), url.hostname or ""
        self.key_given = key is not None
        self.key = key if key is not None else trainer_key(self.port, self.host)
        self.output_dir = output_dir
        self.opener = opener(url.hostname)
        self._run: str | None = None
        self.weights: str | None = None  # the label of the run's weights its completions expect (None: any)

    def reload_key(self) -> None:
        """Read the key again where it was found (a restarted ``steadyrl vllm-serve`` writes a new one to its port's
        key file); a key given to the client stays."""
        if not self.key_given:
            self.key = trainer_key(self.port, self.host)

    @property
    def run(self) -> str | None:
        """The id of the run the requests are for (``run_id`` of ``output_dir``); None until output_dir has one
        (its first claim makes it)."""
        if self._run is None and self.output_dir is not None:
            self._run = run_id(self.output_dir, create=False)
        return self._run

    def headers(self, content_type: str = "application/json") -> dict[str, str]:
        headers: dict[str, str] = {"Content-Type": content_type}
        if self.key.key is not None:
            headers["Authorization"] = f"Bearer {self.key.key}"
        if self.output_dir is not None:  # a run without an id yet holds no claim: refused while another run does
            headers[RUN_HEADER] = self.run or "unclaimed"
        return headers

    def request(
        self, method: str, path: str, body: dict | bytes | None = None, what: str = "", headers: dict | None = None
    ) -> Any:
        """The decoded JSON answer of ``method path`` with a JSON ``body`` (or raw bytes) and ``headers`` besides the
        key's and the run's (``None`` for an empty answer); ``VLLMServerError`` otherwise."""
        raw_body = isinstance(body, bytes)
        data = body if raw_body or body is None else json.dumps(body).encode()
        headers = {**self.headers("application/octet-stream" if raw_body else "application/json"), **(headers or {})}
        req = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)
        doing = what or f"{method} {path}"
        try:
            with self.opener.open(req, timeout=self.timeout) as response:
                raw, status = response.read(), response.status
        except urllib.error.HTTPError as err:
            if 300 <= err.code < 400:
                raise VLLMServerError(
                    f"the vLLM server at {self.base_url} answered {doing} with a redirect ({err.code}) to "
                    f"{err.headers.get('Location')!r}: steadyrl follows none (the request carries the server's key). "
                    "Set vllm_server_base_url to the address the server itself answers at",
                    status=err.code,
                ) from err
            raise self.refusal(err.code, err.read().decode(errors="replace")[:500], doing) from err
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise VLLMServerError(
                f"no vLLM server answers at {self.base_url} ({doing}: {type(reason).__name__}: {reason}); "
                f"{SERVE_HINT}, or set vllm_server_base_url (or vllm_server_host and vllm_server_port) to where it "
                "runs",
                unreachable=True,
            ) from err
        if not raw.strip():
            return None
        try:
            return json.loads(raw)
        except ValueError as err:
            raise VLLMServerError(
                f"the answer of {self.base_url + path} ({doing}, status {status}) is not JSON: "
                f"{raw[:200].decode(errors='replace')!r}; is vllm_server_base_url a vLLM server started by steadyrl "
                "vllm-serve (and not a proxy or another service)?",
                status=status,
            ) from err

    def refusal(self, status: int, detail: str, doing: str) -> VLLMServerError:
        """The error for an HTTP error answer: a wrong or missing key and a server claimed by another run say how to
        go on."""
        try:
            answer = json.loads(detail)
        except ValueError:
            answer = {}
        answer = answer if isinstance(answer, dict) else {}
        if status == 401:
            sent = f"sent the key from {self.key.where}" if self.key.key else self.key.where
            return VLLMServerError(
                f"the vLLM server at {self.base_url} refused the trainer's key (401 to {doing}: "
                f"{answer.get('error', detail)}); the "
                f"trainer {sent}. Give it the server's key: {KEY_ENV}=<the content of the key file steadyrl "
                f"vllm-serve named as it started>, or {KEY_FILE_ENV}=<a copy of that file>",
                status=status,
            )
        if status == 409 and isinstance(answer.get("holder"), dict):
            return VLLMServerError(
                f"the vLLM server at {self.base_url} serves another run, {describe_holder(answer['holder'])}: one "
                "server serves one run, whose weights it holds. Point this run at another server (steadyrl "
                "vllm-serve --port ANOTHER_PORT), or wait for that run to end (it releases the server); if it was "
                "killed, restart the server, or resume that run (the same output_dir claims it again)",
                status=status,
            )
        if status == 412:
            return VLLMServerError(
                f"the vLLM server at {self.base_url} refused {doing} without this run's weights: "
                f"{answer.get('error', detail)}",
                status=status,
            )
        return VLLMServerError(
            f"the vLLM server at {self.base_url} answered {status} to {doing}: {detail}", status=status
        )

    def claim(self, push: str | None = None, pusher: str = "") -> dict:
        """Bind the server to this client's run (``output_dir``): refused while another run holds it. With ``push``
        (the label of the weights this process is about to push, ``pusher`` its id), the answer's ``push`` says
        whether to push them (``server_auth``); its ``weights`` is the label of the weights the server holds."""
        self._run = run_id(self.output_dir)
        body = claim_body(self.output_dir, self.run)
        if push is not None:
            body.update(push=push, pusher=pusher)
        with self.claims_routed():
            return self.request("POST", CLAIM_PATH, body, what="claiming it for this run") or {}

    def pushed(self, label: str) -> None:
        """Tell the server that it holds this run's weights ``label`` (completions expecting them pass from now)."""
        self.request("POST", WEIGHTS_PATH, {"run": self.run, "weights": label}, what="recording the run's weights")

    def claim_state(self) -> dict:
        """The server's holder and the label of the weights it holds."""
        return self.request("GET", CLAIM_PATH, what="reading its claim") or {}

    def check_unclaimed(self) -> None:
        """Refuse a server another run holds, without claiming it (a trainer claims as it first pushes weights, with
        output_dir locked)."""
        with self.claims_routed():
            holder = (self.request("GET", CLAIM_PATH, what="reading its claim") or {}).get("holder")
        if isinstance(holder, dict) and holder.get("run") != self.run:
            raise self.refusal(409, json.dumps({"holder": holder}), "reading its claim")

    @contextlib.contextmanager
    def claims_routed(self) -> Iterator[None]:
        """A server without the claim routes: say that it is not guarded."""
        try:
            yield
        except VLLMServerError as err:
            if err.status == 404:
                raise VLLMServerError(
                    f"the vLLM server at {self.base_url} checks no key and takes no claim (no {CLAIM_PATH} route: "
                    "it was not started by steadyrl vllm-serve): anyone who reaches it could replace its weights "
                    "through its development routes, and another run could share it. Start it with 'steadyrl "
                    "vllm-serve', or add --middleware steadyrl.generation.server_auth.ServerAuth and a key "
                    "(docs/vllm-server.md)"
                ) from err
            raise

    def release(self) -> None:
        """Free the server for other runs (this run's claim only). Best effort: where it fails (the server is down),
        the claim stays until this run resumes or the server restarts."""
        if self.run is None:
            return
        try:
            self.request("POST", RELEASE_PATH, {"run": self.run}, what="releasing it")
        except VLLMServerError:
            pass

    def health(self) -> None:
        self.request("GET", "/health", what="the health check")

    def model_settings(self) -> dict:
        """The served model's configuration (vLLM's ``model_config``), from the development-mode ``/server_info``."""
        return self.server_settings()["model_config"]

    def server_settings(self) -> dict:
        """The server's ``vllm_config`` (``model_config``, ``lora_config``, ...), from the development-mode
        ``/server_info``."""
        try:
            info = self.request("GET", "/server_info?config_format=json", what="reading its settings")
        except VLLMServerError as err:
            if err.status == 404:
                raise VLLMServerError(
                    f"the vLLM server at {self.base_url} runs without its development routes (/server_info, "
                    "/collective_rpc), which steadyrl needs to check its model and push weights: start it with "
                    "VLLM_SERVER_DEV_MODE=1 in its environment (steadyrl vllm-serve does)"
                ) from err
            raise
        return info["vllm_config"]

    def complete(self, body: dict) -> dict:
        """One ``/v1/completions`` answer's first choice; refused (412) unless the server holds ``self.weights``."""
        expect = {WEIGHTS_HEADER: self.weights} if self.weights is not None else None
        return self.request("POST", "/v1/completions", body, what="a completion request", headers=expect)["choices"][0]

    def generate_tokens(self, body: dict) -> dict:
        """One answer of vLLM's token-in token-out route (``/inference/v1/generate``: token ids with images, which
        ``/v1/completions`` does not take); refused (412) unless the server holds ``self.weights``."""
        expect = {WEIGHTS_HEADER: self.weights} if self.weights is not None else None
        try:
            return self.request("POST", GENERATE_PATH, body, what="a completion request with images", headers=expect)
        except VLLMServerError as err:
            if err.status in (403, 404):  # vLLM serves the route with --enable-scale-out only
                raise VLLMServerError(
                    f"the vLLM server at {self.base_url} does not take prompts with images ({GENERATE_PATH} answered "
                    f"{err.status}): start it with 'steadyrl vllm-serve --model MODEL', which serves a "
                    "vision-language model with that route (vLLM's --enable-scale-out)",
                    status=err.status,
                ) from err
            raise

    def wait_until_up(self, deadline: float, poll: float = 1.0) -> None:
        """Return once ``/health`` answers; ``VLLMServerError`` (``unreachable``) if it has not by ``deadline``
        (``time.monotonic()``)."""
        while True:
            try:
                return self.health()
            except VLLMServerError:
                if time.monotonic() + poll > deadline:
                    raise
            time.sleep(poll)

    def load_adapter(self, name: str, blob: bytes) -> None:
        """Have the server serve the LoRA adapter ``blob`` (``lora_sync.adapter_bytes``) as the model ``name``, in
        place of the adapter it served before (``server_adapters``)."""
        self.request("POST", f"{ADAPTER_PATH}?name={name}", blob, what=f"loading the LoRA adapter {name}")

    def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> Any:
        return self.request("POST", "/collective_rpc", {"method": method, "kwargs": kwargs}, what=f"{method}()")

    def reset_prefix_cache(self) -> None:
        """After new weights: the prefix cache, and the encoder cache (a vision tower's image embeddings, which vLLM
        would otherwise reuse for an image it saw under the old weights). A server without the encoder cache's route
        (vLLM before 0.11) has none to reset."""
        answer = self.request("POST", "/reset_prefix_cache", {}, what="resetting its prefix cache")
        if answer is not None and not answer.get("success", True):
            raise VLLMServerError(f"the vLLM server at {self.base_url} could not reset its prefix cache: {answer}")
        try:
            self.request("POST", "/reset_encoder_cache", {}, what="resetting its encoder cache")
        except VLLMServerError as err:
            if err.status != 404:
                raise
