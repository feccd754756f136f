"""What a resumed run must share with the run that wrote its checkpoint, and what it may change.

The fingerprint covers everything that changes the math of training: the models' identities (config and a digest of
the initial weights), the tokenizer, the dataset, the reward functions, the seed, the batch hierarchy and every
setting of the config except the ``FREE_SETTINGS``, which only extend the run or change how it is watched and
stored. Resuming with a different fingerprint is refused, naming each changed field with its old and new value;
changed free settings are logged.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from transformers.utils import logging

from ..checkpoint import CheckpointError
from .trl_names import MAX_NEW_TOKENS, SYNONYMS

logger = logging.get_logger(__name__)

# Settings a resumed run may change: they extend the run, or change logging, evaluation, saving, publishing, where
# files go and how processes and devices are set up, never the updates themselves.
FREE_SETTINGS = frozenset({
    "max_steps", "num_train_epochs",
    "output_dir", "overwrite_output_dir", "resume_from_checkpoint",
    "logging_steps", "logging_strategy", "logging_first_step", "logging_nan_inf_filter", "log_level",
    "log_level_replica", "log_on_each_node", "report_to", "run_name", "project", "trackio_space_id",
    "trackio_bucket_id", "trackio_static_space_id", "disable_tqdm", "skip_memory_metrics",
    "include_num_input_tokens_seen", "log_completions", "num_completions_to_print", "log_unique_prompts",
    "log_multimodal",
    "save_steps", "save_strategy", "save_total_limit", "save_only_model", "save_on_each_node", "save_final_checkpoint",
    "stop_on_signal", "restore_callback_states_from_checkpoint",
    "eval_strategy", "eval_steps", "eval_delay", "eval_on_start", "eval_accumulation_steps", "eval_do_concat_batches",
    "eval_use_gather_object", "per_device_eval_batch_size", "num_generations_eval", "bf16_full_eval",
    "fp16_full_eval", "batch_eval_metrics", "prediction_loss_only", "include_for_metrics", "metric_for_best_model",
    "greater_is_better", "load_best_model_at_end", "do_train", "do_eval", "do_predict",
    "push_to_hub", "hub_model_id", "hub_strategy", "hub_token", "hub_private_repo", "hub_always_push", "hub_revision",
    "hub_push_merged",
    "dataloader_drop_last", "dataloader_in_order", "dataloader_multiprocessing_context", "dataloader_num_workers",
    "dataloader_persistent_workers", "dataloader_pin_memory", "dataloader_prefetch_factor",
    "local_rank", "use_cpu", "deepspeed", "accelerator_config", "ddp_backend", "ddp_timeout", "ddp_broadcast_buffers",
    "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph", "debug", "torch_empty_cache_steps",
    "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "gradient_checkpointing", "gradient_checkpointing_kwargs", "ref_reward_offload", "allow_low_precision_weights",
    "vllm_gpu_memory_utilization", "vllm_kv_cache_space", "vllm_enable_sleep_mode", "vllm_server_base_url",
    "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port", "vllm_server_weight_transfer",
    "vllm_server_weights_dir",
})  # fmt: skip
# Free settings a checkpoint does not record: where the run happens to be (a checkpoint's content does not depend on
# its directory, so a run directory can be moved) and secrets.
WHERE = frozenset({"output_dir", "run_name", "resume_from_checkpoint", "local_rank", "deepspeed", "hub_token"})
# TRL's names for steadyrl's fields (trl_names.py): they restate a setting the fingerprint holds under its own name.
MIRRORS = frozenset({synonym.trl_name for synonym in (*SYNONYMS, MAX_NEW_TOKENS)} |
                    {"per_device_train_batch_size", "generation_batch_size", "steps_per_generation"})  # fmt: skip
SAMPLED_VALUES = 64  # per tensor, in the weight digest
SAMPLED_ROWS = 256  # in the dataset digest
MODEL_CONFIG_IGNORED = {"_name_or_path", "transformers_version", "use_cache", "output_attentions",
                        "output_hidden_states", "return_dict"}  # fmt: skip


def _sha(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _plain(value):
    """``value`` as JSON gives it back (enums, dtypes and tuples as a checkpoint would hold them)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def evenly_spaced(size: int, count: int) -> torch.Tensor:
    """``min(count, size)`` int64 indices from 0 to ``size - 1``, evenly spaced. Integer arithmetic: float32 steps
    (``linspace``) round past the last index of a tensor over 2**24 elements, i.e. of any real LM's embedding."""
    count = min(count, size)
    return torch.arange(count, dtype=torch.int64) * (size - 1) // max(count - 1, 1)


@torch.no_grad()
def weights_digest(model: torch.nn.Module) -> str:
    """A cheap digest of a model's weights: every tensor's name, shape, dtype and ``SAMPLED_VALUES`` evenly spaced
    values (an identity check, not an integrity check)."""
    digest = hashlib.sha256()
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        flat = tensor.detach().reshape(-1)
        index = evenly_spaced(flat.numel(), SAMPLED_VALUES)
        sample = flat[index.to(flat.device)].to("cpu", torch.float64)
        digest.update(f"{name}{tuple(tensor.shape)}{tensor.dtype}".encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def model_identity(prefix: str, model: torch.nn.Module | None) -> dict:
    """``{prefix.<config key>: value, prefix.weights: digest}`` of a model (its config without paths and
    versions); ``{prefix: None}`` without one."""
    if model is None:
        return {prefix: None}
    config = {k: v for k, v in model.config.to_dict().items() if k not in MODEL_CONFIG_IGNORED}
    identity = {f"{prefix}.{key}": value for key, value in _plain(config).items()}
    identity[f"{prefix}.weights"] = weights_digest(model)
    return identity


def tokenizer_digest(tokenizer) -> str | None:
    """Vocabulary, special tokens and chat template of a tokenizer."""
    if tokenizer is None:
        return None
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
    return _sha([sorted(tokenizer.get_vocab().items()), tokenizer.all_special_tokens,
                 getattr(tokenizer, "chat_template", None)])  # fmt: skip


def dataset_digest(dataset) -> str:
    """The dataset's size, columns and ``SAMPLED_ROWS`` evenly spaced rows: the same for the same data however it
    was built (``datasets``' own fingerprint is random for functions it cannot hash)."""
    rows = len(dataset)
    index = sorted({round(i * (rows - 1) / max(SAMPLED_ROWS - 1, 1)) for i in range(min(SAMPLED_ROWS, rows))})
    sample = dataset[index] if index else {}
    return _sha([rows, list(getattr(dataset, "column_names", []) or []), sample])


def callable_identity(func) -> str:
    """``module.qualname`` of a reward function (of its class, for a callable object)."""
    target = func if hasattr(func, "__qualname__") else type(func)
    return f"{getattr(target, '__module__', '?')}.{target.__qualname__}"


def run_identity(model, reward_model, tokenizer, dataset, reward_funcs: list) -> dict:
    """What a run starts from: the models (config and initial weights), tokenizer, dataset and reward functions;
    taken when the trainer is built, before any update."""
    return {
        **model_identity("model", model), **model_identity("reward_model", reward_model),
        "tokenizer": tokenizer_digest(tokenizer), "dataset": dataset_digest(dataset), "num_prompts": len(dataset),
        "reward_funcs": [callable_identity(func) for func in reward_funcs],
    }  # fmt: skip


def split_settings(args) -> tuple[dict, dict]:
    """The config's settings as ``(fixed, free)``, each ``{"args.<field>": value}``."""
    settings = _plain(args.to_dict())
    fixed = {f"args.{k}": v for k, v in settings.items() if k not in FREE_SETTINGS | MIRRORS}
    free = {f"args.{k}": v for k, v in settings.items() if k in FREE_SETTINGS - WHERE}
    return fixed, free


def check_resumable(saved: dict, current: dict, saved_free: dict, current_free: dict, directory: Path) -> None:
    """Refuse a resume whose fingerprint differs from the checkpoint's, naming every changed field; log the free
    settings that changed. Fields the checkpoint does not record (an older steadyrl wrote it) are not compared."""
    changed = {key: (saved[key], value) for key, value in current.items() if key in saved and saved[key] != value}
    if changed:
        details = "; ".join(f"{key.removeprefix('args.')}: checkpoint {old!r}, now {new!r}"
                            for key, (old, new) in changed.items())  # fmt: skip
        raise CheckpointError(
            f"cannot resume from {directory}: {len(changed)} setting(s) that change training differ from the run that "
            f"wrote it ({details}). Resume with the same settings, or start a new run in another output_dir."
        )
    unrecorded = sorted(set(current) - set(saved))
    if unrecorded:
        logger.info(f"{directory} does not record {len(unrecorded)} setting(s) (an older steadyrl wrote it): "
                    f"{', '.join(unrecorded[:10])}{' ...' if len(unrecorded) > 10 else ''}")  # fmt: skip
    moved = {k: (saved_free[k], v) for k, v in current_free.items() if k in saved_free and saved_free[k] != v}
    if moved:
        details = "; ".join(f"{key.removeprefix('args.')} {old!r} -> {new!r}" for key, (old, new) in moved.items())
        logger.warning(
            f"Resuming from {directory} with changed settings: {details}. They change the run's length (max_steps, "
            "num_train_epochs: and with it the learning-rate schedule, if it is not constant, as logged when it does) "
            "or how the run is logged, saved, evaluated, published or executed, not what an update computes."
        )
