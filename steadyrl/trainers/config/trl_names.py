"""TRL's argument names on steadyrl's configs, so that a script written for ``trl.RLOOConfig`` or
``trl.experimental.online_dpo.OnlineDPOConfig`` runs with only its import changed.

Three kinds of TRL field:

- synonyms of steadyrl's own fields (``num_generations`` is ``n_samples_per_prompt``, ``epsilon`` is ``cliprange``,
  ...), resolved onto them; giving both names with different values is refused;
- the batch sizes, which TRL counts differently (per device and per optimizer step), resolved onto steadyrl's batch
  hierarchy by ``resolve_batch_hierarchy``;
- fields for what steadyrl does not do (continuous batching, structured outputs, ...), declared with TRL's default and
  refused when set to anything else (``UNSUPPORTED``), so that none is silently ignored.

``TRLNames`` declares the first and last kind, the batch names TRL shares with ``TrainingArguments`` with ``None``
defaults (to tell "given" from "default"), and TR-DPO's reference syncing (``sync_ref_model``), which steadyrl does
as TRL does. The functions here are pure; ``OnPolicyConfig.__post_init__`` applies them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TRLNames:
    """The fields TRL's RLOO and online-DPO configs declare that are synonyms of steadyrl's, that steadyrl refuses, or
    that it takes as TRL does (``sync_ref_model`` and its two settings).

    A mixin of ``OnPolicyConfig``; its ``None`` defaults mean "not given" and are resolved in ``__post_init__``.
    """

    per_device_train_batch_size: int | None = field(
        default=None,
        metadata={"help": "TRL's name: completions per device per forward/backward (= micro_train_batch_size; "
                  "online DPO: prompts, each with 2 completions). Default 8."},
    )  # fmt: skip
    gradient_accumulation_steps: int | None = field(
        default=None,
        metadata={"help": "Micro-batches per optimizer step: train_batch_size / (micro_train_batch_size x "
                  "processes). Default 1 when train_batch_size is not given."},
    )  # fmt: skip
    num_generations: int | None = field(default=None, metadata={"help": "TRL's name of n_samples_per_prompt."})
    generation_batch_size: int | None = field(
        default=None,
        metadata={"help": "TRL's name: completions per rollout (= rollout_batch_size x n_samples_per_prompt). "
                  "Excludes steps_per_generation."},
    )  # fmt: skip
    steps_per_generation: int | None = field(
        default=None,
        metadata={"help": "TRL's name: micro-batches per rollout (generation_batch_size = per_device_train_batch_size "
                  "x processes x steps_per_generation). Default gradient_accumulation_steps."},
    )  # fmt: skip
    num_iterations: int | None = field(default=None, metadata={"help": "TRL's name of num_ppo_epochs."})
    epsilon: float | None = field(default=None, metadata={"help": "TRL's name of cliprange."})
    epsilon_high: float | None = field(default=None, metadata={"help": "TRL's name of cliprange_high."})
    vllm_max_model_length: int | None = field(default=None, metadata={"help": "TRL's name of vllm_max_model_len."})

    # TR-DPO's reference syncing (TRL's SyncRefModelCallback), with TRL's defaults and help texts.
    sync_ref_model: bool = field(
        default=False,
        metadata={
            "help": "Whether to synchronize the reference model with the active model every `ref_model_sync_steps` "
            "steps, using the `ref_model_mixup_alpha` parameter."
        },
    )
    ref_model_mixup_alpha: float = field(
        default=0.6,
        metadata={
            "help": "α parameter from the TR-DPO paper, which controls the mix between the current policy and the "
            "previous reference policy during updates. The reference policy is updated according to the equation: "
            "`π_ref = α * π_θ + (1 - α) * π_ref_prev`. To use this parameter, you must set `sync_ref_model=True`."
        },
    )
    ref_model_sync_steps: int = field(
        default=512,
        metadata={
            "help": "τ parameter from the TR-DPO paper, which determines how frequently the current policy is "
            "synchronized with the reference policy. To use this parameter, you must set `sync_ref_model=True`."
        },
    )

    # Accepted only at TRL's default (see UNSUPPORTED).
    vllm_mode: str = field(
        default="colocate",
        metadata={"help": "With use_vllm=True: 'colocate' (vLLM runs in each training process) or 'server' "
                  "(generation requests go to a running `vllm serve`; see vllm_server_*)."},
    )  # fmt: skip
    vllm_model_impl: str = field(default="vllm", metadata={"help": "Only 'vllm'."})
    vllm_structured_outputs_regex: str | None = field(default=None, metadata={"help": "Not supported: leave unset."})
    vllm_server_base_url: str | None = field(
        default=None,
        metadata={"help": "vllm_mode='server': the server's URL, e.g. 'http://10.0.0.5:8000'; replaces "
                  "vllm_server_host and vllm_server_port."},
    )  # fmt: skip
    vllm_server_host: str = field(default="0.0.0.0", metadata={"help": "vllm_mode='server': the server's host."})
    vllm_server_port: int = field(default=8000, metadata={"help": "vllm_mode='server': the server's port."})
    vllm_server_timeout: float = field(
        default=240.0, metadata={"help": "vllm_mode='server': seconds to wait for any one answer of the server."}
    )
    vllm_group_port: int = field(
        default=51216,
        metadata={"help": "vllm_mode='server' with vllm_server_weight_transfer='nccl': the port of the NCCL "
                  "rendezvous between the trainer and the server's workers."},
    )  # fmt: skip
    ds3_gather_for_generation: bool = field(
        default=True, metadata={"help": "Only True: under ZeRO-3 the actor is gathered to generate."}
    )
    router_aux_loss_coef: float | None = field(default=None, metadata={"help": "Not supported: leave unset."})
    pad_to_multiple_of: int | str | None = field(
        default="auto", metadata={"help": "Only 'auto' or None: no padding beyond the longest sequence."}
    )
    log_unique_prompts: bool = field(default=False, metadata={"help": "Not supported: leave False."})
    use_transformers_continuous_batching: bool = field(default=False, metadata={"help": "Not supported."})
    transformers_continuous_batching_config: dict | str | None = field(
        default=None, metadata={"help": "Not supported (use_transformers_continuous_batching)."}
    )
    use_transformers_paged: bool = field(default=False, metadata={"help": "Not supported (TRL: deprecated)."})


# ---- fields refused unless at TRL's default -------------------------------------------------------------------------


@dataclass(frozen=True)
class Unsupported:
    default: Any
    reason: str  # why steadyrl cannot honour another value
    fix: str  # what to do instead
    also_accepted: tuple = ()


_CONTINUOUS = "steadyrl generates with transformers' generate or, with use_vllm=True, with vLLM"

UNSUPPORTED: dict[str, Unsupported] = {
    "vllm_model_impl": Unsupported(
        "vllm",
        "steadyrl pushes the actor's weights into vLLM's own model implementation",
        "Use vllm_model_impl='vllm' (the default).",
    ),
    "vllm_structured_outputs_regex": Unsupported(
        None, "steadyrl's generation has no structured (regex-constrained) outputs", "Leave it unset."
    ),
    "ds3_gather_for_generation": Unsupported(
        True,
        "under DeepSpeed ZeRO-3 steadyrl always gathers the actor's parameters to generate",
        "Use ds3_gather_for_generation=True (the default).",
    ),
    "router_aux_loss_coef": Unsupported(
        None, "steadyrl's losses have no Mixture-of-Experts load-balancing term", "Leave it unset."
    ),
    "pad_to_multiple_of": Unsupported(
        "auto",
        "steadyrl pads prompts and completions to the longest in their batch",
        "Use 'auto' (the default) or None.",
        also_accepted=(None,),
    ),
    "log_unique_prompts": Unsupported(
        False, "steadyrl's completion log (log_completions) lists every prompt", "Leave it False."
    ),
    "use_transformers_continuous_batching": Unsupported(False, _CONTINUOUS, "Leave it False."),
    "transformers_continuous_batching_config": Unsupported(
        None, "it configures use_transformers_continuous_batching, which steadyrl does not support", "Leave it unset."
    ),
    "use_transformers_paged": Unsupported(
        False,
        f"it is TRL's deprecated name of use_transformers_continuous_batching, and {_CONTINUOUS}",
        "Leave it False.",
    ),
}


def command_line_value(name: str, value: Any) -> Any:
    """``pad_to_multiple_of`` arrives from the command line as a string: ``'none'``/``'null'`` or a number."""
    if name == "pad_to_multiple_of" and isinstance(value, str) and value != "auto":
        if value.lower() in ("none", "null"):
            return None
        return int(value) if value.strip().lstrip("-").isdigit() else value
    return value


def refuse_unsupported(name: str, value: Any, rule: Unsupported | None = None) -> None:
    """Raise ``ValueError`` if ``value`` of the TRL field ``name`` asks for something steadyrl does not do."""
    rule = UNSUPPORTED[name] if rule is None else rule
    if value == rule.default or any(value == other for other in rule.also_accepted):
        return
    raise ValueError(f"{name}={value!r} is not supported: {rule.reason}. {rule.fix}")


# ---- synonyms -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Synonym:
    trl_name: str
    own_name: str
    meaning: str  # what both set, as in "both set <meaning>"


SYNONYMS: tuple[Synonym, ...] = (
    Synonym("num_generations", "n_samples_per_prompt", "the completions per prompt"),
    Synonym("num_iterations", "num_ppo_epochs", "the passes over each rollout"),
    Synonym("epsilon", "cliprange", "the clipping range of the importance ratio"),
    Synonym("epsilon_high", "cliprange_high", "the upper clipping bound of the importance ratio"),
    Synonym("vllm_max_model_length", "vllm_max_model_len", "vLLM's context length"),
)
# online DPO only
MAX_NEW_TOKENS = Synonym("max_new_tokens", "max_completion_length", "the most tokens generated per completion")


def resolve_synonym(synonym: Synonym, trl_value: Any, own_value: Any) -> Any:
    """The value both names resolve to (``None``: neither was given); different values are refused."""
    if trl_value is not None and own_value is not None and trl_value != own_value:
        raise ValueError(
            f"{synonym.trl_name}={trl_value!r} contradicts {synonym.own_name}={own_value!r}: both set "
            f"{synonym.meaning}; give one of them."
        )
    return own_value if own_value is not None else trl_value


def given_name(synonym: Synonym, trl_value: Any, own_value: Any) -> str:
    """The name the user gave (steadyrl's when neither was given), for messages."""
    return synonym.trl_name if own_value is None and trl_value is not None else synonym.own_name


def resolve_max_prompt_length(max_prompt_length: int | None, max_length: int | None, max_completion_length: int,
                              completion_name: str, default: int) -> int:  # fmt: skip
    """``max_prompt_length``, or TRL online DPO's ``max_length`` (prompt + completion) less the completion."""
    if max_length is None:
        return default if max_prompt_length is None else max_prompt_length
    if max_length <= max_completion_length:
        raise ValueError(
            f"max_length={max_length} leaves no room for the prompt: it counts prompt + completion tokens, and "
            f"{completion_name}={max_completion_length}. Use max_length > {max_completion_length} (e.g. "
            f"{max_completion_length + default} for prompts of up to {default} tokens), or max_prompt_length."
        )
    from_max_length = max_length - max_completion_length
    if max_prompt_length is not None and max_prompt_length != from_max_length:
        raise ValueError(
            f"max_length={max_length} contradicts max_prompt_length={max_prompt_length}: max_length counts prompt + "
            f"completion tokens, so with {completion_name}={max_completion_length} it sets max_prompt_length="
            f"{from_max_length}; give one of them."
        )
    return from_max_length


# ---- dict fields ----------------------------------------------------------------------------------------------------


def parse_dict_field(name: str, value: Any, example: str) -> dict | None:
    """A dict or ``None``; a JSON object given as a string (the command line) is parsed."""
    parsed = value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            pass  # not JSON: refused below
    if parsed is None or isinstance(parsed, dict):
        return parsed
    raise ValueError(
        f"{name}={value!r} is invalid: give a dict, or on the command line a JSON object such as '{example}'."
    )
