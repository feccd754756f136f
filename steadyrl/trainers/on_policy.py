"""OnPolicyTrainer: the one training loop that PPO, RLOO and online DPO share.

One iteration::

    prompts <- sampler                          (position saved in checkpoints)
    completions <- generation backend           (HF generate, or vLLM with the actor's weights pushed)
    scores <- reward functions
    experience <- old / reference log-probs, then the algorithm's advantages
    buffer <- experience + a fixed schedule of num_ppo_epochs x mini-batches
    for each mini-batch: micro-batches -> loss -> backward; optimizer step; global_step += 1;
        callbacks decide logging and checkpointing

Algorithms subclass it and implement ``compute_advantages`` and ``compute_loss_on_batch``; one that trains
more than the actor (PPO's critic) extends ``trained_modules`` and ``prepare_for_training``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import signal
import time
from collections import defaultdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, Trainer, TrainerState, set_seed
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_utils import TrainOutput
from transformers.utils import logging

from ..callbacks import CheckpointCallback, GlobalStepCallback, RLProgressCallback
from ..checkpoint import checkpoint_name
from ..generation import make_backend, sampling_seed
from ..generation.weights import is_peft
from ..ops import completion_logprobs, last_token_index, masked_mean, offloaded, pad_prompts_and_completions
from ..rewards import as_list, check_reward_funcs, reward_func_name, score_completions
from ..sampling import PromptSampler, RolloutBuffer, minibatch_schedule
from ..scalar_head import RewardModelFunction, check_same_vocabulary, load_scalar_model
from ..zero import bind_scheduler, check_whole, gathered_for_generation, inference_engine, whole_at_load
from .checks import check_dataset, check_model_path, check_vocabulary
from .config import OnPolicyConfig
from .preemption import StopSignals
from .publish import HubMixin
from .resume import ResumeMixin

logger = logging.get_logger(__name__)


class OnPolicyTrainer(ResumeMixin, HubMixin, Trainer):
    """A ``transformers.Trainer`` whose ``train()`` runs the on-policy RL loop."""

    algorithm_name = "on-policy"
    config_class = OnPolicyConfig

    def __init__(
        self,
        model: str | PreTrainedModel,
        args: OnPolicyConfig | None = None,
        train_dataset=None,
        processing_class=None,
        reward_funcs=None,
        callbacks=None,
        peft_config=None,
        optimizers=(None, None),
        reward_model: str | PreTrainedModel | None = None,
        reward_processing_class=None,
    ):
        if args is None:
            name = model if isinstance(model, str) else model.config._name_or_path
            args = self.config_class(output_dir=f"{str(name).split('/')[-1]}-{self.algorithm_name}")
        if not isinstance(args, self.config_class):
            raise TypeError(f"args must be a {self.config_class.__name__}, got {type(args).__name__}.")
        check_dataset(train_dataset)
        check_model_path(model, "model")
        check_model_path(reward_model, "reward_model")
        self.base_model_name = model if isinstance(model, str) else model.config._name_or_path
        if isinstance(model, str):
            with whole_at_load():
                model = AutoModelForCausalLM.from_pretrained(model)
        check_whole(model, "model")
        if processing_class is None:
            processing_class = AutoTokenizer.from_pretrained(model.config._name_or_path)
        if processing_class.pad_token_id is None:
            processing_class.pad_token = processing_class.eos_token
        check_vocabulary(model, processing_class)
        reward_funcs, self.reward_model = as_list(reward_funcs), None
        if reward_model is not None:
            if isinstance(reward_model, str) and reward_processing_class is None:
                reward_processing_class = AutoTokenizer.from_pretrained(reward_model)
            self.reward_model = load_scalar_model(reward_model, "reward_model")
            check_same_vocabulary(self.reward_model, "reward_model", model, processing_class, reward_processing_class)
            scorer = RewardModelFunction(
                self.reward_model,
                processing_class,
                args.max_prompt_length,
                args.micro_rollout_batch_size,
                offload=args.ref_reward_offload,
            )
            reward_funcs.append(scorer)
        self.reward_funcs, self.reward_weights = self.checked_rewards(reward_funcs, args.reward_weights)
        if peft_config is not None:
            from peft import get_peft_model

            set_seed(args.seed)  # adapter initialisation must be reproducible; Trainer seeds only later

            model = get_peft_model(model, peft_config)
            self.ref_model = None  # the base model with adapters disabled is the reference
        else:
            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        callbacks = [GlobalStepCallback(), CheckpointCallback(args.save_final_checkpoint)] + list(callbacks or [])
        super().__init__(
            model=model,
            args=args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            callbacks=callbacks,
            optimizers=optimizers,
        )
        self.zero_stage = self.check_deepspeed_support() if self.is_deepspeed_enabled else None
        self.zero3 = self.zero_stage == 3
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(RLProgressCallback)
        self.place_frozen_models()
        self.backend = make_backend(args, processing_class, model, self.accelerator.device, self.logprob_temperature)
        self.sampler = PromptSampler(len(train_dataset), seed=args.seed)
        self.buffer: RolloutBuffer | None = None
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._rollouts = 0

    # ---- what each algorithm defines -------------------------------------------------------

    samples_per_group = 1  # mini-batches never split a group of this many consecutive samples (DPO: a pair)
    needs_old_logprobs = True  # the loss uses the sampling policy's log-probs (an importance ratio); DPO's does not

    @property
    def logprob_temperature(self) -> float:
        """Temperature of the log-probs the loss uses: the sampling temperature, the distribution samples came from."""
        return self.args.temperature

    def checked_rewards(self, reward_funcs: list, reward_weights) -> tuple[list, torch.Tensor]:
        """The reward functions (a reward model last) and one weight each, checked."""
        return check_reward_funcs(reward_funcs, reward_weights)

    def score(self, prompts: list[str], completions: list[str], completion_ids: list[list[int]], columns: dict):
        """Scores [N, num_rewards] of the rollout's completions; ``reward_weights`` combines them."""
        return score_completions(self.reward_funcs, prompts, completions, completion_ids, columns)

    def compute_advantages(self, experience: dict[str, torch.Tensor]) -> dict[str, float]:
        """Add what the loss needs (``advantages``; DPO: the chosen/rejected order) to ``experience``; return
        metrics to log."""
        raise NotImplementedError

    def compute_loss_on_batch(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        """The loss of one micro-batch and its metrics. An algorithm that trains several modules may return
        ``{module name: loss}`` instead, one term per module (their parameters must be disjoint)."""
        raise NotImplementedError

    def trained_modules(self) -> list[tuple[str, torch.nn.Module, torch.optim.Optimizer, object]]:
        """``(name, prepared model, optimizer, LR scheduler)`` of every model the run trains, the actor first."""
        return [("actor", self.model_wrapped, self.optimizer, self.lr_scheduler)]

    def place_frozen_models(self) -> None:
        """The reference and reward models: under ZeRO-3, DeepSpeed inference engines partitioned like the trained
        models (each process holds 1/N of their weights; with ``ref_reward_offload`` in CPU memory); otherwise whole
        on the device, or in CPU memory between uses with ``ref_reward_offload``."""
        args, device = self.args, self.accelerator.device
        frozen = [func for func in self.reward_funcs if isinstance(func, RewardModelFunction)]
        if self.zero3:
            config = self.accelerator.state.deepspeed_plugin.deepspeed_config
            if self.ref_model is not None:
                self.ref_model = inference_engine(self.ref_model, config, args.ref_reward_offload)
            for func in frozen:
                func.model, func.offload, func.device = (
                    inference_engine(func.model, config, func.offload),
                    False,
                    device,
                )
            return
        if self.ref_model is not None and not args.ref_reward_offload:
            self.ref_model.to(device)
        for func in frozen:
            func.to(device)

    def prepare_for_training(self, max_steps: int) -> None:
        """Create the optimizers and schedulers and let accelerate prepare them with their models."""
        self.create_optimizer_and_scheduler(num_training_steps=max_steps)
        if self.args.gradient_checkpointing:
            enable_gradient_checkpointing(self.model, self.args)
        # Schedulers stay unprepared: accelerate would step them once per process for every optimizer step.
        self.model_wrapped, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)

    # ---- the loop -----------------------------------------------------------------------------

    def total_steps(self) -> int:
        args = self.args
        if args.max_steps > 0:
            return args.max_steps
        rollouts = math.ceil(args.num_train_epochs * len(self.train_dataset) / args.rollout_batch_size)
        return rollouts * args.steps_per_rollout

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs) -> TrainOutput:
        args = self.args
        if resume_from_checkpoint is None:
            resume_from_checkpoint = args.resume_from_checkpoint
        checkpoint = self.resolve_checkpoint(resume_from_checkpoint)
        max_steps = self.total_steps()
        self.is_in_train = True
        self.prepare_for_training(max_steps)
        for _, _, optimizer, scheduler in self.trained_modules():
            bind_scheduler(scheduler, optimizer)
        self.callback_handler.optimizer, self.callback_handler.lr_scheduler = self.optimizer, self.lr_scheduler
        self.state = TrainerState(
            is_local_process_zero=self.is_local_process_zero(), is_world_process_zero=self.is_world_process_zero()
        )
        self.state.train_batch_size, self.state.max_steps = args.train_batch_size, max_steps
        self.state.compute_steps(args, max_steps)
        if checkpoint is not None:
            self._load_checkpoint(checkpoint)
        start_step, start_time = self.state.global_step, time.time()
        self.control = self.callback_handler.on_train_begin(args, self.state, self.control)
        if checkpoint is not None:
            self._restore_rng(checkpoint)

        stop = StopSignals(enabled=args.stop_on_signal)
        try:
            with stop:
                while self.state.global_step < max_steps and not self.control.should_training_stop:
                    if self.buffer is None or self.buffer.exhausted:
                        self.buffer = self.make_rollout()
                    self.control = self.callback_handler.on_step_begin(args, self.state, self.control)
                    self.optimizer_step(self.buffer.next_minibatch())
                    self.state.global_step += 1
                    self.state.epoch = self.sampler.epoch
                    self.control = self.callback_handler.on_step_end(args, self.state, self.control)
                    saved = self._log_and_save()
                    if stop.stop_requested(self.accelerator):
                        self._stop_for_signal(stop.received, saved)
        finally:
            self.backend.close()

        self.control = self.callback_handler.on_train_end(args, self.state, self.control)
        self.is_in_train = False
        losses = [log["loss"] for log in self.state.log_history if "loss" in log]
        runtime = time.time() - start_time
        metrics = {"train_runtime": runtime, "train_steps_per_second": (self.state.global_step - start_step) / runtime}
        return TrainOutput(self.state.global_step, sum(losses) / max(1, len(losses)), metrics)

    def _log_and_save(self) -> bool:
        """Log and checkpoint as the callbacks decided; return whether a checkpoint was written."""
        if self.control.should_log:
            logs = {key: sum(values) / len(values) for key, values in sorted(self._metrics.items()) if values}
            if self.accelerator.num_processes > 1:  # every process saw its own share of the rollout
                means = self.accelerator.reduce(torch.tensor(list(logs.values()), dtype=torch.float64), "mean")
                logs = dict(zip(logs, means.tolist()))
            self._metrics = defaultdict(list)
            self.log(logs)
            self.control.should_log = False
        if self.control.should_save:
            self._save_checkpoint()
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)
            self.control.should_save = False
            return True
        return False

    def _stop_for_signal(self, signum: int | None, saved: bool) -> None:
        """After a SIGTERM / SIGINT: checkpoint this step (the one exception to save_steps), end, exit 0."""
        if not saved:
            self._save_checkpoint()
            self.control = self.callback_handler.on_save(self.args, self.state, self.control)
        self.control = self.callback_handler.on_train_end(self.args, self.state, self.control)
        name = signal.Signals(signum).name if signum else "a signal on another process"
        logger.warning(
            f"Stopped by {name} after step {self.state.global_step}: {checkpoint_name(self.state.global_step)} "
            f"is in {self.args.output_dir}; run again with resume_from_checkpoint=True to continue."
        )
        raise SystemExit(0)

    def _record(self, metrics: dict[str, float]) -> None:
        for key, value in metrics.items():
            self._metrics.setdefault(key, []).append(float(value))

    # ---- rollout -------------------------------------------------------------------------------

    @torch.no_grad()
    def make_rollout(self) -> RolloutBuffer:
        """Generate, score and turn one rollout into experience with a fixed mini-batch schedule."""
        args, tok, device = self.args, self.processing_class, self.accelerator.device
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        indices = self.sampler.next(args.rollout_batch_size)
        per_rank = args.rollout_batch_size // world
        rows = self.train_dataset.select(indices[rank * per_rank : (rank + 1) * per_rank]).to_dict()
        k = args.n_samples_per_prompt
        prompts = [p for p in rows.pop("prompt") for _ in range(k)]
        columns = {name: [v for v in values for _ in range(k)] for name, values in rows.items()}
        prompt_ids = [ids[-args.max_prompt_length :] for ids in tok(prompts)["input_ids"]]

        actor = self.accelerator.unwrap_model(self.model)
        self.backend.sync_weights(actor, version=self.state.global_step)
        first = rank * per_rank  # index of this process's first prompt in the rollout
        seeds = [sampling_seed(args.seed, self._rollouts, first + i // k, i % k) for i in range(len(prompts))]
        start = time.time()
        with (
            gathered_for_generation(self.model_wrapped)
            if self.backend.runs_training_model
            else contextlib.nullcontext()
        ):
            generation = self.backend.generate(actor, prompt_ids, seeds)
        generation_time = time.time() - start
        completion_ids = generation.completion_ids
        completions = tok.batch_decode(completion_ids, skip_special_tokens=True)
        scores = self.score(prompts, completions, completion_ids, columns)

        experience = pad_prompts_and_completions(prompt_ids, completion_ids, tok.pad_token_id, device)
        experience["scores"] = (scores * self.reward_weights).sum(1).to(device)
        if args.missing_eos_penalty is not None:
            last = experience["completion_ids"].gather(1, last_token_index(experience["completion_mask"])[:, None])
            experience["scores"] -= args.missing_eos_penalty * (last.squeeze(1) != tok.eos_token_id).float()
        if self.needs_old_logprobs or generation.logprobs is not None:  # the engine's are checked against them
            experience["old_logprobs"] = self._batched_logprobs(self.model, experience)
        experience["ref_logprobs"] = self._reference_logprobs(experience)
        metrics = self._rollout_metrics(experience, scores, generation_time)
        if generation.logprobs is not None:  # health of the weight sync: the engine and the trainer agree
            engine_logprobs = torch.zeros_like(experience["old_logprobs"])
            for row, values in enumerate(generation.logprobs):
                engine_logprobs[row, : len(values)] = torch.tensor(values)
            difference = (engine_logprobs - experience["old_logprobs"]).abs()
            metrics["generation_logprob_diff"] = masked_mean(difference, experience["completion_mask"]).item()
        metrics.update(self.compute_advantages(experience))
        minibatch = args.train_batch_size // world
        schedule = minibatch_schedule(len(completion_ids), minibatch, args.num_ppo_epochs, self.samples_per_group)
        self._rollouts += 1
        return RolloutBuffer(experience={k: v.cpu() for k, v in experience.items()}, schedule=schedule, metrics=metrics)

    def micro_batched(self, model, forward, experience: dict[str, torch.Tensor]) -> torch.Tensor:
        """``forward(model, prompt_ids, prompt_mask, completion_ids, completion_mask)`` in eval mode over
        micro-batches of ``micro_rollout_batch_size`` samples, concatenated."""
        step = self.args.micro_rollout_batch_size
        keys = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
        was_training = model.training
        model.eval()
        chunks = []
        for i in range(0, experience["prompt_ids"].shape[0], step):
            chunks.append(forward(model, *(experience[key][i : i + step] for key in keys)))
        model.train(was_training)
        return torch.cat(chunks)

    def _batched_logprobs(self, model, experience: dict[str, torch.Tensor]) -> torch.Tensor:
        def logprobs(model, *tensors):
            return completion_logprobs(model, *tensors, temperature=self.logprob_temperature)[0]

        return self.micro_batched(model, logprobs, experience)

    def _reference_logprobs(self, experience: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.ref_model is not None:
            offload = self.args.ref_reward_offload and not self.zero3  # ZeRO-3: the engine offloads
            with offloaded(self.ref_model, self.accelerator.device, offload):
                return self._batched_logprobs(self.ref_model, experience)
        actor = self.accelerator.unwrap_model(self.model)
        with actor.disable_adapter():
            return self._batched_logprobs(self.model, experience)

    def _rollout_metrics(self, experience, scores: torch.Tensor, generation_time: float) -> dict[str, float]:
        mask = experience["completion_mask"]
        total = experience["scores"]
        metrics = {
            "reward": total.mean().item(),
            "reward_std": total.std().item() if len(total) > 1 else 0.0,
            "completion_length": mask.sum(1).float().mean().item(),
            "tokens_per_second": mask.sum().item() / max(generation_time, 1e-9),
        }
        if "old_logprobs" in experience:  # else the loss reports it
            kl = ((experience["old_logprobs"] - experience["ref_logprobs"]) * mask).sum(1)
            metrics["kl"] = kl.mean().item()
        if len(self.reward_funcs) > 1:
            for j, func in enumerate(self.reward_funcs):
                metrics[f"rewards/{reward_func_name(func)}"] = scores[:, j].mean().item()
        return metrics

    # ---- optimisation ---------------------------------------------------------------------------

    def optimizer_step(self, minibatch: dict[str, torch.Tensor]) -> None:
        """One global step: gradient accumulation over micro-batches, then ``step_optimizers``."""
        args, device = self.args, self.accelerator.device
        models = [model for _, model, _, _ in self.trained_modules()]
        for model in models:
            model.train()
        size = args.micro_train_batch_size
        num_micro = minibatch["prompt_ids"].shape[0] // size
        step_metrics: dict[str, float] = defaultdict(float)
        modules = {name: module for name, module, _, _ in self.trained_modules()}
        for i in range(num_micro):
            batch = {key: value[i * size : (i + 1) * size].to(device) for key, value in minibatch.items()}
            last = i == num_micro - 1
            with contextlib.ExitStack() as stack:
                if not last:  # gradients are all-reduced on the last micro-batch only
                    for model in models:
                        stack.enter_context(self.accelerator.no_sync(model))
                loss, metrics = self.compute_loss_on_batch(self.model_wrapped, batch)
                losses = loss if isinstance(loss, dict) else {"actor": loss}
                total = sum(losses.values())
                if self.is_deepspeed_enabled:
                    for name, part in losses.items():
                        deepspeed_backward(modules[name], part, last)
                else:
                    self.accelerator.backward(total / num_micro)
            step_metrics["loss"] += total.item() / num_micro
            for key, value in metrics.items():
                step_metrics[key] += float(value) / num_micro
        step_metrics.update(self.step_optimizers())
        self._record({**self.buffer.metrics, **step_metrics})

    def step_optimizers(self) -> dict[str, float]:
        """Clip gradients, step every optimizer and scheduler, zero the gradients; return their metrics."""
        metrics = {}
        for name, model, optimizer, scheduler in self.trained_modules():
            prefix = "" if name == "actor" else f"{name}_"
            if self.is_deepspeed_enabled:  # the engine clipped (gradient_clipping) and stepped at the boundary
                norm = model.get_global_grad_norm()
                metrics[f"{prefix}grad_norm"] = float(norm) if norm is not None else 0.0
            elif self.args.max_grad_norm and self.args.max_grad_norm > 0:
                norm = self.accelerator.clip_grad_norm_(model.parameters(), self.args.max_grad_norm)
                metrics[f"{prefix}grad_norm"] = float(norm)
            metrics[f"{prefix}learning_rate"] = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
        return metrics

    def check_deepspeed_support(self) -> int:
        """Refuse DeepSpeed settings the loop does not support; return the ZeRO stage."""
        config = self.accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
        stage = int(config.get("stage", 0))
        offload = any(config.get(k, {}).get("device", "none") != "none" for k in ("offload_optimizer", "offload_param"))
        if stage == 0 or (offload and stage != 3):
            raise ValueError(
                f"DeepSpeed ZeRO stage {stage}{' with offload' if offload else ''} is not supported: use zero_stage "
                "1 or 2 without offload, zero_stage 3 with or without offload (examples/accelerate_configs/), or "
                "multi-process DDP (multi_gpu.yaml)."
            )
        if stage == 3 and is_peft(self.model):
            raise ValueError(
                "peft_config under DeepSpeed ZeRO-3 is not supported: the adapters are small and the frozen base "
                "gains little from partitioning; use zero_stage 2 (examples/accelerate_configs/zero2.yaml)."
            )
        return stage

    # ---- export -----------------------------------------------------------------------------------

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if not self.is_deepspeed_enabled:
            return super().save_model(output_dir, _internal_call)
        self.save_actor(Path(output_dir or self.args.output_dir))  # every process: ZeRO-3 gathers the weights
        self.accelerator.wait_for_everyone()
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """``save_model``: the actor and tokenizer only, in plain Hugging Face format (no pickled arguments)."""
        self.save_actor(Path(output_dir or self.args.output_dir))


def deepspeed_backward(engine, loss: torch.Tensor, boundary: bool) -> None:
    """One module's backward under DeepSpeed: the engine divides ``loss`` by its gradient_accumulation_steps
    and, at the accumulation boundary, reduces, clips and steps. Each engine gets its own loss, since
    accelerate's ``backward`` drives only the last prepared engine."""
    engine.set_gradient_accumulation_boundary(boundary)
    engine.backward(loss)
    if boundary:
        engine.step()


def enable_gradient_checkpointing(model: PreTrainedModel, args: OnPolicyConfig) -> None:
    """Recompute activations in the backward pass instead of keeping them (less memory, ~30% more compute)."""
    model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs=args.gradient_checkpointing_kwargs or {"use_reentrant": False}
    )
    if hasattr(model, "enable_input_require_grads"):  # PEFT: frozen embeddings must still pass gradients on
        model.enable_input_require_grads()
