"""Rollout generation on a separate, already running vLLM server (``vllm_mode='server'``).

The trainer checks the server before any work (it answers, takes the trainer's key, serves the trainer's model with
a long enough context, in the expected dtype and log-prob mode, and no other run holds it), claims it for its run as
it first pushes weights, with output_dir locked (``server_auth``: one server, one run; released when training or a
standalone ``evaluate()`` ends), pushes the actor's weights into it before each rollout that follows
an update (``server_weights``; for a LoRA actor whose adapter the server serves, the base weights once and then the
adapter only, over the authenticated API: ``server_adapters``), and sends one completion request per prompt row,
each with its own sampling seed, concurrently: the server batches them, and every completion depends only on its
seed and the weights, so a resumed run samples exactly what an uninterrupted one would, and the same as the
colocated engine.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import urlparse

import torch
from accelerate import PartialState

from .. import compat
from ..distributed.fsdp import is_sharded
from ..distributed.processes import on_main_process
from .base import Capabilities, Generation, GenerationBackend, SamplingSettings, trim_completion
from .lora_sync import CPU_COST, adapter_bytes, adapter_rank, adapter_state
from .server_adapters import ADAPTER_PREFIX
from .server_client import ServerClient, VLLMServerError
from .server_weights import FileTransfer, NCCLTransfer, WeightTransfer
from .vllm import engine_plan
from .weights import whole_weights

logger = logging.getLogger(__name__)


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


def server_url(base_url: str | None, host: str, port: int) -> str:
    """``vllm_server_base_url``, or ``http://host:port`` (TRL's precedence)."""
    return base_url.rstrip("/") if base_url else f"http://{host}:{port}"


def server_settings(args, config, max_model_len: int, dtype: str, logprobs_mode: str) -> ServerSettings:
    """Where the vLLM server of ``vllm_mode='server'`` is, and what it must serve."""
    weights_dir = args.vllm_server_weights_dir or os.path.join(args.output_dir, "vllm-server-weights")
    return ServerSettings(
        base_url=server_url(args.vllm_server_base_url, args.vllm_server_host, args.vllm_server_port),
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
    server_host = urlparse(base_url).hostname if base_url else host
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


class VLLMServerBackend(GenerationBackend):
    """Samples on a running vLLM server; ``sync_weights`` pushes the actor's weights into it.

    Args:
        tokenizer: the actor's tokenizer (its EOS ends completions).
        settings: the sampling settings.
        server: where the server is and what it must serve.
        transfer: how weights reach it (default: from ``server.weight_transfer``).

    Example::

        backend = VLLMServerBackend(tokenizer, SamplingSettings(max_new_tokens=64), server_settings)
        backend.sync_weights(model, version=0)
        generation = backend.generate(model, [[5, 6, 7]], seeds=[1234])
    """

    capabilities = Capabilities(returns_logprobs=True, weight_push=frozenset({"full", "adapter"}), pushes_copies=True)

    def __init__(
        self, tokenizer, settings: SamplingSettings, server: ServerSettings, transfer: WeightTransfer | None = None
    ) -> None:
        super().__init__(tokenizer, settings)
        self.server = server
        self.client = ServerClient(server.base_url, server.timeout, output_dir=server.output_dir)
        # every process checks, so that a refusal stops each of them here; the claim waits for the first push
        self.base_name, vllm_config = check_server(self.client, server)
        self.served_name = self.base_name  # the base model's name, or the adapter's in adapter-only sync
        self.adapter_rank = served_adapter_rank(vllm_config, server, server.base_url)
        self._base_synced = False  # adapter-only sync: the base weights are on the server
        self._adapter_tag = secrets.token_hex(4)  # the adapters' names: never another backend's, a killed run's
        self.claimed = False
        if transfer is None:
            transfer = (
                NCCLTransfer(self.client, server.group_host, server.group_port)
                if server.weight_transfer == "nccl"
                else FileTransfer(self.client, server.weights_dir, server.weights_per_run)
            )
        self.transfer = transfer
        self._synced_version: int | None = None
        self.pushes = 0

    @classmethod
    def from_config(cls, args, tokenizer, model, device, logprob_temperature):
        # the server's device is checked when it answers (served_adapter_rank)
        plan = engine_plan(args, model, logprob_temperature, False, cls.capabilities.weight_push)
        server = server_settings(args, plan.config, plan.max_model_len, plan.dtype, plan.logprobs_mode)
        server.adapter_rank = adapter_rank(model) if plan.adapter_only else None
        server.adapter_required = args.vllm_lora_sync == "adapter"
        return cls(tokenizer, SamplingSettings.from_config(args), server)

    @property
    def max_model_len(self) -> int:
        return self.server.max_model_len

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        if version == self._synced_version:
            return
        if self.adapter_rank is not None and is_sharded(model):
            logger.info(
                "vllm_lora_sync: pushing merged weights to the vLLM server, not the adapter only: the actor "
                "is sharded by FSDP2, whose adapter steadyrl does not gather alone."
            )
            self.adapter_rank, self.served_name = None, self.base_name
        adapter_only = self.adapter_rank is not None
        name = f"{ADAPTER_PREFIX}{self._adapter_tag}-v{version}-{self.pushes}"
        # The main process pushes; the others wait for its outcome (no process generates before the server holds
        # the new weights), and a failed push raises on every process at once instead of leaving them at a barrier.
        with contextlib.ExitStack() as stack:
            weights = None
            if not (adapter_only and self._base_synced):  # merged sync: every time; adapter-only: the base once
                weights = stack.enter_context(whole_weights(model, everywhere=False, merged=not adapter_only))
            adapter = adapter_state(model) if adapter_only else None  # gathered on every process under ZeRO-3
            stack.enter_context(self.stops_cleanly())
            on_main_process(PartialState(), lambda: self.push(weights, version, adapter, name))
        if adapter_only:
            self.served_name, self._base_synced = name, True
        self._synced_version = version
        self.pushes += 1

    def push_copy(self, weights: dict[str, torch.Tensor], version: int) -> None:
        """Make the server sample with ``weights``, a copy of the actor's at ``version`` taken earlier (generation
        ahead of training: from a worker thread, one process). A LoRA actor's copy is merged: the server then
        serves the base model's name. It is pushed unless the server holds this very copy: after an evaluation's
        adapter-only sync the server holds ``version`` as base weights + adapter, which samples (in float rounding)
        otherwise than the merged copy a resumed run pushes."""
        if version != self._synced_version or self.served_name != self.base_name:
            with self.stops_cleanly():
                self.push(weights, version)
            self._synced_version, self.served_name, self._base_synced = version, self.base_name, False

    def push(
        self,
        weights: dict[str, torch.Tensor] | None,
        version: int,
        adapter: tuple | None = None,
        adapter_name: str = "",
    ) -> None:
        # claimed again before its weights change: after close() released it, or a restart of the server freed it
        self.client.claim()
        self.claimed = True
        if weights is not None:
            self.transfer.push(weights, version)
        if adapter is not None:
            self.client.load_adapter(adapter_name, adapter_bytes(*adapter))
            self.client.reset_prefix_cache()

    @contextlib.contextmanager
    def stops_cleanly(self) -> Iterator[None]:
        """A server failure during the run: say that the run stopped there and how to go on."""
        try:
            yield
        except VLLMServerError as err:
            raise VLLMServerError(
                f"the run lost its vLLM server: {err}. It stopped here; the checkpoints already written are intact: "
                "once the server answers again, resume with resume_from_checkpoint=True"
            ) from err

    def request_body(self, prompt: list[int], seed: int) -> dict:
        s = self.settings
        settings = dict(
            max_tokens=s.max_new_tokens,
            temperature=s.temperature,
            top_p=s.top_p,
            top_k=s.top_k,
            min_p=s.min_p or 0.0,
            repetition_penalty=s.repetition_penalty,
        )
        if s.regex is not None:
            settings["structured_outputs"] = {"regex": s.regex}
        request = dict(model=self.served_name, prompt=prompt, seed=seed, logprobs=0, return_token_ids=True)
        return {**settings, **s.extra, **request}  # generation_kwargs override the settings, not the request

    def _one(self, prompt: list[int], seed: int) -> tuple[list[int], list[float]]:
        choice = self.client.complete(self.request_body(prompt, seed))
        ids = trim_completion(list(choice["token_ids"]), self.tokenizer.eos_token_id)
        return ids, list(choice["logprobs"]["token_logprobs"][: len(ids)])

    def generate(self, model: torch.nn.Module, prompt_ids: list[list[int]], seeds: list[int]) -> Generation:
        workers = max(1, min(self.server.concurrency, len(prompt_ids)))
        with self.stops_cleanly(), ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(self._one, prompt_ids, seeds))
        return Generation([ids for ids, _ in results], [logprobs for _, logprobs in results])

    def close(self) -> None:
        """Release what the transfer holds, and the server for other runs (a later ``sync_weights`` claims it
        again)."""
        try:
            self.transfer.close()
        finally:
            self.release()

    def release(self) -> None:
        """Free the server for other runs (a later ``sync_weights`` claims it again and pushes the weights anew)."""
        self._synced_version, self._base_synced = None, False  # another run may replace the weights meanwhile
        # also where this process never claimed: a resumed run pushes under the claim its killed incarnation left
        if PartialState().is_main_process:
            self.client.release()
        self.claimed = False
