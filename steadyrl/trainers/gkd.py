"""Generalized knowledge distillation (GKD; Agarwal et al., 2024, "On-Policy Distillation of Language Models: Learning
from Self-Generated Mistakes"; TRL's ``GKDTrainer``): distillation (distillation.py: the teacher, the divergence) on a
mix of the student's own samples and fixed completions. Each rollout is on-policy with probability ``lmbda``
(the student samples, as in distillation); otherwise its completions are the dataset's (``seq_kd``: the teacher's,
sampled with HF generate).

    on-policy(draw) = u(seed, draw) < lmbda,  u uniform in [0, 1) from a hash of (seed, draw) alone
    D_t = generalized JSD(p_student, p_teacher) at temperature 1 (TRL's ``generalized_jsd_loss`` as its
          ``compute_loss`` calls it: ``temperature`` is the sampling temperature only)
    loss = sum of D_t over the optimizer step's loss tokens / their number

The coin reads no RNG: the draw's number is checkpointed (``rollouts``), so a resumed run, and a run on any number of
processes, makes the same choice for every rollout.
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from transformers import PreTrainedModel

from ..data.prompts import tokenize_prompts
from ..distributed.placement import offloaded
from ..generation import Generation, SamplingSettings
from ..generation.base import trim_completion
from ..generation.hf import HFGenerationBackend
from .config.batch_hierarchy import check_positive_int
from .config.field_groups import inherited_field
from .config.on_policy_config import DEFAULT_MAX_PROMPT_LENGTH, OnPolicyConfig
from .config.sft_fields import SFT_UNSUPPORTED, TRLSFTFields
from .config.trl_calls import refuse_unused
from .config.trl_names import MAX_NEW_TOKENS, SYNONYMS, UNSUPPORTED, resolve_max_prompt_length, views_of
from .distillation import Distillation, DistillationConfig, DistillationTrainer
from .loop.sources import RolloutSource, Sampled

GKD_MAX_NEW_TOKENS = 128  # TRL's GKDConfig.max_new_tokens
GKD_MAX_LENGTH = 1024  # TRL's GKDConfig.max_length (SFTConfig's): prompt + completion tokens


@views_of(MAX_NEW_TOKENS)
@dataclass
class GKDConfig(DistillationConfig, TRLSFTFields):
    """``DistillationConfig`` plus GKD's options, with TRL 1.16's ``GKDConfig`` names and defaults: ``lmbda`` 0.5,
    ``beta`` 0.5, ``temperature`` 0.9 (sampling only), ``max_new_tokens`` 128 (``max_completion_length``),
    ``max_length`` 1024 (prompt + completion), ``seq_kd`` False, ``disable_dropout`` True, ``learning_rate`` 2e-5;
    the fields TRL's ``GKDConfig`` inherits from ``SFTConfig`` (sft_fields.py). Every column of the dataset is kept
    (``remove_unused_columns`` is False, as TRL's GKDTrainer sets it): the off-policy rollouts read ``completion``.

    Example::

        GKDConfig(output_dir="out", teacher_model_name_or_path="Qwen/Qwen2.5-7B-Instruct", lmbda=0.5, beta=0.5,
                  per_device_train_batch_size=8, max_new_tokens=256)
    """

    settings_group: ClassVar[str] = "GKD"
    trains_ahead_uncorrected: ClassVar[str | None] = None  # its rollouts mix the dataset's completions: synchronous
    synonyms = (*SYNONYMS, MAX_NEW_TOKENS)
    unsupported_trl_fields = {**UNSUPPORTED, **SFT_UNSUPPORTED}

    temperature: float = inherited_field(OnPolicyConfig, "temperature", 0.9)
    lmbda: float = field(
        default=0.5,
        metadata={
            "help": "The share of on-policy rollouts, in [0, 1]: each rollout's completions are the student's with "
            "probability lmbda, else the dataset's (seq_kd: the teacher's). 1: on-policy distillation."
        },
    )
    beta: float = inherited_field(DistillationConfig, "beta", 0.5)
    max_new_tokens: int | None = field(default=None, metadata={"help": "TRL's name of max_completion_length."})
    max_completion_length: int | None = inherited_field(OnPolicyConfig, "max_completion_length", None)
    disable_dropout: bool = inherited_field(OnPolicyConfig, "disable_dropout", True)
    seq_kd: bool = field(
        default=False,
        metadata={
            "help": "Sequence-level KD: the off-policy rollouts are the teacher's samples (HF generate on the "
            "teacher, at temperature) instead of the dataset's completions."
        },
    )
    learning_rate: float = inherited_field(OnPolicyConfig, "learning_rate", 2e-5)

    def __post_init__(self):
        self.remove_unused_columns = False  # as TRL's GKDTrainer: the off-policy rollouts read the completion column
        super().__post_init__()
        self._check_sft_fields()
        valid = isinstance(self.lmbda, (int, float)) and not isinstance(self.lmbda, bool) and math.isfinite(self.lmbda)
        if not valid or not 0.0 <= self.lmbda <= 1.0:
            raise ValueError(
                f"lmbda={self.lmbda!r} is invalid: it is the share of on-policy rollouts, a number in [0, 1] (1: every "
                "rollout sampled by the student, 0: every rollout from the dataset's completions)."
            )
        self.lmbda = float(self.lmbda)

    def _resolve_lengths(self, names: dict[str, str]) -> None:
        """TRL's lengths: 128 new tokens, prompt + completion ``max_length`` 1024 (the prompt's 896 tokens)."""
        if self.max_completion_length is None:
            self.max_completion_length = GKD_MAX_NEW_TOKENS
        completion_name = names["max_completion_length"]
        check_positive_int(completion_name, self.max_completion_length)
        check_positive_int("max_length", self.max_length)
        room = GKD_MAX_LENGTH - self.max_completion_length
        self.max_prompt_length = resolve_max_prompt_length(
            self.max_prompt_length,
            self.max_length,
            self.max_completion_length,
            completion_name,
            room if room > 0 else DEFAULT_MAX_PROMPT_LENGTH,
        )
        super()._resolve_lengths(names)
        self.max_length = self.max_prompt_length + self.max_completion_length


def student_samples(seed: int, draw: int, lmbda: float) -> bool:
    """Whether the rollout of the ``draw``-th batch of prompts is on-policy: u < ``lmbda``, u uniform in [0, 1) from
    a hash of (seed, draw) alone (no RNG state: the same on every process and after a resume)."""
    digest = hashlib.blake2b(f"gkd/{seed}/{draw}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64 < lmbda


# ---- the off-policy completions ------------------------------------------------------------------------------------


def split_last_message(row: dict, argument: str) -> dict:
    """TRL's GKD row (``messages``, the completion last) as ``prompt`` (the messages before it) and ``completion``."""
    messages = row["messages"]
    if not messages or messages[-1].get("role") != "assistant":
        last = messages[-1].get("role") if messages else None
        raise ValueError(
            f"{argument} has a 'messages' conversation whose last message is {last!r}, not the assistant's: GKD trains "
            "on the last message as the completion (TRL's format). End each conversation with the assistant's reply."
        )
    return {"prompt": messages[:-1], "completion": messages[-1:]}


def prompt_and_completion(dataset, argument: str):
    """``dataset`` with ``prompt`` and ``completion`` columns: TRL's ``messages`` format split (the last message is the
    completion); a dataset with a ``prompt`` column as it is."""
    if dataset is None or isinstance(dataset, dict):
        return dataset if dataset is None else {k: prompt_and_completion(v, argument) for k, v in dataset.items()}
    names = getattr(dataset, "column_names", None) or []
    if "messages" not in names or "prompt" in names:
        return dataset
    return dataset.map(split_last_message, fn_kwargs={"argument": argument}, remove_columns=["messages"])


class DatasetCompletions:
    """The dataset's completions of drawn prompts as token ids, as the student would have sampled them: a
    conversation's reply rendered by the chat template after the prompt's generation prompt, a string's tokens and
    EOS; cut after the first EOS and to ``max_completion_length``."""

    def __init__(self, tokenizer, conversational: bool, args) -> None:
        self.tokenizer, self.conversational, self.args = tokenizer, conversational, args

    def __call__(self, prompts: list, columns: dict, seeds: list[int], prompt_ids: list[list[int]]) -> Generation:
        tok, limit = self.tokenizer, self.args.max_completion_length
        ids = self.conversation_ids(prompts, columns["completion"]) if self.conversational else self.text_ids(columns)
        return Generation([trim_completion(row, tok.eos_token_id)[:limit] for row in ids])

    def text_ids(self, columns: dict) -> list[list[int]]:
        tok = self.tokenizer
        return [ids + [tok.eos_token_id] for ids in tok(columns["completion"], add_special_tokens=False)["input_ids"]]

    def conversation_ids(self, prompts: list, completions: list) -> list[list[int]]:
        kwargs = self.args.chat_template_kwargs or {}
        heads = tokenize_prompts(prompts, self.tokenizer, True, kwargs)
        whole = self.tokenizer.apply_chat_template(
            [list(p) + list(c) for p, c in zip(prompts, completions)], tokenize=True, return_dict=True, **kwargs
        )["input_ids"]
        rows = []
        for head, ids in zip(heads, whole):
            if list(ids[: len(head)]) != head:
                raise ValueError(
                    "the chat template renders a prompt differently when its completion follows, so the completion's "
                    "tokens cannot be told apart from the prompt's: use a template whose conversation starts with "
                    "the prompt as add_generation_prompt=True renders it."
                )
            rows.append(list(ids[len(head) :]))
        return rows


class TeacherCompletions:
    """The teacher's samples of the prompt rows (``seq_kd``), with HF generate at the run's sampling settings, each
    row from its seed, in calls of ``chunk`` rows; whatever generates the student's (vLLM included)."""

    def __init__(self, teacher: torch.nn.Module, tokenizer, args, device, offload: bool) -> None:
        self.teacher, self.device, self.offload = teacher, device, offload
        self.backend = HFGenerationBackend(tokenizer, SamplingSettings.from_config(args))
        self.chunk = max(1, args.micro_generation_batch_size or args.micro_rollout_batch_size)

    def __call__(self, prompts: list, columns: dict, seeds: list[int], prompt_ids: list[list[int]]) -> Generation:
        with offloaded(self.teacher, self.device, self.offload):
            parts = [
                self.backend.generate(self.teacher, prompt_ids[i : i + self.chunk], seeds[i : i + self.chunk])
                for i in range(0, len(prompt_ids), self.chunk)
            ]
        return Generation.concatenate(parts)


class GKDSource(RolloutSource):
    """The trainer's rollout source, each rollout on-policy with probability ``lmbda`` (``student_samples`` of the
    draw's number): then the source's own rollout, else the drawn prompts with ``completions``' completions (the
    dataset's or the teacher's). Evaluation's ``complete`` is the student's, as in distillation."""

    def __init__(self, source: RolloutSource, lmbda: float, seed: int, completions) -> None:
        self.source, self.lmbda, self.seed, self.completions = source, lmbda, seed, completions

    def next(self, state) -> Sampled:
        on_policy = student_samples(self.seed, self.source.draw.draws, self.lmbda)
        sampled = self.source.next(state) if on_policy else self.off_policy()
        sampled.metrics["on_policy"] = float(on_policy)
        return sampled

    def off_policy(self) -> Sampled:
        source = self.source
        prompts, columns, seeds, prompt_index = source.draw()
        start = time.time()
        prompt_ids, truncated = source.truncate_prompts(source.tokenize(prompts))
        generation = self.completions(prompts, columns, seeds, prompt_ids)
        metrics, elapsed = {"prompts_truncated": truncated / len(prompts)}, time.time() - start
        return Sampled(prompts, columns, prompt_ids, generation, elapsed, metrics, prompt_index=prompt_index)

    def complete(self, *args, **kwargs):
        return self.source.complete(*args, **kwargs)

    def drain(self) -> None:
        self.source.drain()

    def close(self) -> None:
        self.source.close()


# ---- the algorithm and the trainer ---------------------------------------------------------------------------------


class GKD(Distillation):
    """Distillation's loss at temperature 1, as TRL's ``GKDTrainer.compute_loss`` calls ``generalized_jsd_loss``
    (its ``temperature`` samples only); the student's log-probs stay at the sampling temperature (vLLM's check)."""

    takes_images = False  # its off-policy rollouts (the dataset's completions) carry no images yet

    divergence_temperature = 1.0


class GKDTrainer(DistillationTrainer):
    """GKD on the shared on-policy loop, with TRL 1.16's ``GKDTrainer`` arguments and order.

    Args:
        model: the student to train (``PreTrainedModel``, or a path or Hub id).
        teacher_model: the frozen teacher, as ``DistillationTrainer``'s (default ``args.teacher_model_name_or_path``).
        args: a ``GKDConfig`` (or TRL's, converted field by field).
        data_collator, compute_metrics, preprocess_logits_for_metrics, formatting_func: TRL's; refused when given
            (steadyrl pads and tokenizes itself, and evaluates the divergence).
        train_dataset: TRL's format, a ``messages`` column whose last message is the completion; or ``prompt`` and
            ``completion`` columns (strings, or conversations); ``prompt`` alone with ``lmbda=1`` or ``seq_kd``.
        eval_dataset: prompts (or the same formats): ``evaluate()`` reports the divergence of the student's
            completions as ``eval_loss``.
        processing_class, callbacks, optimizers, peft_config: as ``DistillationTrainer``'s.

    Example::

        trainer = GKDTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", teacher_model="Qwen/Qwen2.5-7B-Instruct",
                             args=GKDConfig(output_dir="out", lmbda=0.5, beta=0.5), train_dataset=conversations)
        trainer.train(resume_from_checkpoint=True)
        trainer.save_model("out/student")
    """

    algorithm_name = "gkd"
    config_class = GKDConfig
    algorithm_class = GKD

    def __init__(
        self,
        model: str | PreTrainedModel,
        teacher_model: str | PreTrainedModel | None = None,
        args: GKDConfig | None = None,
        data_collator=None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        compute_metrics=None,
        callbacks=None,
        optimizers=(None, None),
        preprocess_logits_for_metrics=None,
        peft_config=None,
        formatting_func=None,
    ):
        unused = dict(data_collator=data_collator, compute_metrics=compute_metrics)
        refuse_unused("GKDTrainer", **unused, preprocess_logits_for_metrics=preprocess_logits_for_metrics)
        if formatting_func is not None:
            raise ValueError(
                "GKDTrainer(formatting_func=...) is not supported: steadyrl reads the dataset's messages (or prompt "
                "and completion columns) and renders them with the chat template. Leave it unset."
            )
        train_dataset = prompt_and_completion(train_dataset, "train_dataset")
        eval_dataset = prompt_and_completion(eval_dataset, "eval_dataset")
        super().__init__(
            model,
            teacher_model,
            args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
            peft_config=peft_config,
        )

    def build_stages(self, train_dataset) -> None:
        check_completions(train_dataset, self.args)  # before any stage is built
        super().build_stages(train_dataset)

    def algorithm_source(self, source: RolloutSource) -> GKDSource:
        """The run's source with off-policy rollouts mixed in: the dataset's completions, or with ``seq_kd`` the
        teacher's."""
        args = self.args
        check_teacher_generates(args, self.zero3, self.fsdp_version)
        if args.seq_kd:
            offload = args.ref_reward_offload and not self.zero3
            device = self.accelerator.device
            completions = TeacherCompletions(self.teacher_model, self.processing_class, args, device, offload)
        else:
            completions = DatasetCompletions(self.processing_class, self.conversational, args)
        return GKDSource(source, args.lmbda, args.seed, completions)


def check_completions(dataset, args: GKDConfig) -> None:
    """Refuse a dataset without completions when some rollouts are to be made of them."""
    names = getattr(dataset, "column_names", None)
    if args.lmbda == 1.0 or args.seq_kd or names is None or "completion" in names:
        return
    raise ValueError(
        f"train_dataset has no completions (its columns: {', '.join(names)}), but lmbda={args.lmbda} makes about "
        f"{1 - args.lmbda:.0%} of the rollouts of the dataset's completions: give TRL's 'messages' column (the "
        "completion as the last, assistant message) or 'prompt' and 'completion' columns; or set lmbda=1.0 (every "
        "rollout the student's) or seq_kd=True (the teacher's completions)."
    )


def check_teacher_generates(args: GKDConfig, zero3: bool, fsdp_version: int | None) -> None:
    """Refuse ``seq_kd`` with a teacher split over the processes (ZeRO-3, FSDP2): HF generate needs it whole."""
    if not args.seq_kd or args.lmbda == 1.0 or not (zero3 or fsdp_version):
        return
    split = "partitioned by ZeRO-3" if zero3 else "sharded by FSDP2"
    raise ValueError(
        f"seq_kd=True with a teacher {split}: the teacher's completions are sampled with HF generate on the whole "
        "teacher, which steadyrl does not gather for generation. Use seq_kd=False (the dataset's completions), "
        "lmbda=1.0, or DeepSpeed ZeRO-2 / one process."
    )
