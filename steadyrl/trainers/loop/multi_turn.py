"""Multi-turn rollouts (TRL's ``tools``, ``environment_factory``, ``rollout_func``): the rollout source whose prompt
rows become completions through the tool-call loop (agents/turns.py), or through the user's function.

    environment_owned_data()  TRL's environment-owned prompts: no train_dataset, or one without a 'prompt' column
    check_multi_turn()   the arguments checked when the trainer is built -> ``MultiTurn`` and the reward functions
    MultiTurnSource      ``SingleTurnSource.complete`` for tools / environments / rollout_func
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import datasets

from ...agents.chat_format import (
    check_tool_template,
    enable_tool_parsing,
    parse_turn,
    tokenize_with_tools,
    tool_suffix_ids,
    training_template_kwargs,
)
from ...agents.environments import Environments
from ...agents.rollout_func import trajectories_from
from ...agents.tools import ToolBox
from ...agents.turn_images import ToolReply, TurnImages, reply_with_images
from ...agents.turns import run_turns
from ...data.images import has_images, image_token_ids
from ...generation import Generation
from .sources import SingleTurnSource


def turn_seed(seed: int, turn: int) -> int:
    """The sampling seed of a row's ``turn``-th tool round, from the row's seed: stable across restarts."""
    if turn == 0:
        return seed
    digest = hashlib.blake2b(f"{seed}/turn/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


@dataclass
class MultiTurn:
    """The multi-turn arguments of a trainer, checked."""

    tools: list = field(default_factory=list)
    environments: Environments | None = None
    rollout_func: Callable | None = None
    template_kwargs: dict = field(default_factory=dict)  # chat_template_kwargs, with TRL's training template if swapped

    @property
    def active(self) -> bool:
        return bool(self.tools) or self.environments is not None or self.rollout_func is not None


EMPTY_USER_TURN = [{"role": "user", "content": ""}]


def environment_owned_data(dataset, environment_factory, args):
    """TRL's environment-owned data. With an ``environment_factory`` whose ``reset()`` returns each prompt,
    ``train_dataset`` may be omitted: ``max_steps`` sets the run's length and a placeholder of one rollout's empty
    user turns is drawn again and again. A dataset without a 'prompt' column (a dict factory's routing column
    alone) starts each row from an empty user turn. Anything else is returned as given."""
    if environment_factory is None:
        return dataset
    if dataset is None:
        if isinstance(environment_factory, dict):
            raise ValueError(
                f"A `dict` `environment_factory` ({list(environment_factory)}) requires a `train_dataset` with an "
                "'environment' column to route each example to its environment: give one, or pass a single "
                "environment factory."
            )
        if args.max_steps <= 0:
            raise ValueError(
                f"When training without a `train_dataset` (the environment owns the data and returns the prompt "
                f"from reset()), max_steps={args.max_steps} cannot size the run: set max_steps to the number of "
                "optimizer steps to train."
            )
        return datasets.Dataset.from_dict({"prompt": [EMPTY_USER_TURN] * args.rollout_batch_size})
    columns = getattr(dataset, "column_names", None)
    if columns is None or "prompt" in columns:
        return dataset
    if isinstance(dataset, datasets.IterableDataset):
        return dataset.map(lambda row: {"prompt": EMPTY_USER_TURN})
    return dataset.add_column("prompt", [EMPTY_USER_TURN] * len(dataset))


def check_multi_turn(
    tools, environment_factory, rollout_func, tokenizer, conversational: bool, args, reward_funcs: list, dataset
) -> tuple[MultiTurn, list]:
    """Check the multi-turn arguments; return them and ``reward_funcs`` with a reward function for each environment
    class that defines ``get_reward`` (weight 1, appended to ``reward_weights`` as in TRL)."""
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
    if args.max_staleness and rollout_func is not None:
        raise ValueError(
            f"max_staleness={args.max_staleness} generates rollouts ahead on a worker thread while the trainer "
            "trains, and rollout_func is handed the trainer and generates with its live weights, which that training "
            "changes meanwhile: use tools or environment_factory (run ahead), or max_staleness=0 with rollout_func."
        )
    environments = Environments(environment_factory, tools) if environment_factory is not None else None
    multi_turn = MultiTurn(tools, environments, rollout_func)
    if not tools and environments is None:
        return multi_turn, reward_funcs
    if not conversational:
        raise ValueError(
            "tools / environment_factory need conversational prompts (a 'prompt' column of {'role', 'content'} "
            "message lists): tool calls and results are turns of a conversation rendered by the chat template."
        )
    kwargs = args.chat_template_kwargs or {}
    check_tool_template(tokenizer, kwargs)
    enable_tool_parsing(tokenizer)
    if environments is not None:
        environments.check_dataset(dataset)
        tools = [tool for name in environments.factories for tool in environments.tools_of(name)]
    multi_turn.template_kwargs = training_template_kwargs(tokenizer, tools, kwargs)
    added = [] if environments is None else environments.reward_functions()
    if added and args.reward_weights is not None and len(args.reward_weights) == len(reward_funcs):
        args.reward_weights = [*args.reward_weights, *[1.0] * len(added)]
    return multi_turn, reward_funcs + added


def check_ahead_turns(multi_turn: MultiTurn, scores_on_worker: bool, processor) -> None:
    """What the tool loop generating ahead (``max_staleness``) cannot take, refused with the reason."""
    if not multi_turn.active:
        return
    if multi_turn.environments is not None and not scores_on_worker:
        raise ValueError(
            "max_staleness with environment_factory and a reward model: a reward model scores on the trainer's "
            "thread when the rollout is trained on, after a checkpoint may have stored it, and the environments its "
            "reward functions read are live objects a checkpoint cannot store. Use reward functions (they score on "
            "the worker, with the environments), tools instead of environments, or max_staleness=0."
        )
    if processor is not None:
        raise ValueError(
            "max_staleness with tools or environment_factory and a vision-language model's images: the tool loop "
            "runs ahead for text only so far (its replies' images are not stored with a rollout generated ahead). "
            "Use max_staleness=0 (docs/vision.md)."
        )


class MultiTurnSource(SingleTurnSource):
    """Rollouts whose completions interleave sampled turns with tool results (masked out of the loss by
    ``env_mask``), or come from ``rollout_func(prompts, trainer)``: TRL's API hands the trainer to it, so this source
    holds it (weakly: the trainer holds its source)."""

    def __init__(self, multi_turn: MultiTurn, trainer, context_length: int, *args, processor=None) -> None:
        super().__init__(*args, processor=processor)
        self.multi_turn, self.context_length = multi_turn, context_length
        self.rollout_func_trainer = weakref.ref(trainer)

    def complete(self, prompts: list, columns: dict, seeds: list[int], version: int, chunk: int | None = None):
        """``prompts`` come back as the reward functions see them (with an environment's ``reset()`` text)."""
        args, tok, multi_turn = self.args, self.tokenizer, self.multi_turn
        chunk = chunk or args.micro_generation_batch_size
        if multi_turn.rollout_func is not None:
            self.generate.backend.sync_weights(self.generate.actor, version=version)
            output = multi_turn.rollout_func(prompts, self.rollout_func_trainer())
            prompt_ids, generation = trajectories_from(output, len(prompts), multi_turn.rollout_func)
            return prompts, prompt_ids, 0, generation
        kwargs, tools = multi_turn.template_kwargs, multi_turn.tools
        environments, boxes, tools_per_row = None, [ToolBox(tools)] * len(prompts), [tools] * len(prompts)
        if multi_turn.environments is not None:
            pool = multi_turn.environments
            names = pool.names_for(columns, len(prompts))
            environments = pool.instances(names)
            prompts = pool.reset(environments, prompts, columns)
            boxes = pool.tool_boxes(environments)
            tools_per_row = [pool.tools_of(name) for name in names]
        prompt_images, images = None, None
        if self.processor is not None and has_images(prompts):
            prompt_ids, prompt_images = self.encode_with_images(prompts, tools_per_row, kwargs)
            truncated = 0
        else:
            prompt_ids, truncated = self.truncate_prompts(tokenize_with_tools(prompts, tok, tools_per_row, kwargs))
        if self.processor is not None:  # a vision-language model: tools may return images
            images = TurnImages(prompt_images, prompt_ids, image_token_ids(self.processor, self.generate.actor))
        first = self.generate(prompt_ids, seeds, version, chunk=chunk, images=prompt_images)

        def next_turn(contexts: list[list[int]], rows: list[int], turn: int) -> Generation:
            seeds_of_rows = [turn_seed(seeds[i], turn) for i in rows]
            turn_images = None if images is None else images.of_rows(rows, contexts)
            return self.generate(contexts, seeds_of_rows, version, chunk=chunk, images=turn_images)

        def reply_of(messages: list[dict]) -> ToolReply:
            with_images = None if self.processor is None else reply_with_images(self.processor, messages, kwargs)
            return with_images or ToolReply(tool_suffix_ids(tok, messages, kwargs))

        trajectories = run_turns(
            next_turn,
            lambda i, ids, before: parse_turn(tok, ids, before, tools_per_row[i]),
            reply_of,
            prompt_ids,
            first,
            boxes,
            args.max_completion_length,
            args.max_tool_calling_iterations,
            self.context_length,
            images,
        )
        trajectories.images = None if images is None else images.batch()
        if environments is not None:
            trajectories.reward_kwargs["environments"] = environments
        return prompts, prompt_ids, truncated, trajectories
