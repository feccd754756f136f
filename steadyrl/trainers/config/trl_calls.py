"""TRL's call conventions on steadyrl's trainers: the positional order, reward models inside ``reward_funcs``,
``reward_processing_classes``, a given ``ref_model``, and the TRL parameters steadyrl has no use for."""

from __future__ import annotations

import contextlib

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel, TrainingArguments

from ...distributed.sharded_loading import load_split
from ...distributed.zero import check_whole
from ...models.scalar_head import check_same_vocabulary
from ...rewards import as_list
from .input_checks import check_model_path


def check_call_order(trainer: str, reward_funcs, args, train_dataset) -> None:
    """Catch arguments given in the order of steadyrl's earlier releases, ``(model, args, train_dataset, ...)``,
    which TRL's order ``(model, reward_funcs, args, train_dataset, ...)`` would silently misread."""
    if isinstance(reward_funcs, TrainingArguments) or (args is not None and not isinstance(args, TrainingArguments)):
        got = type(reward_funcs if isinstance(reward_funcs, TrainingArguments) else args).__name__
        raise TypeError(
            f"{trainer} takes TRL's order (model, reward_funcs, args, train_dataset, eval_dataset, processing_class, "
            f"...), and a {got} came where {'reward_funcs' if isinstance(reward_funcs, TrainingArguments) else 'args'}"
            " belongs: pass the arguments after model by keyword (args=..., train_dataset=...)."
        )


def refuse_unused(trainer: str, **given) -> None:
    """TRL parameters steadyrl does not take: refused when given, not ignored."""
    reasons = {
        "quantization_config": "steadyrl trains the model as loaded; quantize it yourself and train adapters "
        "(peft_config) on it",
        "data_collator": "steadyrl pads prompts and completions itself",
        "compute_metrics": "steadyrl's evaluate() reports the reward functions' scores (eval_reward, ...)",
        "preprocess_logits_for_metrics": "steadyrl's evaluate() computes no logits metrics",
    }
    for name, value in given.items():
        if value is not None:
            raise ValueError(f"{trainer}({name}=...) is not supported: {reasons[name]}. Leave it unset.")


def is_reward_model(func) -> bool:
    """A ``reward_funcs`` entry that TRL reads as a reward model: a path or Hub id, or a loaded model."""
    return isinstance(func, (str, PreTrainedModel))


def reward_model_entries(reward_funcs, reward_processing_classes) -> list[tuple[int, object, object]]:
    """``(index, model, tokenizer or None)`` for each reward model among ``reward_funcs``, its tokenizer from
    ``reward_processing_classes`` (a list aligned with ``reward_funcs``, None for functions; a single tokenizer
    only beside a single reward function, as in TRL)."""
    funcs = as_list(reward_funcs)
    classes = reward_processing_classes
    if classes is not None and not isinstance(classes, (list, tuple)) and len(funcs) > 1:
        raise ValueError(
            f"reward_processing_classes is one tokenizer but reward_funcs has {len(funcs)} entries: the number of "
            "reward_processing_classes must match the number of reward_funcs (as in TRL), so that no reward model "
            "reads another's tokens. Give a list with one entry per reward function (None for a function, or for a "
            "reward model to use its own tokenizer)."
        )
    if isinstance(classes, (list, tuple)) and len(classes) != len(funcs):
        raise ValueError(
            f"reward_processing_classes has {len(classes)} entries but reward_funcs has {len(funcs)}: the numbers must "
            "match; give one per reward function (None for a function that is not a reward model)."
        )
    entries = []
    for i, func in enumerate(funcs):
        if is_reward_model(func):
            check_model_path(func, f"reward_funcs[{i}]")
            tokenizer = classes[i] if isinstance(classes, (list, tuple)) else classes
            entries.append((i, func, tokenizer))
    return entries


@contextlib.contextmanager
def named_load_failure(argument: str, value):
    """A reward model given as a string that transformers cannot load (no such directory, not on the Hub, the Hub
    unreachable): name the argument, since a user may have meant a function's name."""
    try:
        yield
    except OSError as error:
        if not isinstance(value, str):
            raise
        cause = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TypeError(
            f"{argument}={value!r} is not callable, and loading it as a reward model failed ({type(error).__name__}: "
            f"{cause}). A string in reward_funcs is a reward model's directory or Hub id, as in TRL; reward functions "
            "are passed as callables, called as func(prompts=..., completions=..., completion_ids=..., "
            "**dataset_columns)."
        ) from error


def load_reference(ref_model, policy: PreTrainedModel, init_kwargs: dict, args=None) -> torch.nn.Module:
    """The given reference model (a path, Hub id or model), frozen; it must read the policy's token ids. From a path
    it is split over the processes where the run splits its models (``load_split``)."""
    check_model_path(ref_model, "ref_model")
    if isinstance(ref_model, str):
        ref_model = load_split(AutoModelForCausalLM, ref_model, init_kwargs, args, frozen=True)
    else:
        check_whole(ref_model, "ref_model")
        check_not_the_policy(ref_model, policy)
    check_same_vocabulary(ref_model, "ref_model", policy, None)
    return ref_model.eval().requires_grad_(False)


def check_not_the_policy(ref_model: torch.nn.Module, policy: torch.nn.Module) -> None:
    """Refuse a reference that is the policy itself (or shares its parameters): freezing it as the reference would
    freeze the policy, and ``train()`` would run to the end updating nothing."""
    policy_parameters = {id(p) for p in policy.parameters()}
    if any(id(p) in policy_parameters for p in ref_model.parameters()):
        raise ValueError(
            "ref_model is the policy itself (it shares model's parameters): as the frozen reference it would freeze "
            "the policy, and training would update nothing. Leave ref_model unset (the reference is then a frozen "
            "copy of model, or under peft_config the base model with its adapters disabled), or pass a copy "
            "(copy.deepcopy(model))."
        )
