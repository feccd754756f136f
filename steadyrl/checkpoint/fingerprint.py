"""What a resumed run must share with the run that wrote its checkpoint, and what it may change.

The fingerprint covers everything that changes the math of training: the models' identities (config and a digest of
the initial weights: the policy, the reference, every reward model, PPO's critic), LoRA's settings, the tokenizers,
the dataset, the reward functions and online DPO's judge (``callable_identity``), the mixed precision and DeepSpeed
optimizer the launcher chose, the seed, the batch hierarchy and every setting of the config except the free ones,
which only extend the run or change how it is watched and stored (the config's own split:
trainers/config/resume_settings.py). Resuming with a different fingerprint is refused, naming each changed field with
its old and new value; changed free settings are logged. Secrets (tokens, keys, passwords) are never recorded.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from transformers.utils import logging

from ..data.stream import first_rows, is_stream
from ..distributed.sharded_loading import broadcast_from_main, is_main_process, local_part, on_main_only
from ..models.scalar_head import RewardModelFunction
from ..redaction import is_secret, redact_secrets
from . import CheckpointError
from .callable_identity import CallableIdentifier, callable_name

logger = logging.get_logger(__name__)

SAMPLED_VALUES = 64  # per tensor, in the weight digest
SAMPLED_ROWS = 256  # in the dataset digest
SAMPLED_STREAM_ROWS = 16  # the first rows of a stream, in its digest
PEFT_CONFIG_IGNORED = {"base_model_name_or_path", "revision", "inference_mode", "peft_version", "auto_mapping"}
MODEL_CONFIG_IGNORED = {
    "_name_or_path",
    "transformers_version",
    "use_cache",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
}


def _sha(data) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=_content).encode()).hexdigest()[:16]


def _content(value) -> str:
    """A value JSON cannot hold, by its content: an image (PIL) by its mode, size and pixels (its ``str`` names its
    address in memory), anything else as ``str``."""
    if all(hasattr(value, name) for name in ("mode", "size", "tobytes")):
        return f"image {value.mode} {value.size} {hashlib.sha256(value.tobytes()).hexdigest()[:16]}"
    return str(value)


def _json_default(value):
    return sorted(value, key=repr) if isinstance(value, (set, frozenset)) else str(value)


def plain_json(value):
    """``value`` as JSON gives it back (enums, dtypes and tuples as a checkpoint would hold them; sets sorted)."""
    return json.loads(json.dumps(value, sort_keys=True, default=_json_default))


def evenly_spaced(size: int, count: int) -> torch.Tensor:
    """``min(count, size)`` int64 indices from 0 to ``size - 1``, evenly spaced. Integer arithmetic: float32 steps
    (``linspace``) round past the last index of a tensor over 2**24 elements, i.e. of any real LM's embedding."""
    count = min(count, size)
    return torch.arange(count, dtype=torch.int64) * (size - 1) // max(count - 1, 1)


def weights_digest(model: torch.nn.Module) -> str:
    """``tensor_digest`` of a model; of one whose weights only the main process holds yet (FSDP2 loading), the main
    process's (every process must call it then)."""
    if on_main_only(model):
        return broadcast_from_main(tensor_digest(model) if is_main_process() else "")
    return tensor_digest(model)


@torch.no_grad()
def tensor_digest(model: torch.nn.Module) -> str:
    """A cheap digest of a model's weights: every tensor's name, shape, dtype and ``SAMPLED_VALUES`` evenly spaced
    values (an identity check, not an integrity check). The same for a ZeRO-3 partitioned or FSDP2 sharded model as
    for the whole one: each process samples its own part of every tensor and the samples are exchanged once (every
    process must call it then)."""
    tensors = list(model.named_parameters()) + list(model.named_buffers())
    samples, split = [], False
    for _, tensor in tensors:
        shape = tensor.ds_shape if hasattr(tensor, "ds_shape") else tensor.shape
        index = evenly_spaced(shape.numel(), SAMPLED_VALUES)
        part = local_part(tensor)
        if part is None:
            samples.append(tensor.detach().reshape(-1)[index.to(tensor.device)].to("cpu", torch.float64))
            continue
        split = True
        local, start = part
        mine = (index >= start) & (index < start + local.numel())
        values = torch.zeros(len(index), dtype=torch.float64)
        values[mine] = local[(index[mine] - start).to(local.device)].to("cpu", torch.float64)
        samples.append(torch.stack([mine.to(torch.float64), values]))
    if split:
        samples = combine_samples(samples)
    digest = hashlib.sha256()
    for (name, tensor), sample in zip(tensors, samples, strict=True):
        shape = tensor.ds_shape if hasattr(tensor, "ds_shape") else tensor.shape
        digest.update(f"{name}{tuple(shape)}{tensor.dtype}".encode())
        digest.update(sample.numpy().tobytes())
    return digest.hexdigest()[:16]


def combine_samples(samples: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each split tensor's samples from the processes that hold them ([2, n]: a mask of this process's own and their
    values); whole tensors' samples ([n]) as they are."""
    import torch.distributed as dist

    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, [s for s in samples if s.dim() == 2])
    combined, split_index = [], 0
    for sample in samples:
        if sample.dim() == 1:
            combined.append(sample)
            continue
        values = torch.zeros(sample.shape[1], dtype=torch.float64)
        for parts in everyone:
            mine = parts[split_index][0].bool()
            values[mine] = parts[split_index][1][mine]
        combined.append(values)
        split_index += 1
    return combined


def model_identity(prefix: str, model: torch.nn.Module | None) -> dict:
    """``{prefix.<config key>: value, prefix.weights: digest}`` of a model (its config without paths and
    versions); ``{prefix: None}`` without one."""
    if model is None:
        return {prefix: None}
    config = {k: v for k, v in model.config.to_dict().items() if k not in MODEL_CONFIG_IGNORED}
    identity = {f"{prefix}.{key}": value for key, value in plain_json(config).items()}
    identity[f"{prefix}.weights"] = weights_digest(model)
    return identity


def tokenizer_digest(tokenizer) -> str | None:
    """Vocabulary, special tokens and chat template of a tokenizer; of a processor, its tokenizer's, its own chat
    template and its image processor's settings (image size, patches, normalisation)."""
    if tokenizer is None:
        return None
    image_processor = getattr(tokenizer, "image_processor", None)
    images = None if image_processor is None else [image_processor.to_json_string(), tokenizer.chat_template]
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor's tokenizer
    text = [
        sorted(tokenizer.get_vocab().items()),
        tokenizer.all_special_tokens,
        getattr(tokenizer, "chat_template", None),
    ]
    return _sha(text if images is None else [text, images])


def dataset_digest(dataset) -> str:
    """The dataset's size, columns and ``SAMPLED_ROWS`` evenly spaced rows: the same for the same data however it
    was built (``datasets``' own fingerprint is random for functions it cannot hash)."""
    rows = len(dataset)
    index = sorted({round(i * (rows - 1) / max(SAMPLED_ROWS - 1, 1)) for i in range(min(SAMPLED_ROWS, rows))})
    sample = dataset[index] if index else {}
    return _sha([rows, list(getattr(dataset, "column_names", []) or []), sample])


def dataset_identity(dataset) -> dict:
    """``{"dataset": digest, "num_prompts": rows}`` of a map-style dataset. A stream (``datasets.IterableDataset``)
    cannot be digested without reading it through: its columns, a digest of its first ``SAMPLED_STREAM_ROWS`` rows,
    its number of shards and the names of its data files (without their directories: the data may move)."""
    if not is_stream(dataset):
        return {"dataset": dataset_digest(dataset), "num_prompts": len(dataset)}
    head = first_rows(dataset, SAMPLED_STREAM_ROWS)
    columns = dataset.column_names or (list(head[0]) if head else [])
    return {
        "dataset": "datasets.IterableDataset",
        "num_prompts": None,
        "dataset.columns": columns,
        "dataset.first_rows": _sha(head),
        "dataset.num_shards": dataset.num_shards,
        "dataset.files": stream_file_names(dataset),
    }


def stream_file_names(dataset) -> list[str] | None:
    """The names of the files a stream reads (``load_dataset(..., streaming=True)``), or None (a generator, an
    in-memory dataset). ``datasets`` keeps them in its innermost examples iterable's arguments."""
    iterable = dataset._ex_iterable
    while getattr(iterable, "ex_iterable", None) is not None:
        iterable = iterable.ex_iterable
    files = (getattr(iterable, "kwargs", None) or {}).get("original_files")
    return [os.path.basename(str(path)) for path in files] if isinstance(files, list) else None


def callable_identity(func) -> str:
    """What identifies a reward function or judge in every process and run (``CallableIdentifier``); models,
    tensors and tokenizers it holds count by their digests."""
    return CallableIdentifier(_value_digest).identify(func, "func")


def _value_digest(value) -> str | None:
    if isinstance(value, torch.nn.Module):
        return f"{callable_name(type(value))} weights {weights_digest(value)}"
    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1).cpu()
        sample = flat[evenly_spaced(flat.numel(), SAMPLED_VALUES)].to(torch.float64).tolist()
        return f"tensor {list(value.shape)} {value.dtype} {_sha(sample)}"
    if callable(getattr(value, "get_vocab", None)):
        return f"tokenizer {tokenizer_digest(value)}"
    return None


def deepspeed_identity(config: dict | None) -> dict:
    """The DeepSpeed settings that change the updates and that no config field records: optimizer offload (which
    swaps the optimizer for DeepSpeedCPUAdam) and an optimizer or LR scheduler defined in the DeepSpeed config. Batch
    sizes, clipping and precision are recorded elsewhere (the batch hierarchy, ``max_grad_norm``, ``mixed_precision``),
    and parameter offload only moves the same numbers."""
    if config is None:
        return {}
    offload = (config.get("zero_optimization") or {}).get("offload_optimizer") or {}
    return {
        "deepspeed.offload_optimizer": offload.get("device") or "none",
        "deepspeed.optimizer": plain_json(config.get("optimizer")),
        "deepspeed.scheduler": plain_json(config.get("scheduler")),
    }


def peft_identity(model) -> dict:
    """``{peft_config.<field>: value}`` of each adapter of a PEFT model (rank, alpha, rsLoRA, dropout, target modules,
    ...); ``{}`` without PEFT."""
    configs = getattr(model, "peft_config", None)
    if not isinstance(configs, dict):
        return {}
    identity = {}
    for name, config in sorted(configs.items()):
        prefix = "peft_config" if name == "default" else f"peft_config[{name}]"
        settings = plain_json(config.to_dict() if hasattr(config, "to_dict") else vars(config))
        identity.update({f"{prefix}.{k}": v for k, v in settings.items() if k not in PEFT_CONFIG_IGNORED})
    return identity


def reference_identity(reference, uses_reference: bool, policy_identity: dict) -> dict:
    """``{"ref_model": ...}``: None without a reference; "model" when it is the policy as it starts (a copy, or a
    given model with the same config and weights); "model without adapters" under PEFT; else the digests of its
    config and weights."""
    if not uses_reference:
        return {"ref_model": None}
    if reference is None:
        return {"ref_model": "model without adapters"}
    identity = model_identity("ref_model", reference)
    if identity == {"ref_model" + key.removeprefix("model"): value for key, value in policy_identity.items()}:
        return {"ref_model": "model"}
    weights = identity.pop("ref_model.weights")
    return {"ref_model": {"config": _sha(identity), "weights": weights}}


def reward_models_identity(reward_funcs: list) -> dict:
    """Every reward model among the reward functions, in order (``reward_model``, ``reward_model[1]``, ...): its
    config, weights and tokenizer (None: it reads the policy's token ids)."""
    scorers = [func for func in reward_funcs if isinstance(func, RewardModelFunction)]
    identity = {} if scorers else {"reward_model": None}
    for index, scorer in enumerate(scorers):
        prefix = "reward_model" if index == 0 else f"reward_model[{index}]"
        identity.update(model_identity(prefix, scorer.model))
        identity[f"{prefix}.tokenizer"] = tokenizer_digest(scorer.tokenizer)
    return identity


def run_identity(
    model,
    reward_funcs: list,
    tokenizer,
    dataset,
    reference,
    uses_reference: bool,
    mixed_precision: str,
    deepspeed_config: dict | None,
) -> dict:
    """What a run starts from, taken when the trainer is built, before any update: the models (config and initial
    weights; the reference; LoRA's settings), tokenizers, dataset, reward functions, and the precision and DeepSpeed
    optimizer the launcher chose. Warns about parts of reward functions that cannot be recorded."""
    policy = model_identity("model", model)
    identity = {
        **policy,
        **reward_models_identity(reward_funcs),
        **reference_identity(reference, uses_reference, policy),
        **peft_identity(model),
        "tokenizer": tokenizer_digest(tokenizer),
        **dataset_identity(dataset),
        "reward_funcs": [callable_name(func) for func in reward_funcs],
        "mixed_precision": mixed_precision,
        **deepspeed_identity(deepspeed_config),
    }
    identifier = CallableIdentifier(_value_digest)
    for index, func in enumerate(reward_funcs):
        if not isinstance(func, RewardModelFunction):  # reward models: recorded above
            full = identifier.identify(func, f"reward_funcs[{index}]")
            if full != callable_name(func):  # its name does not identify it
                identity[f"reward_funcs[{index}]"] = full
    identifier.warn_unchecked()
    return identity


def judge_identity(judge) -> dict:
    """``{"judge": identity}`` of online DPO's pairwise judge (None without one); warns about what of it cannot be
    recorded."""
    if judge is None:
        return {"judge": None}
    identifier = CallableIdentifier(_value_digest)
    identity = {"judge": identifier.identify(judge, "judge")}
    identifier.warn_unchecked()
    return identity


def redacted_settings(settings: dict) -> dict:
    """Settings (``args.<field>``) as checkpoints hold them: secrets removed (older checkpoints may hold some)."""
    return {
        k: redact_secrets(v) if k.startswith("args.") else v
        for k, v in settings.items()
        if not (k.startswith("args.") and is_secret(k))
    }


PER_PROCESS_DEFAULTS = ("micro_train_batch_size", "micro_rollout_batch_size")  # defaults follow the process count


def per_process_default_hint(
    changed: dict, saved_processes: int | None, processes: int | None, saved: dict | None = None
) -> str:
    """On another number of processes, the micro-batch sizes whose defaults follow it: how to resume as before, or
    that the checkpoint's cannot be used there (``saved``: its settings, with the rollout's size)."""
    moved = {name: changed[f"args.{name}"][0] for name in PER_PROCESS_DEFAULTS if f"args.{name}" in changed}
    if not moved or saved_processes is None or saved_processes == processes:
        return ""
    saved = saved or {}
    prompts, samples = saved.get("args.rollout_batch_size"), saved.get("args.n_samples_per_prompt")
    micro = moved.get("micro_rollout_batch_size")
    if micro and isinstance(prompts, int) and isinstance(samples, int) and (prompts * samples // processes) % micro:
        return (
            f" The checkpoint's micro_rollout_batch_size={micro} does not divide the {prompts * samples // processes} "
            f"samples each of {processes} processes generates per rollout, so it cannot resume on {processes}: resume "
            f"on {saved_processes}, or set micro_rollout_batch_size to a divisor of that from the start of a run."
        )
    given = " ".join(f"{name}={value}" for name, value in moved.items())
    follow = "follows" if len(moved) == 1 else "follow"
    return (
        f" Left unset, {' and '.join(moved)} {follow} the number of processes ({saved_processes} wrote the "
        f"checkpoint, {processes} now): set {given} to resume on {processes}."
    )


def check_resumable(saved: dict, current: dict, saved_free: dict, current_free: dict, directory: Path) -> None:
    """Refuse a resume whose fingerprint differs from the checkpoint's, naming every changed field; log the free
    settings that changed. Fields the checkpoint does not record (an older steadyrl wrote it) are not compared, nor
    secrets (which an older steadyrl recorded)."""
    saved, current = redacted_settings(saved), redacted_settings(current)
    saved_free, current_free = redacted_settings(saved_free), redacted_settings(current_free)
    changed = {key: (saved[key], value) for key, value in current.items() if key in saved and saved[key] != value}
    if changed:
        details = "; ".join(
            f"{key.removeprefix('args.')}: checkpoint {old!r}, now {new!r}" for key, (old, new) in changed.items()
        )
        raise CheckpointError(
            f"cannot resume from {directory}: {len(changed)} setting(s) that change training differ from the run that "
            f"wrote it ({details}). Resume with the same settings, or start a new run in another output_dir."
            + per_process_default_hint(changed, saved_free.get("world_size"), current_free.get("world_size"), saved)
        )
    unrecorded = sorted(set(current) - set(saved))
    if unrecorded:
        logger.info(
            f"{directory} does not record {len(unrecorded)} setting(s) (an older steadyrl wrote it): "
            f"{', '.join(unrecorded[:10])}{' ...' if len(unrecorded) > 10 else ''}"
        )
    moved = {k: (saved_free[k], v) for k, v in current_free.items() if k in saved_free and saved_free[k] != v}
    if moved:
        details = "; ".join(f"{key.removeprefix('args.')} {old!r} -> {new!r}" for key, (old, new) in moved.items())
        logger.warning(
            f"Resuming from {directory} with changed settings: {details}. They change the run's length (max_steps, "
            "num_train_epochs: and with it the learning-rate schedule, if it is not constant, as logged when it does) "
            "or how the run is logged, saved, evaluated, published or executed, not what an update computes."
        )
