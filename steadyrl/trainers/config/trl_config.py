"""A TRL config given as a trainer's ``args`` (``trl.GRPOConfig`` to ``steadyrl.GRPOTrainer``, ...), converted field
by field into the trainer's own config, so that a TRL script runs with only its trainer import changed.

Every field steadyrl's config has is passed with the TRL config's value, TRL's defaults included: the run is the one
the TRL config describes (``num_generations=2``, TRL's default and so indistinguishable from "not set", stays 2
rather than becoming steadyrl's default). The steadyrl config checks them as it checks its own arguments, so a value
steadyrl does not support is refused with its usual message. A field steadyrl's config does not have is refused here
when set to anything but TRL's default.

Only ``init`` fields are read: what ``TrainingArguments.__post_init__`` builds from them (the accelerator state, the
DeepSpeed config) the steadyrl config builds again, once. No TRL config is constructed here.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from transformers import TrainingArguments

from .on_policy_config import OnPolicyConfig

# TRL's __post_init__ derives generation_batch_size and steps_per_generation from each other, and steadyrl refuses
# both: steps_per_generation carries the two (per device, so steadyrl resolves it for the processes it runs on).
DERIVED_FROM_OTHERS = frozenset({"generation_batch_size"})
# TRL defaults that act only with another setting on (TRL ignores them without it; steadyrl refuses them there)
DEFAULT_ONLY_WITH = {"vllm_importance_sampling_correction": "use_vllm"}


def qualified_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def trl_class_of(args: Any) -> type | None:
    """The TRL config class ``args`` is an instance of (the nearest TRL class in its MRO, so that a user's subclass of
    ``trl.GRPOConfig`` counts as one), or ``None``."""
    if not isinstance(args, TrainingArguments):
        return None
    return next((cls for cls in type(args).__mro__ if cls.__module__.split(".")[0] == "trl"), None)


def as_own_config(args: Any, config_class: type[OnPolicyConfig]) -> OnPolicyConfig:
    """``args`` if it is a ``config_class``; a TRL config of the same algorithm converted into one; else refused."""
    if isinstance(args, config_class):
        return args
    own, trl_class = qualified_name(config_class), trl_class_of(args)
    if trl_class is None:
        raise TypeError(
            f"args must be a {own} (or TRL's {config_class.__name__}, converted field by field), got "
            f"{qualified_name(type(args))}."
        )
    if trl_class.__name__ != config_class.__name__:
        raise TypeError(
            f"args is a {qualified_name(trl_class)}, a config of another algorithm: this trainer takes a {own} (or "
            f"TRL's {config_class.__name__}, converted field by field). Use the trainer of that algorithm, or build "
            f"a {own} (from steadyrl import {config_class.__name__})."
        )
    return convert(args, config_class)


def convert(args: TrainingArguments, config_class: type[OnPolicyConfig]) -> OnPolicyConfig:
    """A ``config_class`` with the values of the TRL config ``args``, field by field."""
    own_fields = {f.name for f in dataclasses.fields(config_class) if f.init}
    passed = {}
    for spec in dataclasses.fields(args):
        if not spec.init or spec.name in DERIVED_FROM_OTHERS:
            continue
        value, default = getattr(args, spec.name), field_default(spec)
        inert = spec.name in DEFAULT_ONLY_WITH and not getattr(args, DEFAULT_ONLY_WITH[spec.name])
        if inert and equal(value, default):
            continue
        if spec.name in own_fields:
            passed[spec.name] = copied(value)  # __post_init__ edits some in place (accelerator_config)
        elif not equal(value, default):
            refuse_unknown_field(spec.name, value, default, type(args), config_class)
    return config_class(**passed)


def refuse_unknown_field(name: str, value: Any, default: Any, trl_class: type, config_class: type) -> None:
    own = qualified_name(config_class)
    raise ValueError(
        f"{name}={value!r} is set on the {qualified_name(trl_class)} given as args, and {own} has no field {name}: "
        f"steadyrl does not do what it asks. Leave {name} at TRL's default ({default!r}), or pass a {own} (from "
        f"steadyrl import {config_class.__name__}) instead."
    )


def field_default(spec: dataclasses.Field) -> Any:
    if spec.default is not dataclasses.MISSING:
        return spec.default
    if spec.default_factory is not dataclasses.MISSING:
        return spec.default_factory()
    return dataclasses.MISSING


def equal(value: Any, default: Any) -> bool:
    try:
        return bool(value == default) and type(value) is type(default) or value is default
    except Exception:  # a value whose == raises or is ambiguous (a tensor): not the default
        return False


def copied(value: Any) -> Any:
    try:
        return copy.deepcopy(value)
    except Exception:  # an object that cannot be copied (a live handle): shared, as TrainingArguments holds it
        return value
