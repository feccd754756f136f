"""Where the vLLM server of ``vllm_mode='server'`` is, what it must serve, and the check that it does
(``check_server``: before any work, and again when it answers after going away during a run)."""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass
from urllib.parse import urlparse

from .. import compat
from .lora_sync import CPU_COST
from .server_client import ServerClient, VLLMServerError

logger = logging.getLogger(__name__.rsplit(".", 1)[0] + ".vllm_server")  # the server backend says what it does


@dataclass
class ServerSettings:
    base_url: str
    timeout: float
    weight_transfer: str  # 'file' or 'nccl'
    weights_dir: str
    group_host: str  # the trainer's address for the NCCL rendezvous
    group_port: int
    model: str  # the trainer's model, as the server should name it
    max_model_len: int  # the context the run needs
    dtype: str  # the dtype the server should compute in
    logprobs_mode: str
    output_dir: str  # the run the server is claimed for
    concurrency: int = 64  # requests in flight at once
    adapter_rank: int | None = None  # adapter-only sync of a LoRA actor of this rank; None: merged weights
    adapter_required: bool = False  # vllm_lora_sync='adapter': no fallback to merged weights
    weights_per_run: bool = False  # a chosen vllm_server_weights_dir, which runs may share: each its run-<id>/


def listed(value: str | list[str] | tuple[str, ...]) -> list[str]:
    """The entries of a comma-separated string, or of a list of them."""
    items = value.split(",") if isinstance(value, str) else value
    return [str(item).strip() for item in items if str(item).strip()]


def server_urls(base_url: str | list[str] | None, host: str | list[str], port: int) -> list[str]:
    """``vllm_server_base_url``, or ``http://host:port`` (TRL's precedence); several servers where either lists
    several (comma-separated, or a list)."""
    if base_url:
        return [url.rstrip("/") for url in listed(base_url)]
    return [f"http://{name}:{port}" for name in listed(host)]


def server_url(base_url: str | None, host: str, port: int) -> str:
    """The first server's URL (``server_urls``)."""
    return server_urls(base_url, host, port)[0]


def server_settings(
    args, config, max_model_len: int, dtype: str, logprobs_mode: str, url: str | None = None
) -> ServerSettings:
    """Where the vLLM server of ``vllm_mode='server'`` is (``url``: one of several), and what it must serve."""
    weights_dir = args.vllm_server_weights_dir or os.path.join(args.output_dir, "vllm-server-weights")
    return ServerSettings(
        base_url=url or server_url(args.vllm_server_base_url, args.vllm_server_host, args.vllm_server_port),
        timeout=args.vllm_server_timeout,
        weight_transfer=args.vllm_server_weight_transfer,
        weights_dir=weights_dir,
        weights_per_run=bool(args.vllm_server_weights_dir),
        group_host=group_host(args.vllm_server_base_url, args.vllm_server_host),
        group_port=args.vllm_group_port,
        model=config._name_or_path,
        max_model_len=max_model_len,
        dtype=dtype,
        logprobs_mode=logprobs_mode,
        output_dir=args.output_dir,
    )


def group_host(base_url: str | None, host: str) -> str:
    """The trainer's address for the NCCL rendezvous, as the server's workers reach it: the loopback address for a
    server on this machine, else this machine's name."""
    server_host = urlparse(listed(base_url)[0]).hostname if base_url else listed(host)[0]
    return "127.0.0.1" if server_host in ("localhost", "127.0.0.1", "0.0.0.0", "::1") else socket.getfqdn()


def same_model(served: str, wanted: str) -> bool:
    """Whether the server's model path or name is the trainer's (paths compared once resolved)."""
    if os.path.isdir(served) and os.path.isdir(wanted):
        return os.path.realpath(served) == os.path.realpath(wanted)
    return served == wanted


def check_server(client: ServerClient, s: ServerSettings) -> tuple[str, dict]:
    """Refuse a server that is down, refuses the key, serves something else than the run needs or another run (not
    claiming it: a run claims it as it first pushes, with output_dir locked); return its served model name and its
    ``vllm_config`` (its ``lora_config`` None where it serves no adapters)."""
    client.health()
    version = (client.request("GET", "/version", what="reading its version") or {}).get("version", "unknown")
    # the development routes and reload_weights are vLLM internals, as in colocate mode
    compat.require_tested_version("vllm", version, f"runs the vLLM server at {client.base_url}")
    settings = client.server_settings()
    config = settings["model_config"]
    served, name = config.get("model"), (config.get("served_model_name") or config.get("model"))
    if isinstance(name, list):
        name = name[0]
    command = f"steadyrl vllm-serve --model {s.model} --max-model-len {s.max_model_len} --dtype {s.dtype}"
    if not same_model(served, s.model):
        raise VLLMServerError(
            f"the vLLM server at {client.base_url} serves {served!r}, not the trainer's model {s.model!r}: start "
            f"it with '{command}', or point vllm_server_base_url at a server of that model"
        )
    if config.get("max_model_len", 0) < s.max_model_len:
        raise VLLMServerError(
            f"the vLLM server at {client.base_url} has max_model_len={config.get('max_model_len')}, and the run needs "
            f"{s.max_model_len} (max_prompt_length + max_completion_length, or vllm_max_model_len): restart it with "
            f"--max-model-len {s.max_model_len}"
        )
    served_dtype = str(config.get("dtype", "")).removeprefix("torch.")
    if served_dtype != s.dtype:
        raise VLLMServerError(
            f"the vLLM server at {client.base_url} computes in {served_dtype}, and the run expects {s.dtype} (the "
            f"actor's dtype, or vllm_dtype): restart it with --dtype {s.dtype}, or set vllm_dtype={served_dtype!r}"
        )
    if config.get("logprobs_mode", s.logprobs_mode) != s.logprobs_mode:
        raise VLLMServerError(
            f"the vLLM server at {client.base_url} reports log-probs as {config.get('logprobs_mode')}, and the run "
            f"uses {s.logprobs_mode}: restart it with --logprobs-mode {s.logprobs_mode}"
        )
    client.check_unclaimed()
    return name, settings


def served_adapter_rank(settings: dict, s: ServerSettings, url: str) -> int | None:
    """``s.adapter_rank`` if the server (its ``vllm_config``) serves adapters of that rank, on a GPU or where
    ``vllm_lora_sync='adapter'``; else None (merged sync: logged, or refused where ``vllm_lora_sync='adapter'``)."""
    rank, lora_config = s.adapter_rank, settings.get("lora_config")
    if rank is None:
        return None
    limit = (lora_config or {}).get("max_lora_rank")
    if limit is not None and rank <= limit:
        device = settings.get("device_config") or {}
        if s.adapter_required or "cpu" not in (str(device.get("device_type", "")), str(device.get("device", ""))):
            return rank
        logger.info(
            "vllm_lora_sync='auto': pushing merged weights to the vLLM server at %s, not the adapter only: %s.",
            url,
            CPU_COST,
        )
        return None
    problem = (
        f"the server's max_lora_rank={limit} is below the adapter's rank {rank}"
        if lora_config
        else "the server serves no LoRA adapters"
    )
    fix = f"restart it with 'steadyrl vllm-serve --model {s.model} --max-lora-rank {rank} ...'"
    if s.adapter_required:
        raise VLLMServerError(
            f"vllm_lora_sync='adapter' needs the vLLM server at {url} to serve the actor's LoRA adapter, and "
            f"{problem}: {fix}, or set vllm_lora_sync='auto' or 'merged' (merged weights)"
        )
    logger.info(
        "vllm_lora_sync='auto': pushing merged weights to the vLLM server at %s, not the adapter only: %s "
        "(to push the adapter only, %s).",
        url,
        problem,
        fix,
    )
    return None
