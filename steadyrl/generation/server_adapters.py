"""The server side of adapter-only sync (``vllm_lora_sync``): ``POST /steadyrl/lora_adapter?name=NAME``, a route of
steadyrl's middleware (``server_auth.ServerAuth``: the key and the run's claim are checked first).

The trainer may be on another host, so the adapter travels in the request: its body is one safetensors file, the
adapter's tensors with its ``adapter_config.json`` in the metadata (``lora_sync.adapter_bytes``). The route writes
them as PEFT's two files into a directory of the server's (removed when the server ends), unloads the adapters it
loaded before (the run's previous version, or those of a run that was killed) and loads the new one through vLLM's
own ``OpenAIServingModels.load_lora_adapter``, in the server process: vLLM's ``/v1/load_lora_adapter`` route is not
needed (nor ``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, which would open it to any path on the server). Completions then
name the adapter as their ``model``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
from urllib.parse import parse_qs

from .engine_dir import EngineDir
from .lora_sync import ADAPTER_CONFIG_KEY

ADAPTER_PATH = "/steadyrl/lora_adapter"
ADAPTER_PREFIX = "steadyrl-"  # the names of the adapters this route loads
NAME_PATTERN = re.compile(r"steadyrl-[A-Za-z0-9._-]{1,100}")
MAX_ADAPTER_BYTES = 8 * 2**30


class AdapterError(Exception):
    """A request the route refuses: its HTTP status and what to tell the trainer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def adapter_config(blob: bytes) -> dict:
    """The ``adapter_config`` entry of a safetensors blob's metadata."""
    try:
        (size,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + size])
        return json.loads(header["__metadata__"][ADAPTER_CONFIG_KEY])
    except (struct.error, ValueError, KeyError, TypeError) as err:
        raise AdapterError(400, f"the body is not a safetensors adapter with its {ADAPTER_CONFIG_KEY}: {err}") from err


class AdapterStore:
    """The adapters the route wrote and loaded, in one directory of the server process."""

    def __init__(self) -> None:
        self.directory: EngineDir | None = None

    def write(self, name: str, blob: bytes) -> str:
        config = adapter_config(blob)
        if self.directory is None:
            self.directory = EngineDir()
        path = os.path.join(self.directory.name, name)
        shutil.rmtree(path, ignore_errors=True)
        os.makedirs(path)
        with open(os.path.join(path, "adapter_model.safetensors"), "wb") as file:
            file.write(blob)
        with open(os.path.join(path, "adapter_config.json"), "w") as file:
            json.dump(config, file)
        return path

    def remove_others(self, keep: str) -> None:
        for entry in os.scandir(self.directory.name):
            if entry.is_dir() and entry.name != keep:
                shutil.rmtree(entry.path, ignore_errors=True)

    async def load(self, app, query: bytes, blob: bytes) -> dict:
        """Write and load the adapter ``name`` of ``query``; the answer says what was loaded."""
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest, UnloadLoRAAdapterRequest

        name = parse_qs(query.decode()).get("name", [""])[0]
        if not NAME_PATTERN.fullmatch(name):
            raise AdapterError(400, f"name={name!r} is invalid: steadyrl-<letters, digits, . _ ->")
        serving = getattr(app.state, "openai_serving_models", None)
        if serving is None or getattr(serving.engine_client.vllm_config, "lora_config", None) is None:
            raise AdapterError(
                400,
                "this server serves no LoRA adapters: start it with steadyrl vllm-serve "
                "--max-lora-rank R (R: the run's LoRA rank)",
            )
        path = self.write(name, blob)
        for old in [
            request for request in serving.lora_requests.values() if request.lora_name.startswith(ADAPTER_PREFIX)
        ]:
            await serving.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=old.lora_name))
            await serving.engine_client.remove_lora(old.lora_int_id)
        answer = await serving.load_lora_adapter(LoadLoRAAdapterRequest(lora_name=name, lora_path=path))
        if isinstance(answer, ErrorResponse):
            shutil.rmtree(path, ignore_errors=True)
            raise AdapterError(400, f"vLLM could not load the adapter: {answer.error.message}")
        self.remove_others(keep=name)
        return {"name": name, "path": path, "bytes": len(blob)}


async def read_body(receive, limit: int = MAX_ADAPTER_BYTES) -> bytes:
    chunks, more, size = [], True, 0
    while more:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise AdapterError(413, f"the adapter is larger than {limit} bytes")
        chunks.append(chunk)
        more = message.get("more_body", False)
    return b"".join(chunks)
