"""A user's ``rollout_func(prompts, trainer)`` (TRL's): it generates itself and returns ``prompt_ids``,
``completion_ids`` and ``logprobs`` per row, optionally ``env_mask`` (1: a token the policy sampled, 0: one the
environment wrote), and any other field, forwarded to the reward functions as a keyword argument."""

from __future__ import annotations

from ..reward_checks import ALWAYS_PASSED
from .turns import Trajectories

REQUIRED = ("prompt_ids", "completion_ids", "logprobs")
OPTIONAL = ("env_mask", "logprob_token_ids")  # logprob_token_ids: TRL's top-k ids of each logprob, not read
RESERVED = tuple(name for name in ALWAYS_PASSED if name not in REQUIRED)  # the reward functions' keywords from steadyrl


def _rows(value, key: str, rows: int) -> list:
    if not isinstance(value, (list, tuple)) or len(value) != rows:
        got = f"{len(value)} rows" if isinstance(value, (list, tuple)) else type(value).__name__
        raise ValueError(
            f"rollout_func returned {key!r} with {got} for {rows} prompts: give one entry per prompt row "
            "(the prompts it receives are each prompt repeated once per sample)."
        )
    return list(value)


def check_field_names(output: dict, func) -> None:
    """Refuse a field the reward functions would receive twice: one named like a keyword argument steadyrl passes them
    itself (``prompts``, ``completions``, ``trainer_state``, ...), which it would replace or be replaced by."""
    reserved = sorted(key for key in output if key in RESERVED)
    if reserved:
        name = getattr(func, "__qualname__", type(func).__name__)
        raise ValueError(
            f"rollout_func {name!r} returned {reserved}, which steadyrl passes to the reward functions itself "
            f"({list(RESERVED)}): its dict takes {list(REQUIRED)}, optionally {list(OPTIONAL)}, and fields of "
            "any other name, each given to the reward functions as a keyword argument of that name. Rename them."
        )


def trajectories_from(output, rows: int, func=None) -> tuple[list[list[int]], Trajectories]:
    """Check ``rollout_func``'s output (``func``'s, named in errors) for ``rows`` prompt rows and return
    ``(prompt_ids, trajectories)``."""
    if not isinstance(output, dict):
        raise TypeError(
            f"rollout_func must return a dict with keys {list(REQUIRED)}; it returned a {type(output).__name__}."
        )
    missing = [key for key in REQUIRED if key not in output]
    if missing:
        raise ValueError(
            f"rollout_func must return keys {list(REQUIRED)} in its dict; {missing} missing (it "
            f"returned {sorted(output)})."
        )
    check_field_names(output, func)
    prompt_ids = [list(map(int, ids)) for ids in _rows(output["prompt_ids"], "prompt_ids", rows)]
    completion_ids = [list(map(int, ids)) for ids in _rows(output["completion_ids"], "completion_ids", rows)]
    logprobs = output["logprobs"]
    if logprobs is not None:
        logprobs = [list(map(float, values)) for values in _rows(logprobs, "logprobs", rows)]
    env_mask = output.get("env_mask")
    if env_mask is not None:
        env_mask = [list(map(int, m)) for m in _rows(env_mask, "env_mask", rows)]
    for i, ids in enumerate(completion_ids):
        if not prompt_ids[i]:
            raise ValueError(f"rollout_func returned empty prompt_ids for row {i}: the scoring pass needs the prompt.")
        for key, values in (("logprobs", logprobs), ("env_mask", env_mask)):
            if values is not None and len(values[i]) != len(ids):
                raise ValueError(
                    f"rollout_func's {key}[{i}] has {len(values[i])} entries for {len(ids)} completion "
                    "ids: give one per completion token."
                )
        if env_mask is not None and set(env_mask[i]) - {0, 1}:
            raise ValueError(
                f"rollout_func's env_mask[{i}] holds {sorted(set(env_mask[i]) - {0, 1})}: use 1 for a "
                "token the policy sampled and 0 for one the environment wrote."
            )
    extra = {key: _rows(value, key, rows) for key, value in output.items() if key not in (*REQUIRED, *OPTIONAL)}
    return prompt_ids, Trajectories(completion_ids, logprobs, env_mask=env_mask, reward_kwargs=extra)
