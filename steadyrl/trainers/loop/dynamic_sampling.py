"""Dynamic sampling (DAPO, Yu et al., 2025): rollouts made only of groups whose rewards differ.

A group whose completions all got the same reward has zero advantage under GRPO's and RLOO's group baselines: it
costs a training pass and teaches nothing. With ``dynamic_sampling``, ``DynamicSampling`` makes each rollout from
draws of ``rollout_batch_size`` prompts through the rollout source (synchronous, generated ahead or multi-turn alike):

    draw d           prompts -> completions -> scores, on each process its share, as without dynamic sampling
    keep             the groups whose total reward (as the advantages read it) varies: ``groups_with_signal``
    until full       every process counts every process's kept groups and draws again, together, until the rollout's
                     ``rollout_batch_size`` groups are kept, or stops with ``DynamicSamplingError`` after
                     ``max_num_gen_batches`` draws (verl's name and behaviour; 0: no limit)
    the rollout      the first ``rollout_batch_size`` kept groups in draw order (draw, prompt's place in the batch),
                     split among the processes as a drawn batch is: ``fill_order``

The choice depends on the draws alone, so a rollout is the same on any number of processes, and the prompt sampler's
position and the draw count (sampling seeds) advance with every draw, dropped groups included: a resume is exact.
Kept groups beyond the rollout's are unused (verl drops them too).
"""

from __future__ import annotations

import torch
from accelerate.utils import gather_object

from ...agents.turns import Trajectories
from ...distributed.metrics import combine_by_name
from ...generation import Generation
from ...ops import zero_std_groups
from .rollout_rewards import RolloutRewards
from .sources import Sampled

GroupKey = tuple[int, int, int]  # (draw, process, group on the process): a drawn group's place in draw order


class DynamicSamplingError(RuntimeError):
    """``max_num_gen_batches`` draws did not fill a rollout with groups whose rewards differ."""


def groups_with_signal(totals: torch.Tensor, k: int) -> torch.Tensor:
    """[G] bool: the groups of ``k`` consecutive samples whose rewards ``totals`` [G * k] are not all equal."""
    return ~zero_std_groups(totals, k)


def fill_order(kept: list[GroupKey], needed: int, processes: int, rank: int) -> list[GroupKey]:
    """Process ``rank``'s groups of the rollout: its share (``needed / processes`` groups, in order) of the first
    ``needed`` kept groups of every process in draw order: by draw, then by the prompt's place in the drawn batch
    (process, then group on the process)."""
    chosen = sorted(kept)[:needed]
    share = needed // processes
    return chosen[rank * share : (rank + 1) * share]


def sample_rows(sampled: Sampled, scores: torch.Tensor) -> list[dict]:
    """Each sample of ``sampled`` as a row that travels between processes: what the scoring passes read (the reward
    functions' extra inputs, such as an environment object, are spent)."""
    generation, columns = sampled.generation, sampled.columns
    env_mask = getattr(generation, "env_mask", None)
    return [
        {
            "prompt": sampled.prompts[i],
            "columns": {name: values[i] for name, values in columns.items()},
            "prompt_ids": sampled.prompt_ids[i],
            "completion_ids": generation.completion_ids[i],
            "logprobs": None if generation.logprobs is None else generation.logprobs[i],
            "env_mask": None if env_mask is None else env_mask[i],
            "scores": scores[i].clone(),  # a row of its own (a view would pickle the whole tensor)
            "prompt_index": None if sampled.prompt_index is None else sampled.prompt_index[i],
        }
        for i in range(len(sampled.prompts))
    ]


def sampled_from_rows(rows: list[dict], generation_time: float, metrics: dict) -> tuple[Sampled, torch.Tensor]:
    """``sample_rows``' inverse over the chosen rows: one ``Sampled`` and its scores [N, num_rewards]."""
    completion_ids = [row["completion_ids"] for row in rows]
    logprobs = None if rows[0]["logprobs"] is None else [row["logprobs"] for row in rows]
    if rows[0]["env_mask"] is None:
        generation = Generation(completion_ids, logprobs)
    else:
        generation = Trajectories(completion_ids, logprobs, env_mask=[row["env_mask"] for row in rows])
    columns = {name: [row["columns"][name] for row in rows] for name in rows[0]["columns"]}
    prompts, prompt_ids = [row["prompt"] for row in rows], [row["prompt_ids"] for row in rows]
    indices = None if rows[0]["prompt_index"] is None else [row["prompt_index"] for row in rows]
    sampled = Sampled(prompts, columns, prompt_ids, generation, generation_time, metrics, prompt_index=indices)
    return sampled, torch.stack([row["scores"] for row in rows])


class DynamicSampling:
    """The next rollout's sampled completions and scores, made of groups whose rewards differ (module docstring).

    Args:
        source: where completions come from (a ``RolloutSource``).
        scorer: scores them (``Scorer``).
        rewards: gives each sample its total (``RolloutRewards``).
        eos_token_id: the policy tokenizer's EOS (``missing_eos_penalty``).
        accelerator: the run's processes.
        args: the config (rollout_batch_size, n_samples_per_prompt, max_num_gen_batches).

    Example::

        sampled, scores, metrics = DynamicSampling(source, scorer, rewards, eos, accelerator, args)(trainer.state)
    """

    def __init__(self, source, scorer, rewards: RolloutRewards, eos_token_id: int | None, accelerator, args) -> None:
        self.source, self.scorer, self.rewards, self.eos_token_id = source, scorer, rewards, eos_token_id
        self.accelerator, self.args = accelerator, args

    def __call__(self, state) -> tuple[Sampled, torch.Tensor, dict[str, float]]:
        """``(sampled, scores [N, num_rewards], metrics)`` of this process's share of the rollout; the reward
        functions read ``state`` as ``trainer_state``."""
        args, accelerator = self.args, self.accelerator
        k, needed = args.n_samples_per_prompt, args.rollout_batch_size
        processes, rank = accelerator.num_processes, accelerator.process_index
        keys: list[GroupKey] = []  # every process's kept groups, in draw order
        pool: dict[GroupKey, list[dict]] = {}  # this process's kept groups' rows
        dropped = draws = 0
        drawn_metrics, generation_time = [], 0.0
        while len(keys) < needed:
            if args.max_num_gen_batches and draws == args.max_num_gen_batches:
                raise DynamicSamplingError(self.bound_message(draws, len(keys), dropped))
            sampled = self.source.next(state)
            scores, metrics = (sampled.scores, {}) if sampled.scores is not None else self.scorer(sampled, state)
            drawn_metrics.append({**metrics, **sampled.metrics})
            generation_time += sampled.generation_time
            signal = groups_with_signal(self.totals(sampled, scores), k).tolist()  # [G] this process's groups
            everywhere = gather_object(signal) if processes > 1 else signal  # every process's, in rank order
            share = len(signal)
            keys += [(draws, i // share, i % share) for i, keep in enumerate(everywhere) if keep]
            rows = sample_rows(sampled, scores)
            pool.update({(draws, rank, g): rows[g * k : (g + 1) * k] for g, keep in enumerate(signal) if keep})
            dropped, draws = dropped + len(everywhere) - sum(everywhere), draws + 1
        chosen = fill_order(keys, needed, processes, rank)
        if processes > 1:  # the rollout's groups reach the process that trains them; unused ones stay put
            wanted = set(sorted(keys)[:needed])
            pool = dict(gather_object([(key, rows) for key, rows in pool.items() if key in wanted]))
        metrics = {
            **combine_by_name(drawn_metrics),  # each metric over the draws that logged it
            "dynamic_sampling/prompts_drawn": float(draws * needed),
            "dynamic_sampling/groups_dropped": float(dropped),
            "dynamic_sampling/groups_unused": float(len(keys) - needed),
            "dynamic_sampling/draws": float(draws),
        }
        sampled, scores = sampled_from_rows([row for key in chosen for row in pool[key]], generation_time, metrics)
        return sampled, scores, {}

    def totals(self, sampled: Sampled, scores: torch.Tensor) -> torch.Tensor:
        """[N] each sample's total reward as the rollout will hold it (``Rollout.scores``): the weighted sum of the
        rewards, less ``missing_eos_penalty`` where the completion ends without EOS."""
        eos = self.eos_token_id
        no_eos = torch.tensor([not ids or ids[-1] != eos for ids in sampled.generation.completion_ids])
        return self.rewards.total(scores, no_eos)

    def bound_message(self, draws: int, kept: int, dropped: int) -> str:
        args = self.args
        return (
            f"dynamic_sampling: {draws} batches of rollout_batch_size={args.rollout_batch_size} prompts "
            f"(max_num_gen_batches={args.max_num_gen_batches}) kept {kept} groups whose rewards differ, of the "
            f"{args.rollout_batch_size} a rollout needs; {dropped} groups got the same reward for all "
            f"{args.n_samples_per_prompt} completions. The prompts are too easy or too hard for the model, or a reward "
            "function gives (nearly) constant rewards: check them, or raise max_num_gen_batches (0: no limit) and "
            "resume from the last checkpoint."
        )
