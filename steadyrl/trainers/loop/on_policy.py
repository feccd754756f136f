"""OnPolicyTrainer: the one training loop that PPO, RLOO, GRPO and online DPO share.

One global step, as ``run_loop`` and ``make_rollout_buffer`` call the stages (each an object the trainer holds,
built from its inputs by stage_wiring.py)::

    sampled  <- rollout_source.next(state)   prompts (PromptDraw) -> completions: sources.py (max_staleness: ahead.py;
                                             tools / environments / rollout_func: multi_turn.py)
    scores   <- scorer(sampled, state)       reward functions and models on TRL's inputs: rollout_rewards.py
                                             (dynamic_sampling: both, repeated until the groups whose rewards differ
                                             fill the rollout: dynamic_sampling.py)
    rollout  <- rollout_builder(...)         padded tokens, total reward, old / reference log-probs: rollout_builder.py
    rollout  <- + algorithm.advantages()     the algorithm object: grpo.py, rloo.py, ppo.py, ... (math in ops/)
    metrics  <- learner.step(minibatch, ...) micro-batches -> algorithm.loss -> backward -> optimizer: learner.py
    global_step += 1; the callbacks decide logging, evaluation and the checkpoint (checkpoint/checkpointer.py)

Every stateful part (the prompt sampler and draw, the rollout buffer, rollouts generated ahead, pending metrics, the
meter, the algorithm's state, RNG) is registered with the checkpointer where it is made. An algorithm is an
``Algorithm`` (algorithm.py) its trainer shell builds (trainer_hooks.py); a shell that trains more than the actor
(PPO's critic) extends ``trained_modules`` and ``prepare_for_training``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import PreTrainedModel, Trainer
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging

from ...callbacks import CheckpointCallback, GlobalStepCallback, RLProgressCallback
from ...checkpoint.fingerprint import run_identity
from ...checkpoint.output_dir import take_output_dir
from ...data.images import is_processor, text_tokenizer
from ...data.prompts import UserTurns, check_prompts
from ...data.sampling import make_sampler
from ...distributed.fsdp import enable as enable_fsdp
from ...distributed.placement import place_frozen_models
from ...distributed.zero import bind_scheduler
from ...generation import make_backend
from ...models.float32_head import cast_lm_head_to_fp32
from ...models.loading import (
    check_deepspeed_support,
    check_master_weights,
    disable_dropout,
    from_pretrained_kwargs,
    load_policy,
    policy_and_reference,
    reward_model_scorer,
)
from ...models.scalar_head import RewardModelFunction
from ...models.zero3_release import bound_zero3_buffers
from ...publish.actor import PublishMixin
from ...reporting.completion_log import CompletionLog
from ...reporting.run_summary import MetricsLog
from ...rewards import as_list
from ...rollout import Rollout, RolloutBuffer
from ..config.float32_head import Float32HeadOptions
from ..config.input_checks import check_image_columns, check_model_path, check_output_dir, check_train_dataset
from ..config.on_policy_config import OnPolicyConfig
from ..config.trl_calls import check_call_order, load_reference, named_load_failure, refuse_unused, reward_model_entries
from ..config.trl_config import as_own_config
from .ahead_request import check_partial_rollouts
from .evaluation import EvaluationMixin, check_eval_dataset
from .loop_state import whole_rollout_buffer
from .multi_turn import check_ahead_turns, check_multi_turn, environment_owned_data
from .preemption import StopSignals
from .reference_sync import check_reference_sync, mix_into_reference, sync_due
from .reporting import ReportingMixin
from .run_start import start_run
from .saving import SavingMixin
from .stage_wiring import StageWiring
from .trainer_hooks import TrainerHooks
from .trl_attributes import TRLAttributesMixin
from .vision_checks import check_vision_inputs, check_vision_run, find_unused_vision_parameters

logger = logging.get_logger(__name__)


class OnPolicyTrainer(
    TrainerHooks,
    StageWiring,
    SavingMixin,
    EvaluationMixin,
    ReportingMixin,
    PublishMixin,
    TRLAttributesMixin,
    Trainer,
):
    """A ``transformers.Trainer`` whose ``train()`` runs the on-policy RL loop; the algorithms subclass it.

    Args (TRL's positional order: model, reward_funcs, args, train_dataset, eval_dataset, processing_class,
    reward_processing_classes, callbacks, optimizers, quantization_config, peft_config, tools, rollout_func,
    environment_factory):
        model: the policy (actor) to train: a ``PreTrainedModel`` or a local path or Hub id of a causal LM.
        reward_funcs: a callable or a list of them, called as ``func(prompts=..., completions=...,
            completion_ids=..., **columns)`` and returning one float per completion; with conversations,
            ``prompts`` are the message lists and each completion is ``[{"role": "assistant", "content": text}]``.
            An entry that is a path, Hub id or ``AutoModelForSequenceClassification`` (``num_labels=1``) is a
            reward model, scored in its place, as in TRL.
        args: the algorithm's config (``RLOOConfig``, ``PPOConfig``, ...); default: its defaults with
            ``output_dir`` named after the model.
        train_dataset: a ``datasets.Dataset`` (or, with ``max_steps``, a streaming ``IterableDataset``) with a
            ``prompt`` column of strings or of conversations (lists of ``{"role", "content"}`` messages, rendered
            with the tokenizer's chat template); its other columns reach the reward functions as keyword arguments.
        eval_dataset: held-out prompts, like ``train_dataset``, for ``evaluate()`` (``eval_strategy="steps"``
            evaluates every ``eval_steps``).
        processing_class: the policy's tokenizer; default: loaded from the model's directory.
        reward_processing_classes: the reward models' tokenizers (one, or a list aligned with ``reward_funcs``);
            when one differs from the policy's, completions are re-rendered with it (and its chat template).
        callbacks: more ``TrainerCallback``s, after steadyrl's step and checkpoint callbacks.
        optimizers: ``(optimizer, lr_scheduler)`` for the actor, as in ``Trainer``; default AdamW and ``args``'
            schedule.
        quantization_config: TRL's; refused (steadyrl trains the model as loaded).
        peft_config: a ``peft`` config to train adapters; the base model with adapters disabled is then the
            reference.
        tools: functions (sync or async, type-hinted, Google-style docstrings) the model may call: multi-turn
            rollouts whose tool results are in the trajectory but out of the loss (docs/multi-turn.md).
        rollout_func: TRL's ``rollout_func(prompts, trainer)`` -> dict of ``prompt_ids``, ``completion_ids``,
            ``logprobs``, optional ``env_mask``; other fields reach the reward functions.
        environment_factory: a class or function making one environment per rollout row (``reset``, its methods
            as tools, ``get_reward``), or a dict of them picked by each row's ``environment`` column.
        reward_model (keyword): a reward model scored after ``reward_funcs``, its score the last entry of
            ``reward_weights``; reward_processing_class (keyword): its tokenizer.
        ref_model (keyword): the reference model (path, Hub id or model) instead of a copy of ``model``.

    Example::

        RLOOTrainer("Qwen/Qwen2.5-0.5B-Instruct", [my_reward], RLOOConfig(output_dir="out"), train_dataset)
    """

    algorithm_name = "on-policy"
    config_class = OnPolicyConfig

    def __init__(
        self,
        model: str | PreTrainedModel,
        reward_funcs=None,
        args: OnPolicyConfig | None = None,
        train_dataset=None,
        eval_dataset=None,
        processing_class=None,
        reward_processing_classes=None,
        callbacks=None,
        optimizers=(None, None),
        quantization_config=None,
        peft_config=None,
        tools: list | None = None,
        rollout_func=None,
        environment_factory=None,
        *,
        reward_model: str | PreTrainedModel | None = None,
        reward_processing_class=None,
        ref_model: str | PreTrainedModel | None = None,
    ):
        name = type(self).__name__
        check_call_order(name, reward_funcs, args, train_dataset)
        refuse_unused(name, quantization_config=quantization_config)
        if reward_processing_class is not None and reward_processing_classes is not None:
            raise ValueError(
                "reward_processing_class and reward_processing_classes were both given: they name the same thing "
                "(TRL's name is reward_processing_classes); give one of them."
            )
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = self.config_class(output_dir=f"{str(name).split('/')[-1]}-{self.algorithm_name}")
        args = as_own_config(args, self.config_class)  # a TRL config is converted field by field
        train_dataset = environment_owned_data(train_dataset, environment_factory, args)
        check_train_dataset(train_dataset, eval_dataset, args)
        check_output_dir(args.output_dir)
        check_model_path(model, "model")
        check_model_path(reward_model, "reward_model")
        self.base_model_name = model if isinstance(model, str) else model.config._name_or_path
        model, processing_class = load_policy(model, processing_class, args)
        self.processor = processing_class if is_processor(processing_class) else None  # a vision-language model's
        processing_class = text_tokenizer(processing_class)
        for argument, dataset in (("train_dataset", train_dataset), ("eval_dataset", eval_dataset)):
            check_image_columns(dataset, argument, self.processor is not None)
        self.conversational = check_prompts(train_dataset, "train_dataset", processing_class)
        self.trains_on_images = check_vision_inputs(self, train_dataset)
        if eval_dataset is not None:
            check_eval_dataset(eval_dataset, self.conversational)
        reward_funcs, self.reward_model = as_list(reward_funcs), None
        self.multi_turn, reward_funcs = check_multi_turn(
            tools,
            environment_factory,
            rollout_func,
            processing_class,
            self.conversational,
            args,
            reward_funcs,
            train_dataset,
        )
        if self.processor is not None and self.multi_turn.active and self.multi_turn.rollout_func is None:
            self.trains_on_images = True  # tools may return images (TRL's multimodal tool replies)
        entries = reward_model_entries(reward_funcs, reward_processing_classes)
        if reward_model is not None:  # steadyrl's own keyword: a reward model scored last
            entries.append((len(reward_funcs), reward_model, reward_processing_class or reward_processing_classes))
            reward_funcs.append(reward_model)
        # TRL's attribute: each reward model's tokenizer (given, its own, or the policy's it shares), None for functions
        self.reward_processing_classes = [None] * len(reward_funcs)
        for index, path_or_model, tokenizer in entries:
            is_keyword = reward_model is not None and index == len(reward_funcs) - 1
            with named_load_failure("reward_model" if is_keyword else f"reward_funcs[{index}]", path_or_model):
                scorer = reward_model_scorer(
                    path_or_model, tokenizer, model, processing_class, args, self.conversational
                )
            self.reward_model = scorer.model if self.reward_model is None else self.reward_model
            reward_funcs[index] = scorer
            given = tokenizer if tokenizer is not None else scorer.tokenizer
            self.reward_processing_classes[index] = given if given is not None else processing_class
        self.reward_funcs, self.reward_weights = self.checked_rewards(reward_funcs, args, train_dataset)
        if args.max_staleness:
            check_ahead_turns(self.multi_turn, self.scored_on_worker, self.processor if self.trains_on_images else None)
            check_partial_rollouts(args.partial_rollout_tokens, self.multi_turn.active, self.trains_on_images)
        self.uses_reference = self.algorithm_class.needs_reference(args)
        if ref_model is not None and not self.uses_reference:
            raise ValueError(
                f"ref_model was given, but with beta={args.beta} {name} has no KL term and uses no reference model: "
                "set beta > 0, or leave ref_model unset."
            )
        model, self.ref_model = policy_and_reference(model, peft_config, args.seed, self.uses_reference, args)
        if ref_model is not None:  # the given reference replaces the copy (under PEFT: the disabled adapters)
            self.ref_model = load_reference(ref_model, model, from_pretrained_kwargs(args), args)
        check_reference_sync(args.sync_ref_model, self.ref_model, peft_config is not None)
        for module in (m for m in (model, self.ref_model) if m is not None):
            if args.disable_dropout:
                disable_dropout(module)
            if isinstance(args, Float32HeadOptions) and args.cast_lm_head_to_fp32:  # GRPO's (TRL's)
                cast_lm_head_to_fp32(module)
        callbacks = [GlobalStepCallback(), CheckpointCallback(args.save_final_checkpoint)] + list(callbacks or [])
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            eval_dataset=eval_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        self.zero_stage = check_deepspeed_support(self.deepspeed_config, self.model) if self.deepspeed_config else None
        if self.zero_stage == 3:
            bound_zero3_buffers(self.deepspeed_config, self.model)
        self.fsdp_version = enable_fsdp(self.accelerator, self.model, self.args.fsdp_plugin_args)
        self.is_fsdp_enabled = self.is_fsdp_enabled or self.fsdp_version is not None
        check_master_weights(self.model, "model", args, self.deepspeed_config)
        self.identity = run_identity(
            self.model,
            self.reward_funcs,
            self.processor or processing_class,
            train_dataset,
            self.ref_model,
            self.uses_reference,
            self.accelerator.mixed_precision,
            self.deepspeed_config,
        )
        self.zero3 = self.zero_stage == 3
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(RLProgressCallback)
        scorers = [func for func in self.reward_funcs if isinstance(func, RewardModelFunction)]
        zero3_config = self.deepspeed_config if self.zero3 else None
        self.ref_model = place_frozen_models(
            self.ref_model, scorers, self.accelerator.device, zero3_config, args.ref_reward_offload
        )
        self.add_algorithm_models()
        self.sampler = make_sampler(train_dataset, args.seed, args.shuffle_dataset, self.conversational)
        self.algorithm = self.make_algorithm()
        temperature = self.algorithm.logprob_temperature
        self.backend = make_backend(args, processing_class, model, self.accelerator.device, temperature)
        if self.trains_on_images:
            check_vision_run(self)
        main = self.accelerator.is_main_process
        turns = UserTurns.of(processing_class, args.chat_template_kwargs) if self.conversational else None
        log = CompletionLog(args.output_dir, args.num_completions_to_print, turns, args.log_unique_prompts)
        self.completion_log = log if main else None
        self.metrics_log = MetricsLog(args.output_dir) if main else None
        self.build_stages(train_dataset)

    def _build_accelerator_args(self, **kwargs) -> dict:
        return find_unused_vision_parameters(super()._build_accelerator_args(**kwargs), self.args, self.processor)

    def context_length(self) -> int:
        """The longest sequence generation may be given: the model's, or the backend's (vLLM's ``max_model_len``)."""
        limits = [getattr(self.model.config, "max_position_embeddings", None), self.backend.max_model_len]
        return min(limit for limit in limits if limit) if any(limits) else 2**31

    @property
    def scored_on_worker(self) -> bool:
        """Generation ahead: the worker thread scores with the reward functions; reward models (on the trainer's
        device, in its collectives) score on the trainer's thread."""
        return not any(isinstance(func, RewardModelFunction) for func in self.reward_funcs)

    @property
    def reference_module(self) -> PreTrainedModel | None:
        """The reference's Hugging Face model (inside its DeepSpeed inference engine under ZeRO-3); None under PEFT."""
        return self.ref_model.module if self.zero3 and self.ref_model is not None else self.ref_model

    @property
    def deepspeed_config(self) -> dict | None:
        return self.accelerator.state.deepspeed_plugin.deepspeed_config if self.is_deepspeed_enabled else None

    # ---- the loop -----------------------------------------------------------------------------

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs) -> TrainOutput:
        args = self.args
        if resume_from_checkpoint is None:
            resume_from_checkpoint = args.resume_from_checkpoint
        lock, checkpoint = take_output_dir(resume_from_checkpoint, args, self.accelerator)
        try:
            return self.run_loop(checkpoint)
        finally:
            self.is_in_train = False  # a later evaluate() takes the lock itself
            self.backend.release()  # claimed again by an evaluate() after the loop (on_train_end)
            if lock is not None:
                lock.release()

    @torch.no_grad()
    def make_rollout_buffer(self) -> RolloutBuffer:
        """The next rollout, through each stage in order, as a buffer with a fixed mini-batch schedule."""
        if self.dynamic_sampling is not None:  # draws until the groups whose rewards differ fill the rollout
            sampled, scores, metrics = self.dynamic_sampling(self.state)
        else:
            sampled = self.rollout_source.next(self.state)  # prompts -> completions
            scores, metrics = (sampled.scores, {}) if sampled.scores is not None else self.scorer(sampled, self.state)
        rollout, metrics = self.rollout_builder(sampled, scores, {**metrics, **sampled.metrics})
        added = self.algorithm.advantages(rollout)  # the algorithm's part
        rollout, metrics = rollout.with_advantages(added), {**metrics, **added.metrics}
        step, group = self.state.global_step, self.algorithm.samples_per_group
        return whole_rollout_buffer(rollout, metrics, self.args, step, group, self.accelerator)

    def train_on_minibatch(self, minibatch: Rollout) -> dict[str, float]:
        """One global step's update of every trained module on ``minibatch`` (learner.py); its metrics."""
        return self.learner.step(minibatch, self.trained_modules(), self.state.global_step, self.fire)

    def fire(self, event: str) -> None:
        """Call the callbacks' ``event`` as ``Trainer`` does, keeping the control they return."""
        self.control = getattr(self.callback_handler, event)(self.args, self.state, self.control)

    def run_loop(self, checkpoint: Path | None) -> TrainOutput:
        """Train from ``checkpoint`` (or from the start) to ``max_steps``, with ``output_dir`` locked."""
        args = self.args
        max_steps = args.total_steps(self.sampler.num_prompts)  # a stream's: None, with max_steps set
        self.is_in_train = True
        self.prepare_for_training(max_steps)
        self.generator.engine = self.model_wrapped  # ZeRO-3 gathers the engine's partitions for HF generate
        for module in self.trained_modules():
            bind_scheduler(module.scheduler, module.optimizer)
        self.callback_handler.optimizer, self.callback_handler.lr_scheduler = self.optimizer, self.lr_scheduler
        start_run(self, checkpoint, max_steps)  # TrainerState (the checkpoint's), on_train_begin, RNG

        stop = StopSignals(enabled=args.stop_on_signal)
        try:
            with stop:
                while self.state.global_step < max_steps and not self.control.should_training_stop:
                    self.epochs.begin_if_new()  # on_epoch_begin: the first step of a pass or of this train() call
                    # a step begins before the rollout it needs, if any: generation is part of the step it feeds
                    self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                    current = self.training_buffer
                    if current.needs_rollout:
                        self.epochs.rollout_begins()
                        current.buffer = self.make_rollout_buffer()
                        self.meter.tokens += current.counted_tokens()
                    metrics = self.train_on_minibatch(current.next_minibatch())
                    self.pending_metrics.record({**current.buffer.metrics, **metrics})
                    self.state.global_step += 1
                    if sync_due(args, self.state.global_step):  # TR-DPO: the reference moves towards the policy
                        alpha, main = args.ref_model_mixup_alpha, self.accelerator.is_main_process
                        mix_into_reference(self.model, self.reference_module, alpha, main)
                    self.state.epoch = self.sampler.epoch
                    self.control = self.callback_handler.on_step_end(args, self.state, self.control)
                    self.report_step()  # log and evaluate as the callbacks decided
                    preempted = stop.received is not None
                    saved = self.save_if_due(preempted)  # every save_steps
                    # a signal stops the run after this step's checkpoint; at the last step the run simply completes
                    stopping = stop.stop_requested(self.accelerator) and self.state.global_step < max_steps
                    saved = self.epochs.end_if_due(max_steps, preempted, stopping) or saved  # on_epoch_end
                    if stopping:
                        self.stop_for_signal(stop.received, saved)
        finally:
            self.rollout_source.close()
            self.backend.close()
            # Left ready to use: in train mode with gradient checkpointing, transformers' generate drops its KV cache
            # at every layer and each new token loses the context ("The capital of France is" -> "The-----").
            self.model.eval()

        summary = self.report_summary()
        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        self.is_in_train = False
        return TrainOutput(self.state.global_step, summary.get("train_loss", 0.0), summary)
