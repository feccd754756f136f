"""TRL's argument names on steadyrl's configs, so that a script written for ``trl.RLOOConfig`` or
``trl.experimental.online_dpo.OnlineDPOConfig`` runs with only its import changed.

Three kinds of TRL field:

- synonyms of steadyrl's own fields (``num_generations`` is ``n_samples_per_prompt``, ``epsilon`` is ``cliprange``,
  ...), resolved onto them; giving both names with different values is refused;
- the batch sizes, which TRL counts differently (per device and per optimizer step), resolved onto steadyrl's batch
  hierarchy by ``resolve_batch_hierarchy``;
- fields for what steadyrl does not do (a vLLM server, TR-DPO reference syncing, ...), declared with TRL's default and
  refused when set to anything else (``UNSUPPORTED``), so that none is silently ignored.

``TRLNames`` declares the first and last kind, and the batch names TRL shares with ``TrainingArguments`` with ``None``
defaults, to tell "given" from "default". The functions here are pure; ``OnPolicyConfig.__post_init__`` applies them.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

DEFAULT_MICRO_BATCH = 8  # TrainingArguments' per_device_train_batch_size
DEFAULT_MICRO_ROLLOUT_BATCH = 8


@dataclass
class TRLNames:
    """The fields TRL's RLOO and online-DPO configs declare that are synonyms of steadyrl's or that steadyrl refuses.

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

    # Accepted only at TRL's default (see UNSUPPORTED).
    vllm_mode: str = field(default="colocate", metadata={"help": "Only 'colocate': vLLM runs in the training process."})
    vllm_model_impl: str = field(default="vllm", metadata={"help": "Only 'vllm'."})
    vllm_structured_outputs_regex: str | None = field(default=None, metadata={"help": "Not supported: leave unset."})
    vllm_server_base_url: str | None = field(default=None, metadata={"help": "Not supported (vLLM server mode)."})
    vllm_server_host: str = field(default="0.0.0.0", metadata={"help": "Not supported (vLLM server mode)."})
    vllm_server_port: int = field(default=8000, metadata={"help": "Not supported (vLLM server mode)."})
    vllm_server_timeout: float = field(default=240.0, metadata={"help": "Not supported (vLLM server mode)."})
    vllm_group_port: int = field(default=51216, metadata={"help": "Not supported (vLLM server mode)."})
    ds3_gather_for_generation: bool = field(
        default=True, metadata={"help": "Only True: under ZeRO-3 the actor is gathered to generate."}
    )
    router_aux_loss_coef: float | None = field(default=None, metadata={"help": "Not supported: leave unset."})
    pad_to_multiple_of: int | str | None = field(
        default="auto", metadata={"help": "Only 'auto' or None: no padding beyond the longest sequence."}
    )
    sync_ref_model: bool = field(default=False, metadata={"help": "Not supported: the reference model is fixed."})
    ref_model_mixup_alpha: float = field(default=0.6, metadata={"help": "Not supported (sync_ref_model)."})
    ref_model_sync_steps: int = field(default=512, metadata={"help": "Not supported (sync_ref_model)."})
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


_SERVER = "it configures vllm_mode='server', and steadyrl runs vLLM in the training process (colocate)"
_CONTINUOUS = "steadyrl generates with transformers' generate or, with use_vllm=True, with vLLM"
_SYNC = "it configures sync_ref_model, which steadyrl does not support"

UNSUPPORTED: dict[str, Unsupported] = {
    "vllm_mode": Unsupported(
        "colocate", "steadyrl runs vLLM in the training process (colocate)", "Use vllm_mode='colocate' (the default)."
    ),
    "vllm_server_base_url": Unsupported(None, _SERVER, "Leave it unset."),
    "vllm_server_host": Unsupported("0.0.0.0", _SERVER, "Leave it unset."),
    "vllm_server_port": Unsupported(8000, _SERVER, "Leave it unset."),
    "vllm_server_timeout": Unsupported(240.0, _SERVER, "Leave it unset."),
    "vllm_group_port": Unsupported(51216, _SERVER, "Leave it unset."),
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
    "sync_ref_model": Unsupported(
        False, "steadyrl's reference model stays fixed for the whole run (no TR-DPO syncing)", "Leave it False."
    ),
    "ref_model_mixup_alpha": Unsupported(0.6, _SYNC, "Leave it unset."),
    "ref_model_sync_steps": Unsupported(512, _SYNC, "Leave it unset."),
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


def refuse_unsupported(name: str, value: Any) -> None:
    """Raise ``ValueError`` if ``value`` of the TRL field ``name`` asks for something steadyrl does not do."""
    rule = UNSUPPORTED[name]
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


# ---- the batch hierarchy --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BatchSettings:
    """The batch sizes as given, by steadyrl's names or TRL's (``None``: not given). Counts are completions, except
    ``rollout_batch_size`` (prompts) and, in online DPO, ``per_device_train_batch_size`` (prompts, TRL's meaning)."""

    micro_train_batch_size: int | None = None
    per_device_train_batch_size: int | None = None
    gradient_accumulation_steps: int | None = None
    train_batch_size: int | None = None
    rollout_batch_size: int | None = None
    generation_batch_size: int | None = None
    steps_per_generation: int | None = None
    micro_rollout_batch_size: int | None = None


@dataclass(frozen=True)
class BatchHierarchy:
    """steadyrl's batch hierarchy, resolved: every division exact."""

    micro_train_batch_size: int
    gradient_accumulation_steps: int
    train_batch_size: int
    rollout_batch_size: int
    n_samples_per_prompt: int
    micro_rollout_batch_size: int
    world: int

    @property
    def samples_per_rollout(self) -> int:
        return self.rollout_batch_size * self.n_samples_per_prompt

    @property
    def steps_per_generation(self) -> int:
        """TRL's name: micro-batches (of ``micro_train_batch_size`` per device) per rollout."""
        return self.samples_per_rollout // (self.micro_train_batch_size * self.world)


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def closest(values: list[int], target: int, k: int = 3) -> str:
    picked = sorted(sorted(values, key=lambda v: (abs(v - target), v))[:k])
    return ", ".join(str(v) for v in picked)


def _multiples(step: int, target: int, k: int = 3) -> str:
    """The ``k`` multiples of ``step`` closest to ``target``."""
    return closest([step * i for i in range(1, max(k, target // step + k) + 1)], target, k)


def check_positive_int(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name}={value!r} is invalid: it must be a positive integer.")


def resolve_batch_hierarchy(
    given: BatchSettings, n: int, world: int, completions_per_item: int = 1, n_name: str = "n_samples_per_prompt"
) -> BatchHierarchy:
    """steadyrl's batch hierarchy from the batch sizes given by either name, for ``n`` completions per prompt
    (given as ``n_name``) and ``world`` processes; ``completions_per_item`` is 2 where ``per_device_train_batch_size``
    counts prompts of a pair (online DPO). Unset sizes follow TRL: micro-batch 8, gradient accumulation 1, one
    rollout per optimizer step. Contradictions and inexact divisions raise ``ValueError`` naming the numbers and
    valid alternatives."""
    for name, value in vars(given).items():
        check_positive_int(name, value)
    check_positive_int(n_name, n)

    micro = _micro_batch(given, completions_per_item, world)
    per_step = micro * world
    accumulation_given = given.gradient_accumulation_steps
    train = given.train_batch_size or per_step * (accumulation_given or 1)
    samples, origin = _samples_per_rollout(given, n, n_name, micro, world, train)
    micro_given = given.micro_train_batch_size is not None or given.per_device_train_batch_size is not None
    train_step = (
        per_step if micro_given else world * completions_per_item
    )  # what train_batch_size must be a multiple of
    _check_whole_groups(given, samples, origin, n, n_name, train, per_step, train_step)
    _check_whole_steps(given, samples, origin, n, train, micro, world)
    accumulation = train // per_step
    if accumulation_given is not None and accumulation_given != accumulation:
        raise ValueError(
            f"gradient_accumulation_steps={accumulation_given} contradicts the batch hierarchy, which derives "
            f"{accumulation} (train_batch_size={train} / (micro_train_batch_size={micro} x {world} processes)). "
            "Leave it unset."
        )
    rollout = samples // n
    if rollout % world:
        derived = "" if given.rollout_batch_size else f" ({origin} / {n_name}={n})"
        raise ValueError(
            f"rollout_batch_size={rollout}{derived} cannot be split over {world} processes. "
            f"Use a multiple of {world}, e.g. {world * max(1, rollout // world)}."
        )
    return BatchHierarchy(
        micro_train_batch_size=micro, gradient_accumulation_steps=accumulation, train_batch_size=train,
        rollout_batch_size=rollout, n_samples_per_prompt=n,
        micro_rollout_batch_size=_micro_rollout_batch(given.micro_rollout_batch_size, samples // world), world=world,
    )  # fmt: skip


def _micro_batch(given: BatchSettings, completions_per_item: int, world: int) -> int:
    """Given by either name; else derived from ``train_batch_size`` if given (the largest micro-batch up to the
    default that divides it, or exactly its share with ``gradient_accumulation_steps``); else the default, 8
    completions (online DPO: 8 prompts)."""
    own, trl = given.micro_train_batch_size, given.per_device_train_batch_size
    from_trl = None if trl is None else trl * completions_per_item
    if own is not None and from_trl is not None and own != from_trl:
        if completions_per_item == 1:
            raise ValueError(
                f"per_device_train_batch_size={trl} contradicts micro_train_batch_size={own}: both set the "
                "completions per device per forward/backward; give one of them."
            )
        raise ValueError(
            f"per_device_train_batch_size={trl} contradicts micro_train_batch_size={own}: online DPO's "
            f"per_device_train_batch_size counts prompts ({completions_per_item} completions each), so it sets "
            f"micro_train_batch_size={from_trl}; give one of them."
        )
    default = DEFAULT_MICRO_BATCH * completions_per_item
    train, accumulation = given.train_batch_size, given.gradient_accumulation_steps
    if own is not None or from_trl is not None or train is None or train % world:
        return own or from_trl or default
    share = train // world
    if accumulation is not None:
        exact = share % accumulation == 0 and (share // accumulation) % completions_per_item == 0
        return share // accumulation if exact else default
    fitting = [d for d in divisors(share) if d <= default and d % completions_per_item == 0]
    return max(fitting) if fitting else default


def _samples_per_rollout(given: BatchSettings, n: int, n_name: str, micro: int, world: int, train: int):
    """Completions per rollout, and how they were given (for messages). The three ways of giving them must agree."""
    rollout, generation, spg = given.rollout_batch_size, given.generation_batch_size, given.steps_per_generation
    terms = {}  # name -> (completions, how they were given)
    if rollout is not None:
        terms["rollout_batch_size"] = (rollout * n, f"rollout_batch_size={rollout} x {n_name}={n}")
    if generation is not None:
        terms["generation_batch_size"] = (generation, f"generation_batch_size={generation}")
    if spg is not None:
        how = f"steps_per_generation={spg} x {micro} completions per device x {world} process(es)"
        terms["steps_per_generation"] = (spg * micro * world, how)

    def term(name: str) -> str:
        samples, how = terms[name]
        return how if name == "generation_batch_size" else f"{how} = {samples}"

    names = list(terms)
    for i, first in enumerate(names):
        for second in names[i + 1 :]:
            if terms[first][0] != terms[second][0]:
                raise ValueError(
                    f"{term(second)} contradicts {term(first)}: both set the completions per rollout; give one of them."
                )
    if names:
        return terms[names[0]]
    unset = "since rollout_batch_size, generation_batch_size and steps_per_generation were not given"
    return train, f"{_train_term(given, micro, world, train)}: one rollout per optimizer step, {unset}"


def _train_term(given: BatchSettings, micro: int, world: int, train: int) -> str:
    if given.train_batch_size is not None:
        return f"train_batch_size={train}"
    accumulation = given.gradient_accumulation_steps or 1
    return f"micro_train_batch_size={micro} x {world} process(es) x gradient_accumulation_steps={accumulation}"


def _check_whole_groups(
    given, samples: int, origin: str, n: int, n_name: str, train: int, per_step: int, train_step: int
) -> None:
    """A rollout holds whole groups of ``n`` completions per prompt."""
    if samples % n == 0:
        return
    if given.generation_batch_size is not None:
        fix = f"a generation_batch_size in {_multiples(math.lcm(n, train), samples)}"
    elif given.steps_per_generation is not None:
        step = math.lcm(n, train, per_step) // per_step
        fix = f"a steps_per_generation in {_multiples(step, given.steps_per_generation)}"
    elif given.train_batch_size is not None:
        fix = f"a train_batch_size in {_multiples(math.lcm(n, train_step), train)}, or set rollout_batch_size"
    else:
        accumulation = math.lcm(n, per_step) // per_step
        fix = f"gradient_accumulation_steps={accumulation}, or set rollout_batch_size or generation_batch_size"
    raise ValueError(
        f"The {samples} completions of a rollout ({origin}) are not a multiple of {n_name}={n}: a rollout holds whole "
        f"groups of {n} completions per prompt. Use {fix}."
    )


def _check_whole_steps(given, samples: int, origin: str, n: int, train: int, micro: int, world: int) -> None:
    """A rollout holds whole optimizer steps, each of whole micro-batches on every process."""
    per_step = micro * world
    if samples % train and (given.train_batch_size is not None or given.rollout_batch_size is not None):
        valid = [d for d in divisors(samples) if d % per_step == 0] or divisors(samples)
        derived = "" if given.train_batch_size is not None else f" ({_train_term(given, micro, world, train)})"
        raise ValueError(
            f"train_batch_size={train}{derived} does not divide the {samples} samples of a rollout ({origin}). "
            f"Use a train_batch_size that divides {samples}, e.g. {closest(valid, train)}."
        )
    if samples % train:  # TRL's names throughout: say it in them
        accumulation = given.gradient_accumulation_steps or 1
        if given.steps_per_generation is not None:
            fix = f"a steps_per_generation that is a multiple of gradient_accumulation_steps={accumulation}, e.g. " \
                  f"{_multiples(accumulation, given.steps_per_generation)}"  # fmt: skip
        else:
            fix = f"a generation_batch_size in {_multiples(math.lcm(n, train), samples)}"
        raise ValueError(
            f"The {samples} completions of a rollout ({origin}) are not whole optimizer steps of {train} "
            f"({_train_term(given, micro, world, train)}): steadyrl trains on whole optimizer steps from each rollout. "
            f"Use {fix}."
        )
    if train % per_step:
        valid = [m for m in range(per_step, samples + 1, per_step) if samples % m == 0]
        batch_hint = f"a train_batch_size in {closest(valid, train)}, or " if valid else ""
        micro_hint = closest(divisors(max(1, train // world)), micro)
        raise ValueError(
            f"train_batch_size={train} is not a multiple of micro_train_batch_size={micro} x {world} process(es) = "
            f"{per_step}, so gradient accumulation would not be whole. Use {batch_hint}a micro_train_batch_size in "
            f"{micro_hint}."
        )


def _micro_rollout_batch(given: int | None, per_device: int) -> int:
    """Given: it must divide each process's share of a rollout. Default: the largest divisor of that share up to 8."""
    if given is None:
        return max(d for d in divisors(per_device) if d <= DEFAULT_MICRO_ROLLOUT_BATCH)
    if per_device % given:
        raise ValueError(
            f"micro_rollout_batch_size={given} does not divide the {per_device} samples each process generates per "
            f"rollout. Use one of {closest(divisors(per_device), given)}."
        )
    return given
