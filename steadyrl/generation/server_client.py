"""A small HTTP client for a running ``vllm serve``: its health, its settings, token-in token-out completions and the
development-mode routes the weight push uses. Standard library only (``urllib``)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

SERVE_HINT = "start one with 'steadyrl vllm-serve --model MODEL --port PORT' (README: 'vLLM as a separate server')"


class VLLMServerError(RuntimeError):
    """The vLLM server could not be reached (``unreachable``: no answer at all), or refused or failed a request, or
    serves something else than the trainer needs."""

    def __init__(self, message: str, unreachable: bool = False) -> None:
        super().__init__(message)
        self.unreachable = unreachable


class ServerClient:
    """JSON over HTTP to one vLLM server.

    Args:
        base_url: the server's address, e.g. ``"http://127.0.0.1:8000"``.
        timeout: seconds to wait for any one answer.

    Example::

        client = ServerClient("http://127.0.0.1:8000", timeout=240)
        client.health()
        settings = client.model_settings()
    """

    def __init__(self, base_url: str, timeout: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def request(self, method: str, path: str, body: dict | None = None, what: str = "") -> Any:
        """The decoded JSON answer of ``method path`` (``None`` for an empty one); ``VLLMServerError`` otherwise."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, method=method, headers={"Content-Type": "application/json"}
        )
        doing = what or f"{method} {path}"
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as err:
            detail = err.read().decode(errors="replace")[:500]
            raise VLLMServerError(
                f"the vLLM server at {self.base_url} answered {err.code} to {doing}: {detail}"
            ) from err
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise VLLMServerError(
                f"no vLLM server answers at {self.base_url} ({doing}: {type(reason).__name__}: {reason}); "
                f"{SERVE_HINT}, or set vllm_server_base_url (or vllm_server_host and vllm_server_port) to where it "
                "runs",
                unreachable=True,
            ) from err
        return json.loads(raw) if raw.strip() else None

    def health(self) -> None:
        self.request("GET", "/health", what="the health check")

    def model_settings(self) -> dict:
        """The served model's configuration (vLLM's ``model_config``), from the development-mode ``/server_info``."""
        try:
            info = self.request("GET", "/server_info?config_format=json", what="reading its settings")
        except VLLMServerError as err:
            if " answered 404 " in str(err):
                raise VLLMServerError(
                    f"the vLLM server at {self.base_url} runs without its development routes (/server_info, "
                    "/collective_rpc), which steadyrl needs to check its model and push weights: start it with "
                    "VLLM_SERVER_DEV_MODE=1 in its environment (steadyrl vllm-serve does)"
                ) from err
            raise
        return info["vllm_config"]["model_config"]

    def complete(self, body: dict) -> dict:
        """One ``/v1/completions`` answer's first choice."""
        return self.request("POST", "/v1/completions", body, what="a completion request")["choices"][0]

    def collective_rpc(self, method: str, kwargs: dict[str, Any]) -> Any:
        return self.request("POST", "/collective_rpc", {"method": method, "kwargs": kwargs}, what=f"{method}()")

    def reset_prefix_cache(self) -> None:
        answer = self.request("POST", "/reset_prefix_cache", {}, what="resetting its prefix cache")
        if answer is not None and not answer.get("success", True):
            raise VLLMServerError(f"the vLLM server at {self.base_url} could not reset its prefix cache: {answer}")
