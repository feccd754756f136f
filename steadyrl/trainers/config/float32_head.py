"""GRPO's (TRL's) ``cast_lm_head_to_fp32``, an option group: the trainer casts the policy's and the reference's LM
head where the config has it (models/float32_head.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar


@dataclass
class Float32HeadOptions:
    """The float32 LM head option (TRL 1.16's name and default).

    Example::

        GRPOConfig(output_dir="out", bf16=True, cast_lm_head_to_fp32=True)
    """

    settings_group: ClassVar[str] = "Float32 LM head (GRPO)"

    cast_lm_head_to_fp32: bool = field(
        default=False,
        metadata={
            "help": "Store the policy's and the reference's LM head in float32 and compute their logits in float32 "
            "(ScaleRL), for bf16/fp16 training; its gradient is float32 too. A LoRA adapter on lm_head is refused."
        },
    )
