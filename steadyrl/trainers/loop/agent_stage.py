"""Multi-turn rollouts on the shared loop (TRL's ``tools``, ``environment_factory``, ``rollout_func``): how a
rollout's prompt rows become completions when tools or environments take part, or a user's function generates.

    sample_completions()   plain: one sampled turn; tools: the tool-call loop (agents/turns.py); rollout_func: the
                           user's function, its output checked
"""

from __future__ import annotations

import hashlib

from ...agents.chat_format import (
    check_append_only,
    check_tool_template,
    enable_tool_parsing,
    parse_turn,
    tokenize_with_tools,
    tool_suffix_ids,
)
from ...agents.environments import Environments
from ...agents.rollout_func import trajectories_from
from ...agents.tools import ToolBox
from ...agents.turns import Trajectories, run_turns
from ...generation import Generation


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of a row's ``turn``-th tool round, from the row's seed: stable across restarts."""
    if turn == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/turn/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


class AgentMixin:
    """``tools``, ``environment_factory`` and ``rollout_func`` for ``OnPolicyTrainer``."""

    def setup_agents(
        self,
        tools,
        environment_factory,
        rollout_func,
        tokenizer,
        conversational: bool,
        args,
        reward_funcs: list,
        dataset,
    ) -> list:
        """Check the multi-turn arguments; return ``reward_funcs`` with a reward function for each environment class
        that defines ``get_reward`` (weight 1, appended to ``reward_weights`` as in TRL)."""
        tools = list(tools or [])
        for i, tool in enumerate(tools):
            if not callable(tool) or not hasattr(tool, "__name__"):
                raise TypeError(
                    f"tools[{i}]={tool!r} is not a function: a tool is a function with type hints and a "
                    "Google-style docstring, called by its __name__."
                )
        if rollout_func is not None and not callable(rollout_func):
            raise TypeError(
                f"rollout_func={rollout_func!r} is not callable: give a function (prompts, trainer) -> "
                "dict with prompt_ids, completion_ids and logprobs."
            )
        if rollout_func is not None and (tools or environment_factory is not None):
            raise ValueError(
                "rollout_func was given with tools / environment_factory: rollout_func generates the whole rollout "
                "itself (run the tools inside it and return env_mask), so pass one or the other."
            )
        if args.max_staleness and (rollout_func is not None or tools or environment_factory is not None):
            raise ValueError(
                f"max_staleness={args.max_staleness} generates single-turn rollouts ahead on the vLLM server; "
                "tools, environment_factory and rollout_func run synchronously: use max_staleness=0 with them."
            )
        self.rollout_func = rollout_func
        self.environments = Environments(environment_factory, tools) if environment_factory is not None else None
        self.tools = tools
        self.multi_turn = bool(tools) or self.environments is not None
        if not self.multi_turn:
            return reward_funcs
        if not conversational:
            raise ValueError(
                "tools / environment_factory need conversational prompts (a 'prompt' column of {'role', 'content'} "
                "message lists): tool calls and results are turns of a conversation rendered by the chat template."
            )
        kwargs = args.chat_template_kwargs or {}
        check_tool_template(tokenizer, kwargs)
        enable_tool_parsing(tokenizer)
        if self.environments is not None:
            self.environments.check_dataset(dataset)
            tools = [tool for name in self.environments.factories for tool in self.environments.tools_of(name)]
        check_append_only(tokenizer, tools, kwargs)
        added = [] if self.environments is None else self.environments.reward_functions()
        if added and args.reward_weights is not None and len(args.reward_weights) == len(reward_funcs):
            args.reward_weights = [*args.reward_weights, *[1.0] * len(added)]
        return reward_funcs + added

    def sample_completions(self, prompts: list, columns: dict, seeds: list[int], chunk: int | None = None):
        """``(prompts, prompt_ids, prompts truncated, generation)`` for the rollout's prompt rows; ``prompts`` as
        the reward functions see them (with an environment's ``reset()`` text appended). HF generate runs in calls of
        ``chunk`` rows (default ``micro_generation_batch_size``)."""
        args = self.args
        chunk = chunk or args.micro_generation_batch_size
        if self.rollout_func is not None:
            self.backend.sync_weights(self.model, version=self.state.global_step)
            prompt_ids, generation = trajectories_from(self.rollout_func(prompts, self), len(prompts))
            return prompts, prompt_ids, 0, generation
        if not self.multi_turn:
            prompt_ids, truncated = self.truncate_prompts(self.tokenize(prompts))
            generation = self.generate(prompt_ids, seeds, chunk=chunk)
            return prompts, prompt_ids, truncated, generation
        kwargs, tok = args.chat_template_kwargs or {}, self.processing_class
        environments, boxes, tools_per_row = None, [ToolBox(self.tools)] * len(prompts), [self.tools] * len(prompts)
        if self.environments is not None:
            names = self.environments.names_for(columns, len(prompts))
            environments = self.environments.instances(names)
            prompts = self.environments.reset(environments, prompts, columns)
            boxes = self.environments.tool_boxes(environments)
            tools_per_row = [self.environments.tools_of(name) for name in names]
        prompt_ids, truncated = self.truncate_prompts(tokenize_with_tools(prompts, tok, tools_per_row, kwargs))
        first = self.generate(prompt_ids, seeds, chunk=chunk)

        def next_turn(contexts: list[list[int]], rows: list[int], turn: int) -> Generation:
            row_seeds = [turn_seed(seeds[i], turn) for i in rows]
            return self.generate(contexts, row_seeds, chunk=chunk)

        trajectories = run_turns(
            next_turn,
            lambda i, ids, before: parse_turn(tok, ids, before, tools_per_row[i]),
            lambda messages: tool_suffix_ids(tok, messages, kwargs),
            prompt_ids,
            first,
            boxes,
            args.max_completion_length,
            args.max_tool_calling_iterations,
            self.context_length(),
        )
        if environments is not None:
            trajectories.reward_kwargs["environments"] = environments
        return prompts, prompt_ids, truncated, trajectories

    def context_length(self) -> int:
        """The longest sequence generation may be given: the model's, or vLLM's ``vllm_max_model_len``."""
        limits = [getattr(self.model.config, "max_position_embeddings", None)]
        if getattr(self.args, "use_vllm", False):
            limits.append(getattr(self.backend, "max_model_len", None) or self.args.vllm_max_model_len)
        return min(limit for limit in limits if limit) if any(limits) else 2**31

    @staticmethod
    def trajectory_fields(generation: Generation) -> dict:
        """What a multi-turn generation adds to the reward inputs: the conversations and extra keyword arguments."""
        if not isinstance(generation, Trajectories):
            return {}
        fields = {"extra": generation.reward_kwargs}
        return fields if generation.completions is None else {**fields, "completions": generation.completions}
