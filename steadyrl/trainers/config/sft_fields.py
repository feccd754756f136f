"""The fields TRL's ``GKDConfig`` inherits from ``SFTConfig``, so that a GKD script written for TRL runs with only its
import changed. TRL's ``GKDTrainer`` skips SFT's dataset preparation and its collator and computes its own loss, so
most of them do nothing there; steadyrl accepts those (without effect, as TRL), honours ``max_length`` (prompt +
completion tokens) and refuses, unless at TRL's default, those that change the tokenizer or the training step in TRL
(``SFT_UNSUPPORTED``). SFT's ``packing`` (of the dataset) is steadyrl's own ``packing`` (of each pass, the same
numbers), declared with the other batch fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from .trl_names import Unsupported

NO_EFFECT = "Accepted without effect: TRL's GKDTrainer skips SFT's dataset preparation and collator."
ON_COMPLETIONS = f"{NO_EFFECT} The loss is on the completion tokens."
SFT_LOSS_TYPES = ("nll", "dft")


@dataclass
class TRLSFTFields:
    """TRL's ``SFTConfig`` fields on ``GKDConfig``, with TRL's defaults (see the module's docstring)."""

    settings_group: ClassVar[str] = "TRL's SFT fields (GKD)"

    max_length: int | None = field(
        default=None,
        metadata={
            "help": "TRL's name: prompt + completion tokens; sets max_prompt_length = max_length - "
            "max_completion_length (TRL's default 1024)."
        },
    )
    dataset_text_field: str = field(default="text", metadata={"help": NO_EFFECT})
    dataset_kwargs: dict | str | None = field(default=None, metadata={"help": NO_EFFECT})
    dataset_num_proc: int | None = field(default=None, metadata={"help": NO_EFFECT})
    truncation_mode: str = field(default="keep_start", metadata={"help": NO_EFFECT})
    packing_strategy: str = field(default="bfd", metadata={"help": NO_EFFECT})
    eval_packing: bool | None = field(default=None, metadata={"help": NO_EFFECT})
    completion_only_loss: bool | None = field(default=None, metadata={"help": ON_COMPLETIONS})
    assistant_only_loss: bool = field(default=False, metadata={"help": ON_COMPLETIONS})
    pad_token: str | None = field(default=None, metadata={"help": NO_EFFECT})
    loss_type: str = field(
        default="nll", metadata={"help": "SFT's 'nll' or 'dft'; accepted without effect (TRL's GKD loss is its own)."}
    )
    router_aux_loss_coef: float | None = field(
        default=None, metadata={"help": "Accepted without effect: TRL's GKD loss adds no auxiliary term."}
    )
    padding_free: bool = field(default=False, metadata={"help": "Not supported (TRL's GKDTrainer refuses it too)."})
    chat_template_path: str | None = field(default=None, metadata={"help": "Not supported: set the tokenizer's."})
    eos_token: str | None = field(default=None, metadata={"help": "Not supported: set the tokenizer's."})
    activation_offloading: bool = field(default=False, metadata={"help": "Not supported."})

    def _check_sft_fields(self) -> None:
        if self.loss_type not in SFT_LOSS_TYPES:
            raise ValueError(
                f"loss_type={self.loss_type!r} is invalid for GKD: TRL's SFT names are {', '.join(SFT_LOSS_TYPES)} "
                "(both without effect: the loss is the divergence to the teacher). Leave it 'nll'."
            )


_OWN_COLLATOR = (
    "TRL's GKDTrainer passes its own data collator, which padding-free training refuses; steadyrl's passes are "
    "packed already (packing=True)"
)
_TOKENIZER = "steadyrl reads the tokenizer as it is given"

SFT_UNSUPPORTED: dict[str, Unsupported] = {
    "padding_free": Unsupported(False, _OWN_COLLATOR, "Leave it False."),
    "chat_template_path": Unsupported(
        None, _TOKENIZER, "Set processing_class.chat_template before building the trainer and leave it unset."
    ),
    "eos_token": Unsupported(
        None, _TOKENIZER, "Set processing_class.eos_token before building the trainer and leave it unset."
    ),
    "activation_offloading": Unsupported(
        False,
        "steadyrl does not offload activations to the CPU",
        "Leave it False; gradient_checkpointing=True (the default) saves activation memory.",
    ),
}
