"""The batch hierarchy, resolved from the sizes as given by steadyrl's names or TRL's: every division exact, and
a configuration that does not divide refused with the numbers and valid alternatives.

TRL counts per device and per optimizer step; steadyrl per rollout and per step, globally. With P processes::

    micro_train_batch_size  = per_device_train_batch_size (online DPO: x 2, TRL counts prompts there)
    train_batch_size        = micro_train_batch_size x P x gradient_accumulation_steps
    completions per rollout = generation_batch_size = micro_train_batch_size x P x steps_per_generation
                            = rollout_batch_size x n_samples_per_prompt   (default: train_batch_size)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

DEFAULT_MICRO_BATCH = 8  # TrainingArguments' per_device_train_batch_size
DEFAULT_MICRO_ROLLOUT_BATCH = 8


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
        micro_train_batch_size=micro,
        gradient_accumulation_steps=accumulation,
        train_batch_size=train,
        rollout_batch_size=rollout,
        n_samples_per_prompt=n,
        micro_rollout_batch_size=_micro_rollout_batch(given.micro_rollout_batch_size, samples // world),
        world=world,
    )


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
            fix = (
                f"a steps_per_generation that is a multiple of gradient_accumulation_steps={accumulation}, e.g. "
                f"{_multiples(accumulation, given.steps_per_generation)}"
            )
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
