"""The dynamic-sampling fields of ``GRPOConfig`` and ``RLOOConfig`` (DAPO's dynamic sampling; verl's
``algorithm.filter_groups``, OpenRLHF's ``--dynamic_filtering``). TRL has no such setting: these are steadyrl's.
The loop's side is trainers/loop/dynamic_sampling.py; docs/grpo.md ("Dynamic sampling") maps the names."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class DynamicSamplingOptions:
    """Drop the groups whose completions all got the same reward and draw more prompts until the rollout is full.

    Example::

        GRPOConfig(output_dir="out", dynamic_sampling=True, max_num_gen_batches=10, rollout_batch_size=64)
    """

    settings_group: ClassVar[str] = "Dynamic sampling (GRPO and RLOO)"

    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO's dynamic sampling (verl: algorithm.filter_groups.enable; OpenRLHF: --dynamic_filtering): "
            "drop each group whose completions all got the same total reward (no signal for a group baseline) and "
            "draw further batches of rollout_batch_size prompts until rollout_batch_size groups with reward "
            "variance > 0 are kept; the rollout is the first of them in draw order."
        },
    )
    max_num_gen_batches: int = field(
        default=10,
        metadata={
            "help": "With dynamic_sampling: the most batches of rollout_batch_size prompts one rollout may draw "
            "(verl's name and meaning; the first batch counts). Reaching it without a full rollout stops the run "
            "with an error (as verl; raise it and resume); 0: no limit."
        },
    )

    def __post_init__(self):
        super().__post_init__()
        bound = self.max_num_gen_batches
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 0:
            raise ValueError(
                f"max_num_gen_batches={bound!r} is invalid: give the most batches of prompts one rollout may draw "
                "with dynamic_sampling, a positive integer, or 0 for no limit."
            )
