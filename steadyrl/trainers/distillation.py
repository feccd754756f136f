"""On-policy distillation (Agarwal et al., 2024, "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes"; TRL's ``DistillationTrainer``): the student samples completions, and at every completion
token is trained towards a frozen teacher's next-token distribution over the whole vocabulary. No reward functions:
the teacher is the signal.

Shapes: N sequences (one completion per prompt by default), C completion tokens, V the shared vocabulary.

    D_t = generalized JSD(p_student(. | x, y_<t), p_teacher(. | x, y_<t)) at temperature T     ops/divergence.py
          beta = 0: KL(teacher || student) (forward), 1: KL(student || teacher) (reverse), else JSD(beta)
    loss = sum of D_t over the optimizer step's loss tokens / their number (over every micro-batch and process)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import ClassVar

import torch
from transformers import PreTrainedModel

from ..checkpoint.fingerprint import model_identity
from ..distributed.placement import frozen_output_embedding, offloaded, place_frozen_models
from ..distributed.sharded_loading import load_split
from ..distributed.zero import check_whole
from ..models.loading import disable_dropout, from_pretrained_kwargs, policy_class, saved_tokenizer
from ..ops import masked_mean
from ..ops.divergence import completion_divergence
from ..redaction import redact_secrets
from ..rollout import Advantages, Rollout
from .config.field_groups import inherited_field
from .config.input_checks import check_model_path
from .config.on_policy_config import OnPolicyConfig
from .loop.algorithm import Algorithm, Processes
from .loop.on_policy import OnPolicyTrainer
from .loop.rollout_rewards import NoRewards


@dataclass
class DistillationConfig(OnPolicyConfig):
    """``OnPolicyConfig`` plus distillation's options, with TRL 1.16's ``DistillationConfig`` names and defaults: one
    completion per prompt, ``max_completion_length`` 512, ``beta`` 1.0 (reverse KL), ``temperature`` both the sampling
    and the divergence's. Each field's ``help`` describes it (docs/configuration.md lists them).

    Example::

        DistillationConfig(output_dir="out", teacher_model_name_or_path="Qwen/Qwen2.5-7B-Instruct", beta=0.5,
                           per_device_train_batch_size=8, gradient_accumulation_steps=4, max_completion_length=256)
    """

    settings_group: ClassVar[str] = "Distillation"
    _default_samples_per_prompt = 1
    trains_ahead_uncorrected: ClassVar[str | None] = (
        "the loss has no importance ratio: at each sampled prefix the student moves towards the teacher, whichever "
        "weights sampled it (TRL's AsyncDistillationTrainer)"
    )

    teacher_model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "Path or Hub id of the teacher, when the trainer is given no teacher_model."},
    )
    teacher_model_revision: str | None = field(
        default=None, metadata={"help": "Revision (branch, tag or commit) of the teacher given by name."}
    )
    teacher_model_init_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for from_pretrained when the teacher is given by name, e.g. "
            '\'{"dtype": "bfloat16"}\' (a JSON object on the command line); without a dtype the teacher loads in '
            "float32."
        },
    )
    beta: float = field(
        default=1.0,
        metadata={
            "help": "Which divergence, in [0, 1]: 0 forward KL(teacher || student), 1 reverse KL(student || "
            "teacher), 0.5 the Jensen-Shannon divergence; between them the generalized JSD (TRL's beta)."
        },
    )
    max_completion_length: int | None = inherited_field(OnPolicyConfig, "max_completion_length", 512)

    def __post_init__(self):
        self.teacher_model_init_kwargs = _dict_field(self.teacher_model_init_kwargs)
        super().__post_init__()
        if self.reward_weights is not None:
            raise ValueError(
                f"reward_weights={self.reward_weights!r} is invalid for distillation: it has no reward functions (the "
                "teacher is the signal). Leave reward_weights unset."
            )

    def _check_beta(self) -> None:
        valid = isinstance(self.beta, (int, float)) and not isinstance(self.beta, bool) and math.isfinite(self.beta)
        if not valid or not 0.0 <= self.beta <= 1.0:
            raise ValueError(
                f"beta={self.beta!r} is invalid for distillation: it chooses the divergence and must be in [0, 1] "
                "(0: forward KL, 1: reverse KL, 0.5: Jensen-Shannon)."
            )
        self.beta = float(self.beta)


def _dict_field(value):
    from .config.trl_names import parse_dict_field

    return parse_dict_field("teacher_model_init_kwargs", value, '{"dtype": "bfloat16"}')


class Distillation(Algorithm):
    """The student trained towards the teacher's next-token distribution at every completion token (no rewards, no
    advantages): the generalized JSD (``beta``) at ``temperature``, a token mean over the optimizer step.

    Args:
        args, processes, eos_token_id: as ``Algorithm``'s.
        teacher: the frozen teacher (placed: on the device, or offloaded with ``offload``; a ZeRO-3 engine).
        student_vocab_size: the student's vocabulary (the teacher's head rows past it are padding).
        offload: keep the teacher off the device between its passes (``ref_reward_offload``, not under ZeRO-3).

    Example::

        Distillation(DistillationConfig(output_dir="out", beta=0.5), Processes(accelerator), eos, teacher, 49152)
    """

    uses_rewards = False
    evaluates_loss = True  # eval_loss: the divergence of the evaluation rollout, as TRL's

    def __init__(
        self, args, processes: Processes, eos_token_id: int | None, teacher, student_vocab_size: int, offload: bool
    ) -> None:
        super().__init__(args, processes, eos_token_id)
        self.teacher, self.student_vocab_size, self.offload = teacher, student_vocab_size, offload
        self._teacher_head = None

    @classmethod
    def needs_reference(cls, args) -> bool:
        return False  # beta chooses the divergence to the teacher; there is no KL term to a reference

    def needs_old_logprobs(self) -> bool:
        return False  # the loss has no importance ratio

    @property
    def divergence_temperature(self) -> float:
        """Temperature of both distributions in the divergence: the sampling temperature, as TRL's distillation."""
        return self.args.temperature

    def advantages(self, rollout: Rollout) -> Advantages:
        """No advantages: the number of loss tokens per micro-batch, over every process, which the loss divides
        by, so that a step's loss is the token mean over all its micro-batches as in TRL."""
        return Advantages(tokens_per_micro_batch=self.tokens_per_micro_batch(rollout))

    def loss(self, model, batch: Rollout) -> tuple[torch.Tensor, dict[str, float]]:
        args, mask = self.args, self.loss_mask(batch)  # [B, C]
        with offloaded(self.teacher, self.processes.accelerator.device, self.offload):
            divergence, entropy = completion_divergence(
                model,
                batch.token_tensors,
                self.teacher,
                self.teacher_head(),
                args.beta,
                self.divergence_temperature,
                batch.images,
            )  # [B, C] each
        mask = mask.to(divergence.dtype)
        loss = (divergence * mask).sum() / batch.tokens_per_micro_batch[0].clamp(min=1.0)
        metrics = {"divergence": masked_mean(divergence.detach(), mask).item(), "entropy": masked_mean(entropy, mask)}
        return loss, {**metrics, "entropy": metrics["entropy"].item()}

    def teacher_head(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The teacher's LM head (weight [V, Ht], bias), whole, with no more rows than the student's: kept once where
        it is split over the processes (ZeRO-3, FSDP2), else read where the teacher is now."""
        if self._teacher_head is not None:
            return self._teacher_head
        weight, bias, split = frozen_output_embedding(self.teacher)
        rows = self.student_vocab_size
        head = weight[:rows], None if bias is None else bias[:rows]  # rows past the student's: padding
        if split:
            self._teacher_head = head
        return head


class DistillationTrainer(OnPolicyTrainer):
    """On-policy distillation on the shared on-policy loop, with TRL 1.16's ``DistillationTrainer`` arguments.

    Args:
        model: the student to train (``PreTrainedModel``, or a path or Hub id).
        teacher_model: the frozen teacher (``PreTrainedModel``, or a path or Hub id loaded with
            ``teacher_model_init_kwargs``, which a model object refuses); default ``args.teacher_model_name_or_path``.
            It must share the student's tokenizer (its embedding may have more rows, padding past the tokenizer, as
            Qwen2.5's 7B has over its 0.5B's): the tokenizer saved at its path, Hub id or ``config._name_or_path`` is
            compared with the student's.
        args: a ``DistillationConfig`` (or TRL's, converted field by field).
        train_dataset, eval_dataset, processing_class, callbacks, optimizers, quantization_config, peft_config,
            tools: as ``OnPolicyTrainer``'s; ``evaluate()`` reports the divergence of the
            student's completions of ``eval_dataset`` as ``eval_loss``, as TRL's.

    Example::

        trainer = DistillationTrainer(model="Qwen/Qwen2.5-0.5B-Instruct", teacher_model="Qwen/Qwen2.5-7B-Instruct",
                                      args=DistillationConfig(output_dir="out", beta=0.5), train_dataset=prompts)
        trainer.train(resume_from_checkpoint=True)
        trainer.save_model("out/student")
    """

    algorithm_name = "distillation"
    config_class = DistillationConfig
    algorithm_class = Distillation

    def __init__(
        self,
        model: str | PreTrainedModel,
        teacher_model: str | PreTrainedModel | None = None,
        args: DistillationConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools: list | None = None,
    ):
        path = getattr(args, "teacher_model_name_or_path", None)
        if teacher_model is not None and path is not None:
            raise ValueError(
                f"teacher_model and args.teacher_model_name_or_path={path!r} were both given: pass the teacher one way."
            )
        teacher_model = path if teacher_model is None else teacher_model
        if teacher_model is None:
            raise ValueError(
                "No teacher: pass teacher_model= (a model, or its path or Hub id) or set "
                "args.teacher_model_name_or_path (--teacher_model_name_or_path on the command line)."
            )
        check_model_path(teacher_model, "teacher_model")
        self._teacher_given = teacher_model
        super().__init__(
            model,
            None,
            args,
            train_dataset,
            eval_dataset,
            processing_class,
            None,
            callbacks,
            optimizers,
            quantization_config,
            peft_config,
            tools,
        )

    def add_algorithm_models(self) -> None:
        """The teacher, loaded and placed as the run's other frozen models."""
        args = self.args
        teacher = load_teacher(self._teacher_given, self.model, self.processing_class, args)
        if args.disable_dropout:
            disable_dropout(teacher)
        self.identity.update(model_identity("teacher_model", teacher))
        zero3_config = self.deepspeed_config if self.zero3 else None
        self.teacher_model = place_frozen_models(
            teacher, [], self.accelerator.device, zero3_config, args.ref_reward_offload
        )

    def algorithm_inputs(self) -> tuple:
        offload = self.args.ref_reward_offload and not self.zero3  # ZeRO-3: the engine offloads
        return self.teacher_model, self.model.config.get_text_config().vocab_size, offload

    # ---- no rewards: the teacher is the signal -------------------------------------------------------------------

    def checked_rewards(self, reward_funcs: list, args, dataset) -> tuple[list, torch.Tensor]:
        if reward_funcs:  # an environment's get_reward, the only way in: the loss would not read it
            raise ValueError(
                "DistillationTrainer has no rewards (the teacher is the signal), but an environment defines "
                "get_reward: remove it, or train with GRPOTrainer or RLOOTrainer."
            )
        return [], torch.zeros(0)

    def make_rewards(self) -> NoRewards:
        return NoRewards(self.args)


def load_teacher(teacher, policy: PreTrainedModel, tokenizer, args: DistillationConfig) -> torch.nn.Module:
    """The teacher (a path, Hub id or model), frozen, checked to read the student's token ids as the same tokens; from
    a path it is split over the processes where the run splits its models (``load_split``). Its tokenizer is the one
    saved with it (``saved_tokenizer``: at its path, or at a model object's ``config._name_or_path``, a directory or a
    Hub id read through the HF cache or the Hub)."""
    if isinstance(teacher, str):
        teacher_tokenizer = saved_tokenizer(teacher, args.trust_remote_code, args.teacher_model_revision)
        model_class = policy_class(teacher, args)  # a vision-language teacher: AutoModelForImageTextToText
        teacher = load_split(model_class, teacher, teacher_init_kwargs(args), args, frozen=True)
    else:
        check_loaded_teacher(teacher, policy, args)
        name = getattr(teacher.config, "_name_or_path", "")
        teacher_tokenizer = saved_tokenizer(name, args.trust_remote_code)
    check_teacher_vocabulary(teacher, teacher_tokenizer, policy, tokenizer)
    return teacher.eval().requires_grad_(False)


def check_loaded_teacher(teacher: PreTrainedModel, policy: PreTrainedModel, args: DistillationConfig) -> None:
    """Refuse a teacher object that is the student, split over the processes, or given loading settings it was
    loaded without (``teacher_model_init_kwargs``, as TRL refuses it)."""
    check_whole(teacher, "teacher_model")
    student_parameters = {id(p) for p in policy.parameters()}
    if any(id(p) in student_parameters for p in teacher.parameters()):
        raise ValueError(
            "teacher_model is the student itself (it shares model's parameters): frozen as the teacher it would "
            "freeze the student, and training would update nothing. Pass a separate teacher model."
        )
    if args.teacher_model_init_kwargs is not None:
        kwargs = redact_secrets(args.teacher_model_init_kwargs)
        raise ValueError(
            f"teacher_model_init_kwargs={kwargs!r} was given, but teacher_model is an already loaded model, so they "
            "would be ignored (TRL refuses them too). Pass those settings to your own from_pretrained call and leave "
            "teacher_model_init_kwargs unset, or give teacher_model as a path or Hub id."
        )


def teacher_init_kwargs(args: DistillationConfig) -> dict:
    """``from_pretrained`` keyword arguments of a teacher given by name: ``teacher_model_init_kwargs`` (float32 unless
    it gives a dtype), ``trust_remote_code`` and ``teacher_model_revision``."""
    own = SimpleNamespace(model_init_kwargs=args.teacher_model_init_kwargs, trust_remote_code=args.trust_remote_code)
    revision = {"revision": args.teacher_model_revision} if args.teacher_model_revision else {}
    return {"dtype": torch.float32, **from_pretrained_kwargs(own), **revision}


def check_teacher_vocabulary(teacher, teacher_tokenizer, policy: PreTrainedModel, tokenizer) -> None:
    """Refuse a teacher whose token ids are not the student's: a tokenizer with another vocabulary, or (without a
    tokenizer of its own) another vocab_size; or fewer embedding rows than the student, so that some token the
    student can sample has no teacher probability. With the student's tokenizer, rows past it are padding."""
    teacher_rows = teacher.config.get_text_config().vocab_size
    student_rows = policy.config.get_text_config().vocab_size
    if teacher_tokenizer is not None and teacher_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise ValueError(
            f"teacher_model's tokenizer has another vocabulary than the student's ({len(teacher_tokenizer)} tokens "
            f"for the teacher, {len(tokenizer)} for the student): distillation compares their next-token "
            "distributions token id by token id, so the teacher must share the student's tokenizer. Use a teacher "
            "of the student's model family."
        )
    if teacher_tokenizer is None and teacher_rows != student_rows:
        name = getattr(teacher.config, "_name_or_path", "")
        where = f"none is saved at {name!r}" if name else "it was not loaded from a path or Hub id"
        raise ValueError(
            f"teacher_model has vocab_size={teacher_rows} but the student has vocab_size={student_rows}, and the "
            f"teacher has no tokenizer to compare with the student's ({where}): distillation compares their "
            "next-token distributions token id by token id, so a teacher without a tokenizer must have the "
            "student's vocab_size. Save the teacher with its tokenizer (save_pretrained of both into one directory) "
            "and pass that directory as teacher_model, or use a teacher of the student's vocab_size."
        )
    if teacher_rows < student_rows:
        raise ValueError(
            f"teacher_model has vocab_size={teacher_rows}, fewer embedding rows than the student's "
            f"vocab_size={student_rows}: the student could sample token ids the teacher has no probability for."
        )
