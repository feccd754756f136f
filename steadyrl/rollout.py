"""The Rollout: the one object that travels from generation to the loss, every field with its shape.

Shapes: N samples (this process's share of a rollout: prompts x ``n_samples_per_prompt``, the samples of one
prompt consecutive), P prompt tokens, C completion tokens. Who fills what::

    generation          prompt_ids, prompt_mask, completion_ids, completion_mask
    reward functions    scores, reward_scores
    scoring passes      ref_logprobs (with a KL term), old_logprobs (where the loss or the vLLM check reads them),
                        engine_weights (vLLM importance-sampling correction)
    vLLM                engine_logprobs, where no scoring pass ran: the loss checks and corrects with its own pass
    the algorithm       an ``Advantages``: advantages; values and returns (PPO); pair_weight and a row order
                        (online DPO); tokens_per_micro_batch (the ``dapo`` loss)
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import torch

from .ops import fit_columns, sequence_kl, trim_padding
from .vision import ImageBatch

IMAGES = "images."  # the prefix of the image inputs' names among a rollout's tensors (a checkpoint's)

PER_TOKEN_FIELDS = (
    "completion_ids",
    "completion_mask",
    "ref_logprobs",
    "old_logprobs",
    "advantages",
    "values",
    "returns",
    "engine_weights",
    "engine_logprobs",
    "env_mask",
)


@dataclass
class TokenBatch:
    """Prompts and completions as padded token ids: what a scoring forward pass reads."""

    prompt_ids: torch.Tensor  # [N, P] long, left-padded with the pad token
    prompt_mask: torch.Tensor  # [N, P] long, 1 on prompt tokens
    completion_ids: torch.Tensor  # [N, C] long, right-padded; ends with EOS where one was sampled
    completion_mask: torch.Tensor  # [N, C] long, 1 on completion tokens

    @property
    def token_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(prompt_ids, prompt_mask, completion_ids, completion_mask)``, the arguments of a scoring forward."""
        return self.prompt_ids, self.prompt_mask, self.completion_ids, self.completion_mask

    def __len__(self) -> int:
        return self.prompt_ids.shape[0]


@dataclass
class Rollout(TokenBatch):
    """One rollout's samples, scored, with what the algorithm's loss needs."""

    scores: torch.Tensor  # [N] float32: weighted sum of the rewards, minus missing_eos_penalty where no EOS
    ref_logprobs: torch.Tensor | None = None  # [N, C] float32: under the reference; None without a KL term
    reward_scores: torch.Tensor | None = None  # [N, R] float32: each reward function's (or the judge's) score
    old_logprobs: torch.Tensor | None = None  # [N, C] float32: under the sampling policy (ratio-based losses)
    advantages: torch.Tensor | None = None  # RLOO [N], PPO [N, C] (whitened)
    values: torch.Tensor | None = None  # [N, C] PPO: the critic's values when the rollout was made
    returns: torch.Tensor | None = None  # [N, C] PPO: GAE targets of the critic
    pair_weight: torch.Tensor | None = None  # [N] online DPO: weight of the row's pair in the loss (0: a tie)
    engine_weights: torch.Tensor | None = None  # [N, C] or [N, 1]: pi_trainer / pi_vLLM, truncated or masked
    engine_logprobs: torch.Tensor | None = None  # [N, C] float32: vLLM's log-probs of the sampled tokens, kept when
    #                                              old_logprobs is None (a rollout trained once: the training pass's
    #                                              own log-probs are the trainer's side of the check and correction)
    #                                              or the loss reads them (off-policy masking)
    tokens_per_micro_batch: torch.Tensor | None = None  # [N] the dapo loss's normaliser, the same in every row
    env_mask: torch.Tensor | None = None  # [N, C] long: 1 where the policy sampled the token, 0 where a tool or the
    #                                       environment wrote it (multi-turn); None: the policy sampled every token
    prompt_index: torch.Tensor | None = None  # [N] long: the row of each sample's prompt in the dataset (a stream's:
    #                                           its row in the epoch), to name the prompts of a step that failed
    images: ImageBatch | None = None  # [N] samples' image inputs (a vision-language model's; vision.py)

    @property
    def policy_mask(self) -> torch.Tensor:
        """[N, C] the completion tokens the policy sampled: what the loss, the KL and the entropy average over."""
        return self.completion_mask if self.env_mask is None else self.completion_mask * self.env_mask

    def tensors(self) -> dict[str, torch.Tensor]:
        """The fields that are set, by name, the image inputs as named tensors (what a checkpoint stores; read back
        by ``from_tensors``)."""
        named = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "images"}
        named = {name: value for name, value in named.items() if value is not None}
        if self.images is not None:
            named.update({IMAGES + name: value for name, value in self.images.flat().items()})
        return named

    @classmethod
    def from_tensors(cls, named: dict[str, torch.Tensor]) -> Rollout:
        images = {name[len(IMAGES) :]: value for name, value in named.items() if name.startswith(IMAGES)}
        fields = {name: value for name, value in named.items() if not name.startswith(IMAGES)}
        return cls(**fields, images=ImageBatch.from_flat(images) if images else None)

    def fields_by_row(self) -> dict[str, torch.Tensor]:
        """The [N, ...] tensor fields that are set, by name (the image inputs aside)."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "images" and getattr(self, f.name) is not None
        }

    def select(self, rows: torch.Tensor | slice) -> Rollout:
        """The rollout of the given rows (an index tensor or a slice), every field alike."""
        images = None if self.images is None else self.images.select(rows)
        selected = {name: value[rows] for name, value in self.fields_by_row().items()}
        return dataclasses.replace(self, **selected, images=images)

    def trimmed(self, multiple_of: int | None = None, pad_token_id: int = 0) -> Rollout:
        """This rollout without the columns that are padding in every row: prompt columns on the left, completion
        columns (of every per-token field) on the right. A micro-batch then costs its own longest sequence, rounded
        up to a multiple of ``multiple_of`` if given (TRL's ``pad_to_multiple_of``; masked columns of
        ``pad_token_id`` and zeros are added where the rollout is narrower)."""
        (prompt_ids, prompt_mask, completion_ids, _), width = trim_padding(
            *self.token_tensors, multiple_of, pad_token_id
        )
        fields = {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids}
        for name in PER_TOKEN_FIELDS:
            value = getattr(self, name)
            if name == "completion_ids" or value is None or value.dim() != 2:  # RLOO's advantages: [N]
                continue
            # a sequence-level [N, 1] (engine_weights) broadcasts over the columns as it is
            fields[name] = value if value.shape[1] == 1 and name == "engine_weights" else fit_columns(value, width)
        if self.images is not None:
            fields["images"] = self.images.fit_prompt(prompt_ids.shape[1])
        return dataclasses.replace(self, **fields)

    def to(self, device: torch.device | str) -> Rollout:
        images = None if self.images is None else self.images.to(device)
        moved = {name: value.to(device) for name, value in self.fields_by_row().items()}
        return dataclasses.replace(self, **moved, images=images)

    def with_advantages(self, added: Advantages) -> Rollout:
        """This rollout in ``added.order`` (if any) with the fields the algorithm computed."""
        rollout = self if added.order is None else self.select(added.order)
        names = ("advantages", "values", "returns", "pair_weight", "tokens_per_micro_batch")
        fields = {name: getattr(added, name) for name in names}
        return dataclasses.replace(rollout, **{name: value for name, value in fields.items() if value is not None})


@dataclass
class Advantages:
    """What an algorithm adds to a scored rollout before training on it (shapes as in ``Rollout``); the added
    fields are in the new row order when ``order`` is set."""

    advantages: torch.Tensor | None = None
    values: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    pair_weight: torch.Tensor | None = None
    tokens_per_micro_batch: torch.Tensor | None = None
    order: torch.Tensor | None = None  # [N] a row permutation (online DPO: each pair chosen first)
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RolloutBuffer:
    """The rollout being trained on (every process's samples, the same on every process), its mini-batch schedule and
    its metrics.

    ``schedule`` lists the sample indices of every global mini-batch of every PPO epoch, fixed when the rollout is
    made; ``cursor`` is the next one to train on. Each process trains its part of a mini-batch: the same global
    mini-batches on any number of processes, so a run resumed on another number trains what the original run would.
    """

    rollout: Rollout
    schedule: list[list[int]]
    metrics: dict[str, float] = field(default_factory=dict)
    cursor: int = 0
    completions_logged: bool = False  # log_completions: its completions were written at a logging step

    @property
    def exhausted(self) -> bool:
        return self.cursor >= len(self.schedule)

    def next_minibatch(self, part: int = 0, parts: int = 1) -> Rollout:
        """Process ``part`` of ``parts``'s share of the next mini-batch: its ``part``-th contiguous slice."""
        rows = self.schedule[self.cursor]
        size = len(rows) // parts
        self.cursor += 1
        return self.rollout.select(torch.tensor(rows[part * size : (part + 1) * size]))

    def state_dict(self) -> dict:
        return {
            "rollout": self.rollout.tensors(),
            "schedule": self.schedule,
            "cursor": self.cursor,
            "metrics": self.metrics,
            "completions_logged": self.completions_logged,
            "whole": True,  # every process's samples (since format 5); a format-4 buffer held this process's only
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> RolloutBuffer:
        return cls(
            Rollout.from_tensors(state["rollout"]),
            state["schedule"],
            state["metrics"],
            state["cursor"],
            state.get("completions_logged", False),
        )


def minibatch_schedule(
    num_samples: int,
    minibatch_size: int,
    num_epochs: int,
    group_size: int = 1,
    prompt_size: int = 1,
    generator: torch.Generator | None = None,
) -> list[list[int]]:
    """Shuffled mini-batches for each epoch, drawn from ``generator`` (torch's global RNG if None).

    Groups of ``group_size`` consecutive samples are shuffled as units and stay together, in order. Within a
    mini-batch, the samples of one prompt (``prompt_size`` consecutive samples) are put next to each other, in their
    shuffled order: its micro-batches then hold a prompt's completions together, which a packed pass computes the
    prompt once for. Which samples form a mini-batch (an optimizer step) does not depend on it.
    """
    schedule = []
    for _ in range(num_epochs):
        groups = torch.randperm(num_samples // group_size, generator=generator).tolist()
        perm = [g * group_size + j for g in groups for j in range(group_size)]
        for i in range(0, num_samples, minibatch_size):
            schedule.append(sorted(perm[i : i + minibatch_size], key=lambda sample: sample // prompt_size))
    return schedule


def rollout_metrics(rollout: Rollout, scores: torch.Tensor, reward_names: list[str], generation_time: float) -> dict:
    """What one rollout logs: the total reward and its spread, completion length, generation speed, the KL to the
    reference (when the sampling policy's log-probs were computed) and each reward's mean and std (TRL's names).
    ``scores`` [N, num_rewards] holds each reward function's scores before weighting, NaN where it returned None."""
    mask, total = rollout.completion_mask, rollout.scores
    metrics = {
        "completion_length": mask.sum(1).float().mean().item(),
        "tokens_per_second": mask.sum().item() / max(generation_time, 1e-9),
    }
    if scores.shape[1]:  # not for an algorithm without rewards (distillation)
        spread = total.std().item() if len(total) > 1 else 0.0
        metrics = {"reward": total.mean().item(), "reward_std": spread, **metrics}
    if rollout.old_logprobs is not None and rollout.ref_logprobs is not None:  # else the loss reports it
        metrics["kl"] = sequence_kl(rollout.old_logprobs, rollout.ref_logprobs, rollout.policy_mask).mean().item()
    for j, name in enumerate(reward_names):  # where the function applied (not None), as TRL: NaN if nowhere
        applied = scores[:, j][~scores[:, j].isnan()]
        metrics[f"rewards/{name}/mean"] = applied.mean().item() if len(applied) else math.nan
        metrics[f"rewards/{name}/std"] = applied.std().item() if len(applied) > 1 else 0.0
    return metrics


def engine_logprob_tensor(engine_logprobs: list[list[float]], like: torch.Tensor) -> torch.Tensor:
    """The generation engine's log-probs of the sampled tokens as a tensor shaped and placed as ``like`` [N, C]."""
    reported = torch.zeros_like(like)
    for row, values in enumerate(engine_logprobs):
        reported[row, : len(values)] = torch.tensor(values)
    return reported


def completion_rows(
    rollout: Rollout,
    tokenizer,
    reward_names: list[str],
    advantages: torch.Tensor | None,
    image_token_ids: tuple[int, ...] = (),
    with_images: bool = False,
) -> list:
    """The rollout's samples as the completion log shows them: the prompt as the model saw it (chat template
    included; a run of ``image_token_ids``, an image's expanded tokens, shown as one), the completion as the reward
    functions read it, each reward, the total and the advantage; ``with_images`` (``log_multimodal``): each sample's
    images where the rollout still holds them (not after a resume)."""
    prompts = [
        tokenizer.decode(collapsed(ids[mask.bool()].tolist(), image_token_ids))
        for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask)
    ]
    completions = tokenizer.batch_decode(
        [ids[mask.bool()] for ids, mask in zip(rollout.completion_ids, rollout.completion_mask)],
        skip_special_tokens=True,
    )
    sources = rollout.images.sources if with_images and rollout.images is not None else None
    rows = []
    for i, (prompt, completion) in enumerate(zip(prompts, completions)):
        rewards = {} if rollout.reward_scores is None else dict(zip(reward_names, rollout.reward_scores[i].tolist()))
        advantage = None if advantages is None else advantages[i].item()
        row = {"prompt": prompt, "completion": completion, "rewards": rewards, "reward": rollout.scores[i].item()}
        rows.append({**row, "advantage": advantage, **({"images": sources[i]} if sources is not None else {})})
    return rows


def collapsed(ids: list[int], repeated: tuple[int, ...]) -> list[int]:
    """``ids`` with each run of one of the ``repeated`` ids kept as a single id."""
    return [t for i, t in enumerate(ids) if not (t in repeated and i and ids[i - 1] == t)]


@dataclass
class SampledRollout:
    """One rollout generated (and, without reward models, scored) ahead of training. Shapes: N samples."""

    version: int  # the global step of the weights it was sampled with
    prompts: list  # [N] as the reward functions see them
    columns: dict[str, list]  # the dataset's other columns, [N] each
    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]  # the server's log-prob of each sampled token: the sampling policy's
    scores: list[list[float | None]] | None  # [N, R], None where a function does not apply; None: not scored yet
    metrics: dict[str, float]
    generation_time: float
    prompt_index: list[int] | None = None  # [N] each sample's prompt's row in the dataset (older checkpoints: None)
    images: dict[str, torch.Tensor] | None = None  # the prompts' image inputs, ``ImageBatch.flat()``; None: no images
    env_mask: list[list[int]] | None = None  # [N] the tool loop's: 1 on the tokens the policy sampled; None: one turn
    completions: list | None = None  # [N] the tool loop's conversations, for reward models scoring later; else None
    # partial rollouts (``partial_rollout_tokens``): each completion's runs of tokens as [first token, the global
    # step of the weights that sampled it from there on] (None: every token at ``version``). Until the hand-over
    # continues the unfinished ones, ``stopped`` [N] says which ended by themselves and ``seeds`` [N] are kept.
    versions: list[list[list[int]]] | None = None
    stopped: list[bool] | None = None
    seeds: list[int] | None = None

    def state_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    @classmethod
    def from_state_dict(cls, state: dict) -> SampledRollout:
        """The rollout a checkpoint stored; one with other keys than ``state_dict`` writes is refused, naming them."""
        names = [f.name for f in dataclasses.fields(cls)]
        required = [f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING]
        unknown, missing = sorted(set(state) - set(names)), [name for name in required if name not in state]
        if unknown or missing:
            raise ValueError(
                f"SampledRollout.from_state_dict: a rollout generated ahead (checkpoint part rollouts_ahead) has keys "
                f"{unknown} that this steadyrl does not know and lacks {missing}; it accepts {names}. Another "
                "steadyrl version wrote it: resume with that version, or from a checkpoint this version wrote."
            )
        return cls(**state)


def scores_to_rows(scores: torch.Tensor) -> list[list[float | None]]:
    """Scores [N, R] as JSON rows, NaN (a function that does not apply) as None."""
    return [[None if math.isnan(v) else v for v in row] for row in scores.tolist()]


def scores_from_rows(rows: list[list[float | None]]) -> torch.Tensor:
    """``scores_to_rows``' inverse: [N, R] float32, None as NaN."""
    return torch.tensor([[math.nan if v is None else v for v in row] for row in rows], dtype=torch.float32)
