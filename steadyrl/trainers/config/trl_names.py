"""TRL's argument names on steadyrl's configs, so that a script written for ``trl.RLOOConfig`` or
``trl.experimental.online_dpo.OnlineDPOConfig`` runs with only its import changed.

Three kinds of TRL field:

- synonyms of steadyrl's own fields (``num_generations`` is ``n_samples_per_prompt``, ``epsilon`` is ``cliprange``,
  ...), resolved onto them and from then on views of them (one stored value); giving both names with different values
  is refused;
- the batch sizes, which TRL counts differently (per device and per optimizer step), resolved onto steadyrl's batch
  hierarchy by ``resolve_batch_hierarchy``;
- fields for what steadyrl does not do (continuous batching, structured outputs, ...), declared with TRL's default and
  refused when set to anything else (``UNSUPPORTED``), so that none is silently ignored.

``TRLNames`` declares the first and last kind; the batch sizes are declared with the batch hierarchy
(field_groups.py), and the TRL fields steadyrl supports as they are (``sync_ref_model``, the vLLM server's
``vllm_server_*``, ...) in their groups there. ``use_vllm`` and ``vllm_mode`` together say what steadyrl's
``generation_backend`` says in one field: a synonym of two fields rather than one, resolved and kept consistent with
it in vllm_fields.py. ``OnPolicyConfig.__post_init__`` applies what is declared here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

# ---- synonyms -------------------------------------------------------------------------------------------------------

RESOLVED = "_trl_synonyms_resolved"  # set in a config's __dict__ once __post_init__ has resolved TRL's names


@dataclass(frozen=True)
class Synonym:
    """TRL's name of one of steadyrl's settings, and its view on the config class (``views_of``).

    A setting is stored once, under steadyrl's name; TRL's name reads and writes that value, so the two cannot drift
    apart (``args.epsilon = 0.3`` sets ``cliprange``, which the loss reads). Only while the config is built does a
    value given under TRL's name sit apart, under that name, for ``__post_init__`` to resolve against steadyrl's
    (``take``), so that giving both names with different values can be refused.
    """

    trl_name: str
    own_name: str
    meaning: str  # what both set, as in "both set <meaning>"

    def __get__(self, config, owner=None):
        if config is None:
            return None  # the field's default: not given
        if vars(config).get(RESOLVED):
            return getattr(config, self.own_name)
        return vars(config).get(self.trl_name)

    def __set__(self, config, value) -> None:
        if vars(config).get(RESOLVED):
            setattr(config, self.own_name, value)
        else:
            vars(config)[self.trl_name] = value

    def take(self, config) -> Any:
        """The value given under TRL's name (``None``: not given), which from now on is a view of steadyrl's."""
        return vars(config).pop(self.trl_name, None)


SYNONYMS: tuple[Synonym, ...] = (
    Synonym("num_generations", "n_samples_per_prompt", "the completions per prompt"),
    Synonym("num_iterations", "num_ppo_epochs", "the passes over each rollout"),
    Synonym("epsilon", "cliprange", "the clipping range of the importance ratio"),
    Synonym("epsilon_high", "cliprange_high", "the upper clipping bound of the importance ratio"),
    Synonym("vllm_max_model_length", "vllm_max_model_len", "vLLM's context length"),
)
# online DPO only
MAX_NEW_TOKENS = Synonym("max_new_tokens", "max_completion_length", "the most tokens generated per completion")


def views_of(*synonyms: Synonym):
    """A class decorator, over ``@dataclass``: each synonym's field becomes a view of steadyrl's field. The dataclass
    keeps the field (its default, help, command-line flag); only the attribute is replaced (a descriptor given as the
    field's default would lose its help)."""

    def install(cls: type) -> type:
        for synonym in synonyms:
            setattr(cls, synonym.trl_name, synonym)
        return cls

    return install


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


def resolve_max_prompt_length(
    max_prompt_length: int | None,
    max_length: int | None,
    max_completion_length: int,
    completion_name: str,
    default: int,
) -> int:
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


# ---- the fields ------------------------------------------------------------------------------------------------------


@views_of(*SYNONYMS)
@dataclass
class TRLSynonymFields:
    """TRL's names of steadyrl's settings: each is a view (``Synonym``) of steadyrl's field, which holds the value."""

    settings_group: ClassVar[str] = "TRL's names for steadyrl's settings"

    num_generations: int | None = field(default=None, metadata={"help": "TRL's name of n_samples_per_prompt."})
    num_iterations: int | None = field(default=None, metadata={"help": "TRL's name of num_ppo_epochs."})
    epsilon: float | None = field(default=None, metadata={"help": "TRL's name of cliprange."})
    epsilon_high: float | None = field(default=None, metadata={"help": "TRL's name of cliprange_high."})
    vllm_max_model_length: int | None = field(default=None, metadata={"help": "TRL's name of vllm_max_model_len."})


@dataclass
class TRLDefaultOnlyFields:
    """TRL's fields for what steadyrl does not do: each is refused unless at TRL's default (see ``UNSUPPORTED``)."""

    settings_group: ClassVar[str] = "TRL fields accepted only at TRL's default"

    vllm_model_impl: str = field(default="vllm", metadata={"help": "Only 'vllm'."})
    use_transformers_continuous_batching: bool = field(default=False, metadata={"help": "Not supported."})
    transformers_continuous_batching_config: dict | str | None = field(
        default=None, metadata={"help": "Not supported (use_transformers_continuous_batching)."}
    )
    use_transformers_paged: bool = field(default=False, metadata={"help": "Not supported (TRL: deprecated)."})


@dataclass
class TRLHonouredFields:
    """TRL fields steadyrl honours as TRL does, declared with TRL's defaults."""

    settings_group: ClassVar[str] = "TRL's padding and completion-log fields"

    pad_to_multiple_of: int | str | None = field(
        default="auto",
        metadata={
            "help": "Pad the prompt and completion token tensors of every forward pass (the rollout, its scoring "
            "passes and each training micro-batch) to a multiple of this many columns, as TRL does; the padding is "
            "masked, so the numbers do not change. 'auto' (TRL: 128 on Neuron only) or None: to the longest "
            "sequence."
        },
    )
    log_unique_prompts: bool = field(
        default=False,
        metadata={
            "help": "With log_completions: the completion table sent to TensorBoard / wandb holds each distinct "
            "prompt's first completion only, as TRL's; completions.jsonl and the printed table keep every row."
        },
    )


@dataclass
class TRLNames(TRLDefaultOnlyFields, TRLHonouredFields, TRLSynonymFields):
    """The TRL fields of ``OnPolicyConfig`` that are not steadyrl settings of their own: synonyms, and fields refused
    unless at TRL's default. A mixin; its ``None`` defaults mean "not given" and are resolved in ``__post_init__``.
    """


# ---- fields refused unless at TRL's default -------------------------------------------------------------------------


@dataclass(frozen=True)
class Unsupported:
    default: Any
    reason: str  # why steadyrl cannot honour another value
    fix: str  # what to do instead
    also_accepted: tuple = ()


_CONTINUOUS = (
    "steadyrl generates with transformers' generate or, with use_vllm=True, with vLLM; transformers' continuous "
    "batching (generate_batch) never returned on the CPU machines steadyrl is tested on (8 prompts of the toy model, "
    "300 s), so it is not wired in untested"
)

UNSUPPORTED: dict[str, Unsupported] = {
    "vllm_model_impl": Unsupported(
        "vllm",
        "vLLM's Transformers backend fails at its first forward pass with the vLLM and transformers steadyrl is tested "
        "with (vLLM 0.32, transformers 5.19: 'Qwen2Model' object has no attribute 'do_not_compile'), so steadyrl "
        "generates with vLLM's own implementation of the architecture",
        "Use vllm_model_impl='vllm' (the default).",
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


def resolve_pad_to_multiple_of(value: Any) -> int | None:
    """``pad_to_multiple_of`` as TRL resolves it off Neuron: ``'auto'``, None, ``'none'``/``'null'`` -> None (pad to
    the longest); a positive integer (or its digits, from the command line) -> that integer."""
    if isinstance(value, str):
        if value == "auto" or value.lower() in ("none", "null"):
            return None
        value = int(value) if value.strip().isdigit() else value
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
        return value
    raise ValueError(
        f"pad_to_multiple_of={value!r} is invalid: give a positive integer N (token tensors padded to a multiple of "
        "N columns), or 'auto' / None to pad to the longest sequence."
    )


def refuse_unsupported(name: str, value: Any, rule: Unsupported | None = None) -> None:
    """Raise ``ValueError`` if ``value`` of the TRL field ``name`` asks for something steadyrl does not do."""
    rule = UNSUPPORTED[name] if rule is None else rule
    if value == rule.default or any(value == other for other in rule.also_accepted):
        return
    raise ValueError(f"{name}={value!r} is not supported: {rule.reason}. {rule.fix}")


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
