"""The fields of ``OnPolicyConfig``, one dataclass mixin per group a reader looks for (batch, generation, loss, ...).

Each mixin's ``settings_group`` is the heading its fields appear under in docs/configuration.md
(``python -m steadyrl.trainers.config_reference`` writes that page from these classes); each field's
``metadata["help"]`` is its one description, shown by ``--help`` too. The checks are in value_checks.py and
``OnPolicyConfig.__post_init__``; a ``None`` default means "not given": it is resolved there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass
class BatchFields:
    settings_group: ClassVar[str] = "Batch hierarchy"

    rollout_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Prompts generated per rollout (global). Default train_batch_size / n_samples_per_prompt: "
            "one rollout per optimizer step (TRL's default)."
        },
    )
    n_samples_per_prompt: int | None = field(
        default=None, metadata={"help": "Completions generated per prompt (TRL: num_generations); default 4."}
    )
    train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Samples per optimizer step, i.e. per global step (global); default micro_train_batch_size x "
            "processes x gradient_accumulation_steps."
        },
    )
    micro_train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Samples per device per forward/backward (TRL: per_device_train_batch_size); default 8 or, "
            "with train_batch_size given, the largest divisor of its share per process up to 8 (with "
            "gradient_accumulation_steps given too, exactly that share / gradient_accumulation_steps)."
        },
    )
    micro_rollout_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Samples per device in one no-grad scoring pass (old, reference, reward model and critic "
            "log-probs or values); default the largest divisor, up to 8, of each process's samples per rollout."
        },
    )
    micro_generation_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Per device: most sequences in one HF generate call, to cap its memory; default the "
            "process's whole share of the rollout in one call, as TRL (vLLM always gets it whole)."
        },
    )
    num_ppo_epochs: int | None = field(
        default=None,
        metadata={
            "help": "Passes over each rollout (TRL: num_iterations); default 1. One rollout gives "
            "rollout_batch_size x n_samples_per_prompt / train_batch_size x num_ppo_epochs global steps."
        },
    )
    # TRL's batch names: TrainingArguments' two with None defaults (to tell "given" from "default"), and GRPO's two.
    per_device_train_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "TRL's name: completions per device per forward/backward (= micro_train_batch_size; "
            "online DPO: prompts, each with 2 completions). Default 8."
        },
    )
    gradient_accumulation_steps: int | None = field(
        default=None,
        metadata={
            "help": "Micro-batches per optimizer step: train_batch_size / (micro_train_batch_size x "
            "processes). Derived when train_batch_size is given, else 1 by default."
        },
    )
    generation_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "TRL's name: completions per rollout (= rollout_batch_size x n_samples_per_prompt). "
            "Excludes steps_per_generation."
        },
    )
    steps_per_generation: int | None = field(
        default=None,
        metadata={
            "help": "TRL's name: micro-batches per rollout (generation_batch_size = per_device_train_batch_size "
            "x processes x steps_per_generation). Default gradient_accumulation_steps."
        },
    )


@dataclass
class GenerationFields:
    settings_group: ClassVar[str] = "Generation"

    max_prompt_length: int | None = field(
        default=None, metadata={"help": "Prompts are truncated on the left to this many tokens; default 512."}
    )
    max_completion_length: int | None = field(
        default=None, metadata={"help": "Most tokens generated per completion; default 64."}
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
        metadata={
            "help": "More keyword arguments for generation (GenerationConfig, or vLLM's SamplingParams), "
            "overriding the settings above; a JSON object on the command line."
        },
    )
    chat_template_kwargs: dict[str, Any] | str | None = field(
        default=None, metadata={"help": "Keyword arguments for apply_chat_template; a JSON object on the command line."}
    )
    cache_implementation: str | None = field(
        default=None, metadata={"help": "transformers' KV cache implementation for generation without vLLM."}
    )
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata={
            "help": "Under DeepSpeed ZeRO-3 without vLLM: gather the whole actor on every process to generate "
            "(fast); False: generate with the actor partitioned, each layer gathered for each forward pass (one "
            "layer at a time in memory, for an actor too big to gather; slower). No effect with vLLM, which holds "
            "its own copy of the weights."
        },
    )
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata={
            "help": "With tools / environment_factory: most rounds of tool calls per rollout (each round runs "
            "the calls of the last turn and samples the next turn); None: until no tool is called or "
            "max_completion_length is reached."
        },
    )


@dataclass
class LossFields:
    settings_group: ClassVar[str] = "Loss, KL and rewards"

    beta: float = field(default=0.05, metadata={"help": "KL penalty coefficient against the reference model."})
    cliprange: float | None = field(
        default=None, metadata={"help": "Clipping range of the importance ratio (TRL: epsilon); default 0.2."}
    )
    cliprange_high: float | None = field(
        default=None,
        metadata={"help": "Upper clipping bound: ratio <= 1 + cliprange_high (TRL: epsilon_high); default cliprange."},
    )
    mask_truncated_completions: bool = field(
        default=False, metadata={"help": "Leave completions that end without EOS out of the loss."}
    )
    reward_weights: list[float] | None = field(
        default=None,
        metadata={"help": "One weight per reward function (then the reward model); all 1.0 if unset."},
    )
    reward_timeout: float | None = field(
        default=None,
        metadata={
            "help": "Seconds each reward function may take per rollout: an async one is cancelled, a plain one "
            "interrupted (on the main thread), and the run stops with an error. None: no limit (warned about after "
            "60 s; docs/faults.md)."
        },
    )
    missing_eos_penalty: float | None = field(
        default=None, metadata={"help": "Subtracted from the score of a completion that ends without EOS."}
    )
    # TR-DPO's reference syncing, as TRL's SyncRefModelCallback, with TRL's defaults and help texts.
    sync_ref_model: bool = field(
        default=False,
        metadata={
            "help": "Whether to synchronize the reference model with the active model every `ref_model_sync_steps` "
            "steps, using the `ref_model_mixup_alpha` parameter. The reference then lives in every checkpoint."
        },
    )
    ref_model_mixup_alpha: float = field(
        default=0.6,
        metadata={
            "help": "α parameter from the TR-DPO paper, which controls the mix between the current policy and the "
            "previous reference policy during updates. The reference policy is updated according to the equation: "
            "`π_ref = α * π_θ + (1 - α) * π_ref_prev`. To use this parameter, you must set `sync_ref_model=True`."
        },
    )
    ref_model_sync_steps: int = field(
        default=512,
        metadata={
            "help": "τ parameter from the TR-DPO paper, which determines how frequently the current policy is "
            "synchronized with the reference policy. To use this parameter, you must set `sync_ref_model=True`."
        },
    )


@dataclass
class ModelFields:
    settings_group: ClassVar[str] = "Models, data and memory"

    model_init_kwargs: dict[str, Any] | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for from_pretrained when a model is given by name, e.g. "
            '\'{"dtype": "bfloat16"}\'; a JSON object on the command line. Without a dtype here a model '
            "given by name loads in float32."
        },
    )
    trust_remote_code: bool = field(
        default=False, metadata={"help": "Allow models and tokenizers that ship custom code from the Hub."}
    )
    disable_dropout: bool = field(
        default=False, metadata={"help": "Disable dropout in the trained and reference models."}
    )
    shuffle_dataset: bool = field(default=True, metadata={"help": "Shuffle the prompts."})
    remove_unused_columns: bool = field(
        default=False,
        metadata={
            "help": "Keep only the 'prompt' column; False (as in TRL) passes every column to the reward functions."
        },
    )
    learning_rate: float = field(default=1e-6, metadata={"help": "Initial learning rate of the actor."})
    gradient_checkpointing: bool = field(
        default=True,
        metadata={
            "help": "Recompute activations in the backward pass instead of keeping them (TRL's default): less "
            "memory, about 1.2x the time per step. False keeps them."
        },
    )
    packing: bool = field(
        default=True,
        metadata={
            "help": "Run the training and scoring passes packed: no padding, and a group's prompt computed once for "
            "all its completions (docs/packing.md). The same numbers as the padded pass up to float rounding; a "
            "model whose attention cannot take it runs padded, with the reason logged once. False: padded."
        },
    )
    allow_low_precision_weights: bool = field(
        default=False,
        metadata={
            "help": "Train bf16/fp16 parameters without float32 master weights (updates below their "
            "resolution are lost); refused by default."
        },
    )
    ref_reward_offload: bool = field(
        default=False,
        metadata={
            "help": "Keep the reference and reward models in CPU memory and move them to the device only to score "
            "a rollout: frees their weights' device memory during training, at the cost of two copies per rollout."
        },
    )


@dataclass
class CheckpointFields:
    settings_group: ClassVar[str] = "Checkpointing and resume"

    save_final_checkpoint: bool = field(
        default=False,
        metadata={"help": "Also save a checkpoint at the last step when it is not a multiple of save_steps."},
    )
    stop_on_signal: bool = field(
        default=True,
        metadata={
            "help": "On SIGTERM or SIGINT (what schedulers send before preemption): finish the current step, "
            "write a checkpoint and exit with the status of a process the signal ended, 128 + its number (143 for "
            "SIGTERM, 130 for SIGINT), so that the scheduler restarts the unfinished run; a signal during the last "
            "step lets the run complete (status 0). A second signal exits at once."
        },
    )
    max_consecutive_nonfinite_steps: int = field(
        default=3,
        metadata={
            "help": "A global step whose loss or gradient norm is not finite (NaN, inf) is skipped: no weight, "
            "optimizer moment or learning-rate change, said in a warning and counted (nonfinite_skipped_steps in "
            "the logs). Up to this many in a row are skipped; the next one stops the run with an error naming the "
            "steps, modules and prompts, its newest checkpoint healthy. 0: stop at the first, as Megatron's NaN "
            "check does (docs/faults.md)."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Delete the checkpoints and run logs (metrics.jsonl, completions.jsonl) already in "
            "output_dir before a fresh start (without it, a fresh start in a directory holding another run's "
            "checkpoints, logs or saved actor is refused; resume them with resume_from_checkpoint=True)."
        },
    )


@dataclass
class HubFields:
    settings_group: ClassVar[str] = "Hub and publishing"

    hub_push_merged: bool = field(
        default=False,
        metadata={
            "help": "With peft_config and push_to_hub: push the adapters merged into the base model (a full "
            "model) instead of the adapters alone."
        },
    )


@dataclass
class LoggingFields:
    settings_group: ClassVar[str] = "Logging and evaluation"

    logging_steps: float = field(default=10, metadata={"help": "Log every N global steps (TRL's default, 10)."})
    log_completions: bool = field(
        default=False, metadata={"help": "Log a sample of prompts and completions every logging step."}
    )
    num_completions_to_print: int | None = field(
        default=None, metadata={"help": "How many completions log_completions prints; all if unset."}
    )
    log_multimodal: bool = field(
        default=True,
        metadata={
            "help": "With images in the prompts, the completion table sent to wandb has each row's images (TRL's "
            "'image' column); the other logs show an image's tokens as one."
        },
    )
    num_generations_eval: int | None = field(
        default=None, metadata={"help": "Completions per prompt in evaluation; default n_samples_per_prompt."}
    )


def inherited_field(config_class: type, name: str, default: Any = None, **kwargs: Any):
    """A field that changes only the default of ``config_class``'s field ``name``, keeping its one help text."""
    return field(default=default, metadata=config_class.__dataclass_fields__[name].metadata, **kwargs)
