"""How ``OnPolicyTrainer`` builds its loop's stages, each from its inputs (the config, the tokenizer, the algorithm,
the models, the rewards), and registers every stateful part with the checkpointer where it is made."""

from __future__ import annotations

import copy

from ...checkpoint.checkpointer import Checkpointer
from ...reporting.run_summary import RunMeter
from ..config.dynamic_sampling import DynamicSamplingOptions
from .ahead import AheadSource
from .dynamic_sampling import DynamicSampling
from .epochs import Epochs
from .learner import Learner
from .loop_state import PendingMetrics, TrainingBuffer
from .multi_turn import MultiTurnSource
from .rollout_builder import RolloutBuilder
from .rollout_rewards import Scorer
from .sources import ActorGenerator, PromptDraw, SingleTurnSource


class StageWiring:
    """The stage-building part of ``OnPolicyTrainer`` (a base of it)."""

    def build_stages(self, train_dataset) -> None:
        """The loop's stages and the checkpoint parts of its state, each registered where it is made."""
        args, tokenizer = self.args, self.processing_class
        self.checkpointer = Checkpointer(self.accelerator)
        self.prompt_draw = PromptDraw(self.sampler, train_dataset, args, self.accelerator)
        reshard = self.accelerator.state.fsdp_plugin.reshard_after_forward if self.fsdp_version else None
        self.generator = ActorGenerator(self.backend, self.model, args, reshard)
        self.rewards = self.make_rewards()
        self.scorer = Scorer(self.rewards, tokenizer, self.conversational, args)
        source_args = (self.prompt_draw, self.generator, tokenizer, self.conversational, args)
        processor = self.processor if self.trains_on_images else None
        turns = None
        if self.multi_turn.active:
            tool_loop_tokenizer = copy.deepcopy(tokenizer) if args.max_staleness else tokenizer  # the worker's own
            turn_args = (self.prompt_draw, self.generator, tool_loop_tokenizer, self.conversational, args)
            turns = MultiTurnSource(self.multi_turn, self, self.context_length(), *turn_args, processor=processor)
        if args.max_staleness:  # reward models score on the trainer's thread, reward functions on the worker's
            on_worker = self.scored_on_worker
            self.rollout_source = AheadSource(self.scorer, on_worker, *source_args, processor=processor, turns=turns)
        elif turns is not None:
            self.rollout_source = turns
        else:
            self.rollout_source = SingleTurnSource(*source_args, processor=self.processor)
        self.rollout_source = self.algorithm_source(self.rollout_source)
        self.dynamic_sampling = None
        if isinstance(args, DynamicSamplingOptions) and args.dynamic_sampling:
            parts = (self.rollout_source, self.scorer, self.rewards, tokenizer.eos_token_id, self.accelerator, args)
            self.dynamic_sampling = DynamicSampling(*parts)
        offload_reference = args.ref_reward_offload and not self.zero3  # ZeRO-3: the engine offloads
        self.rollout_builder = RolloutBuilder(
            args,
            tokenizer,
            self.accelerator.device,
            self.algorithm,
            self.rewards,
            self.model,
            self.ref_model,
            self.uses_reference,
            offload_reference,
        )
        pad_id, deepspeed = getattr(tokenizer, "pad_token_id", None), self.is_deepspeed_enabled
        self.learner = Learner(args, self.accelerator, self.algorithm, pad_id, deepspeed)
        self.training_buffer = TrainingBuffer(self.accelerator.process_index, self.accelerator.num_processes)
        self.pending_metrics = PendingMetrics()
        self.meter = RunMeter(0)
        register = self.checkpointer.register
        register("sampler", self.sampler)
        register("rollouts", self.prompt_draw)
        register("algorithm", self.algorithm.state)
        register("update_guard", self.learner.guard, optional=True)
        register("rollout_buffer", self.training_buffer, per_process=True)
        register("pending_metrics", self.pending_metrics, per_process=True)
        register("meter", self.meter, per_process=True)
        self.epochs = Epochs(self, self.sampler, self.rollout_source, args.rollout_batch_size)
        register("epochs", self.epochs, optional=True)
        if isinstance(self.rollout_source, AheadSource):
            register("rollouts_ahead", self.rollout_source, per_process=True)

    def algorithm_source(self, source):
        """The source the algorithm's rollouts come from, given the run's (GKD mixes in off-policy rollouts)."""
        return source
