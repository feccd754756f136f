"""Checks of an ``OnPolicyConfig``'s values that TrainingArguments does not make, or makes without saying what is
valid: each names the field, the value and what would be valid."""

from __future__ import annotations

import math
import os
import re

import torch
from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType

from ...generation import BACKENDS
from ...generation.server_settings import server_urls
from .batch_hierarchy import check_positive_int


def finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_run_length(config) -> None:
    """``max_steps``: a positive number of optimizer steps, or -1 to train for ``num_train_epochs`` (which must then
    be > 0). TrainingArguments takes any ``max_steps <= 0`` as -1, so 0 would silently train for the epochs."""
    steps = config.max_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or (steps <= 0 and steps != -1):
        raise ValueError(
            f"max_steps={steps!r} is invalid: use a positive number of optimizer steps, or -1 (the default) to train "
            "for num_train_epochs."
        )
    epochs = config.num_train_epochs
    if steps == -1 and not (finite(epochs) and epochs > 0):
        raise ValueError(
            f"num_train_epochs={epochs!r} is invalid: with max_steps=-1 it sets the run's length in passes over "
            "train_dataset, so it must be a finite number > 0 (0.5: half of the prompts); or set max_steps to a "
            "positive number of optimizer steps."
        )


def check_ranges(config) -> None:
    """Ranges of the generation, loss and run settings (the batch sizes are checked as they are resolved)."""
    check_run_length(config)
    for name in ("num_ppo_epochs", "max_prompt_length", "max_completion_length"):  # batch sizes: as resolved
        check_positive_int(name, getattr(config, name))
    if config.max_tool_calling_iterations is not None:
        check_positive_int("max_tool_calling_iterations", config.max_tool_calling_iterations)
    if not config.temperature > 0:
        raise ValueError(f"temperature={config.temperature} is invalid: it must be > 0.")
    if not 0 < config.top_p <= 1:
        raise ValueError(f"top_p={config.top_p} is invalid: it must be in (0, 1].")
    if config.top_k < 0:
        raise ValueError(f"top_k={config.top_k} is invalid: use 0 to disable, or a positive integer.")
    for name in ("cliprange", "cliprange_high"):
        if not (finite(getattr(config, name)) and getattr(config, name) > 0):
            raise ValueError(f"{name}={getattr(config, name)!r} is invalid: it must be a finite number > 0.")
    if not (finite(config.learning_rate) and config.learning_rate >= 0):
        raise ValueError(f"learning_rate={config.learning_rate!r} is invalid: it must be a finite number >= 0.")
    if not (isinstance(config.seed, int) and not isinstance(config.seed, bool) and 0 <= config.seed < 2**32):
        raise ValueError(f"seed={config.seed!r} is invalid: it must be an integer in [0, 2**32 - 1].")
    penalty = config.missing_eos_penalty
    if penalty is not None and not (finite(penalty) and penalty >= 0):
        raise ValueError(
            f"missing_eos_penalty={penalty!r} is invalid: it is subtracted from the score of a completion "
            "without EOS, so it must be a finite number >= 0 (None: no penalty)."
        )
    weights = config.reward_weights
    if weights is not None and not (isinstance(weights, (list, tuple)) and all(finite(w) for w in weights)):
        raise ValueError(
            f"reward_weights={weights!r} is invalid: give a list of finite numbers, one per reward function "
            "(then one for the reward model, if any)."
        )


# keyword arguments of generation that steadyrl gives each request itself (generation/*.py)
GENERATION_KWARGS_RESERVED = frozenset({"seed", "n", "num_return_sequences", "logprobs", "return_token_ids"})


def check_generation_and_logging(config) -> None:
    if config.min_p is not None and not (finite(config.min_p) and 0 <= config.min_p <= 1):
        raise ValueError(f"min_p={config.min_p!r} is invalid: it must be in [0, 1] (None: no min-p sampling).")
    if not (finite(config.repetition_penalty) and config.repetition_penalty > 0):
        raise ValueError(
            f"repetition_penalty={config.repetition_penalty!r} is invalid: it must be a finite number > 0 (1.0: "
            "no penalty)."
        )
    for name in ("num_generations_eval", "num_completions_to_print", "micro_generation_batch_size"):
        check_positive_int(name, getattr(config, name))
    reserved = sorted(set(config.generation_kwargs or {}) & GENERATION_KWARGS_RESERVED)
    if reserved:
        raise ValueError(
            f"generation_kwargs sets {', '.join(reserved)}, which steadyrl sets for each request: one completion per "
            "request with its own seed (drawn from the config's seed, so that a resumed run samples the same "
            "completions) and its log-probs. Remove them: the completions per prompt are n_samples_per_prompt "
            "(num_generations), the seeds follow seed."
        )
    if config.cache_implementation is not None and not isinstance(config.cache_implementation, str):
        raise ValueError(f"cache_implementation={config.cache_implementation!r} is invalid: give a name or None.")
    flags = (
        "trust_remote_code",
        "disable_dropout",
        "shuffle_dataset",
        "remove_unused_columns",
        "mask_truncated_completions",
        "log_completions",
        "log_multimodal",
    )
    for name in flags:
        if not isinstance(getattr(config, name), bool):
            raise ValueError(f"{name}={getattr(config, name)!r} is invalid: it must be True or False.")


def check_schedule(config) -> None:
    """Before TrainingArguments' own checks, whose messages do not say what is valid."""
    schedulers = [kind.value for kind in SchedulerType]
    if config.lr_scheduler_type not in schedulers:
        raise ValueError(
            f"lr_scheduler_type={config.lr_scheduler_type!r} is invalid: use one of {', '.join(schedulers)}."
        )
    if not (finite(config.warmup_steps) and config.warmup_steps >= 0):
        raise ValueError(
            f"warmup_steps={config.warmup_steps!r} is invalid: it must be >= 0 (a number of global steps, or a "
            "ratio of the total steps below 1)."
        )


def check_saving(config) -> None:
    """Refuse settings under which the run would silently never write a checkpoint, or could not (output_dir is
    where it writes them)."""
    if config.save_strategy not in (SaveStrategy.STEPS, SaveStrategy.NO):
        raise ValueError(
            f"save_strategy={config.save_strategy.value!r} is not supported: steadyrl checkpoints by global step. "
            "Use save_strategy='steps' with save_steps=N, or 'no' for no checkpoints."
        )
    if config.save_strategy == SaveStrategy.STEPS and not config.save_steps > 0:
        raise ValueError(
            f"save_steps={config.save_steps} is invalid: a checkpoint is written every save_steps global steps, "
            "so it must be > 0 (or a ratio of max_steps below 1). Use save_strategy='no' for no checkpoints."
        )
    limit = config.max_consecutive_nonfinite_steps
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 0:
        raise ValueError(
            f"max_consecutive_nonfinite_steps={limit!r} is invalid: it is how many global steps in a row with a "
            "non-finite loss or gradient are skipped before the run stops, so an integer >= 0 (0: stop at the first)."
        )
    if config.save_on_each_node:
        raise ValueError(
            "save_on_each_node=True is not supported: every process writes its part of each checkpoint into the one "
            "output_dir the main process commits, so on several machines output_dir must be a directory they all "
            "share. Leave save_on_each_node False and put output_dir on a filesystem every machine mounts."
        )
    if os.path.exists(config.output_dir) and not os.path.isdir(config.output_dir):
        raise ValueError(
            f"output_dir={config.output_dir!r} is not a directory: it must be a directory (created if missing) "
            "for the checkpoints."
        )


def check_evaluation(config) -> None:
    if config.eval_strategy not in (IntervalStrategy.STEPS, IntervalStrategy.NO):
        raise ValueError(
            f"eval_strategy={config.eval_strategy.value!r} is not supported: steadyrl counts global steps. Use "
            "eval_strategy='steps' with eval_steps=N, or 'no'."
        )


def check_vllm_server(config) -> None:
    """``vllm_mode`` and the settings of ``vllm_mode='server'``."""
    if config.vllm_mode not in ("colocate", "server"):
        raise ValueError(
            f"vllm_mode={config.vllm_mode!r} is invalid: use 'colocate' (vLLM in each training process) or 'server' "
            "(a running vLLM server)."
        )
    if config.vllm_mode == "colocate":
        return
    if not config.use_vllm:
        raise ValueError(
            "vllm_mode='server' configures vLLM generation, and use_vllm=False generates with transformers: set "
            "use_vllm=True to generate on the server, or leave vllm_mode at 'colocate'."
        )
    for name in ("vllm_server_port", "vllm_group_port"):
        port = getattr(config, name)
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"{name}={port!r} is invalid: a TCP port is a whole number in 1..65535.")
    timeout = config.vllm_server_timeout
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not (finite(timeout) and timeout > 0):
        raise ValueError(f"vllm_server_timeout={timeout!r} is invalid: seconds to wait, a number > 0.")
    urls = server_urls(config.vllm_server_base_url, config.vllm_server_host, config.vllm_server_port)
    for url in urls if config.vllm_server_base_url is not None else ():
        if not url.startswith(("http://", "https://")):
            raise ValueError(
                f"vllm_server_base_url={config.vllm_server_base_url!r} is invalid: {url!r} is not a URL with its "
                "scheme; give each server's, e.g. 'http://10.0.0.5:8000', or several comma-separated: "
                "'http://10.0.0.5:8000,http://10.0.0.6:8000' (or set vllm_server_host and vllm_server_port instead)."
            )
    if not urls:
        raise ValueError(
            f"vllm_server_base_url={config.vllm_server_base_url!r}, vllm_server_host={config.vllm_server_host!r} "
            "name no server: give a URL (or several, comma-separated), or a host."
        )
    if len(set(urls)) != len(urls):
        raise ValueError(
            f"vllm_server_base_url={config.vllm_server_base_url!r} names a server twice ({urls}): list each once."
        )
    transfer = config.vllm_server_weight_transfer
    if len(urls) > 1 and (transfer == "nccl" or config.vllm_lora_sync == "adapter"):
        setting = f"vllm_server_weight_transfer={transfer!r}" if transfer == "nccl" else "vllm_lora_sync='adapter'"
        raise ValueError(
            f"{setting} takes one vLLM server, and the run lists {len(urls)} ({', '.join(urls)}): with several "
            "servers the weights go as merged safetensors files (vllm_server_weight_transfer='file', "
            "vllm_lora_sync='auto' or 'merged'), or use one server (with data parallelism behind its address)."
        )
    if transfer not in ("file", "nccl"):
        raise ValueError(
            f"vllm_server_weight_transfer={transfer!r} is invalid: use 'file' (safetensors in "
            "vllm_server_weights_dir, reloaded by the server) or 'nccl' (vLLM's NCCL weight transfer, GPUs only)."
        )
    if transfer == "nccl" and (config.use_cpu or not torch.cuda.is_available()):
        raise ValueError(
            "vllm_server_weight_transfer='nccl' needs CUDA GPUs (NCCL), and this run trains on the CPU: use "
            "vllm_server_weight_transfer='file'."
        )


def check_vllm(config) -> None:
    check_vllm_server(config)
    regex = config.vllm_structured_outputs_regex
    if regex is not None:
        if not config.use_vllm:
            raise ValueError(
                f"vllm_structured_outputs_regex={regex!r} constrains vLLM's generation, and use_vllm=False generates "
                "with transformers, which has no structured outputs: set use_vllm=True, or leave it unset."
            )
        try:
            re.compile(regex)
        except re.error as err:
            raise ValueError(
                f"vllm_structured_outputs_regex={regex!r} is not a valid regular expression: {err}."
            ) from None
    needed = config.max_prompt_length + config.max_completion_length
    if config.vllm_max_model_len is not None and config.vllm_max_model_len < needed:
        raise ValueError(
            f"vllm_max_model_len={config.vllm_max_model_len} is smaller than max_prompt_length="
            f"{config.max_prompt_length} + max_completion_length={config.max_completion_length} = {needed}: "
            f"use vllm_max_model_len >= {needed}, or shorten the prompts or completions."
        )
    if not 0 < config.vllm_gpu_memory_utilization <= 1:
        raise ValueError(
            f"vllm_gpu_memory_utilization={config.vllm_gpu_memory_utilization} is invalid: it must be in (0, 1]."
        )
    tp = config.vllm_tensor_parallel_size
    if not isinstance(tp, int) or tp < 1 or config.world_size % tp:
        raise ValueError(
            f"vllm_tensor_parallel_size={tp} is invalid: it must be a positive integer that divides the "
            f"{config.world_size} process(es)."
        )
    dtypes = ("auto", "float32", "float", "bfloat16", "float16", "half")
    if config.vllm_dtype not in dtypes:
        raise ValueError(f"vllm_dtype={config.vllm_dtype!r} is invalid: use one of {', '.join(dtypes)}.")
    if not isinstance(config.vllm_kv_cache_space, int) or config.vllm_kv_cache_space < 1:
        raise ValueError(f"vllm_kv_cache_space={config.vllm_kv_cache_space!r} is invalid: a whole number of GiB >= 1.")
    if config.vllm_lora_sync not in ("auto", "adapter", "merged"):
        raise ValueError(
            f"vllm_lora_sync={config.vllm_lora_sync!r} is invalid: use 'auto' (the LoRA adapter only where vLLM can "
            "serve it, else merged weights), 'adapter' (the adapter only) or 'merged' (W + scale x BA for every "
            "adapted weight, with all the others)."
        )


def check_sync_ref_settings(config) -> None:
    """TR-DPO's reference syncing: a flag, a mixing weight in [0, 1] and a whole number of global steps."""
    if not isinstance(config.sync_ref_model, bool):
        raise ValueError(f"sync_ref_model={config.sync_ref_model!r} is invalid: it must be True or False.")
    alpha = config.ref_model_mixup_alpha
    if not (finite(alpha) and 0 <= alpha <= 1):
        raise ValueError(
            f"ref_model_mixup_alpha={alpha!r} is invalid: it is the policy's share in each update of the reference "
            "(ref = alpha x policy + (1 - alpha) x ref), so it must be a number in [0, 1]."
        )
    steps = config.ref_model_sync_steps
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(
            f"ref_model_sync_steps={steps!r} is invalid: the reference is updated every ref_model_sync_steps global "
            "steps, so it must be an integer >= 1."
        )


def check_staleness(config) -> None:
    """``max_staleness`` > 0 overlaps generation with training, for the losses that take samples of older weights,
    on a backend that generates from a copy of the weights taken earlier (``capabilities.pushes_copies``: the vLLM
    server)."""
    staleness, partial = config.max_staleness, getattr(config, "partial_rollout_tokens", 0)
    if not isinstance(staleness, int) or isinstance(staleness, bool) or staleness < 0:
        raise ValueError(f"max_staleness={staleness!r} is invalid: use 0 (synchronous) or a positive integer.")
    if not isinstance(partial, int) or isinstance(partial, bool) or partial < 0:
        raise ValueError(
            f"partial_rollout_tokens={partial!r} is invalid: use 0 (no partial rollouts) or the number of tokens of "
            "each completion generated ahead, a positive integer."
        )
    if partial and not staleness:
        raise ValueError(
            f"partial_rollout_tokens={partial} continues completions generated ahead of training, and max_staleness=0 "
            "generates none ahead: set max_staleness=1 (or more), or partial_rollout_tokens=0."
        )
    if not staleness:
        return
    backend = BACKENDS.get(config.generation_backend)  # None: an invalid vllm_mode, refused by check_vllm
    if backend is None or not backend.capabilities.pushes_copies:
        raise ValueError(
            f"max_staleness={staleness} generates on a vLLM server while the trainer trains: set use_vllm=True and "
            f"vllm_mode='server' (got use_vllm={config.use_vllm}, vllm_mode={config.vllm_mode!r}), or "
            "max_staleness=0."
        )
    if not hasattr(config, "vllm_importance_sampling_correction") and config.trains_ahead_uncorrected is None:
        raise ValueError(
            f"max_staleness={staleness} is for GRPO, RLOO and REINFORCE++, whose losses correct for the lag "
            "(vllm_importance_sampling_correction), and for distillation, whose loss has no importance ratio; "
            f"{type(config).__name__} has neither: use max_staleness=0."
        )


def check_partial_rollout_length(config) -> None:
    """``partial_rollout_tokens`` below ``max_completion_length`` (resolved), or no completion is ever continued."""
    partial = getattr(config, "partial_rollout_tokens", 0)
    if partial and partial >= config.max_completion_length:
        raise ValueError(
            f"partial_rollout_tokens={partial} is not below max_completion_length={config.max_completion_length}, so "
            "no completion would be continued with newer weights: use fewer tokens (about the usual completion's "
            "length), or partial_rollout_tokens=0."
        )
