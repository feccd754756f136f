"""Held-out evaluation: sample completions for every prompt of ``eval_dataset`` with the current policy, score them
with the reward functions and log ``eval_*`` metrics, as TRL does.

Sampling is seeded by the run's seed alone (per prompt and sample with vLLM; one fixed stream with HF generate),
so successive evaluations differ only by the policy. Training is not disturbed: the RNG state, the prompt
sampler and the rollout buffer are left exactly as they were.
"""

from __future__ import annotations

import math

import datasets
import torch
from accelerate.utils import gather_object

from ...agents.turns import Trajectories
from ...checkpoint.output_dir import output_dir_locked
from ...data.prompts import prompt_kind
from ...data.stream import is_stream
from ...generation import Generation, sampling_seed
from ...ops import ends_without_eos, pad_prompts_and_completions
from ...rewards import reward_func_name
from ...rng import rng_untouched
from ..config.input_checks import check_dataset
from .sources import Sampled, repeat_rows

EVAL_ROLLOUT = -1  # the rollout index in evaluation's sampling seeds, which no training rollout has


def check_eval_dataset(dataset, conversational: bool) -> None:
    """Refuse an eval_dataset (or any dataset of a dict of them, as ``Trainer`` takes; each a ``datasets.Dataset`` or
    a stream, whose first rows are checked here and the rest when evaluation reads them) whose prompts are unusable
    or of another kind than the training prompts."""
    if isinstance(dataset, dict):
        for name, each in dataset.items():
            check_one_eval_dataset(each, f"eval_dataset[{name!r}]", conversational)
    else:
        check_one_eval_dataset(dataset, "eval_dataset", conversational)


def check_one_eval_dataset(dataset, name: str, conversational: bool) -> None:
    check_dataset(dataset, name)
    if prompt_kind(dataset, name) != conversational:
        kinds = ("conversations", "strings") if conversational else ("strings", "conversations")
        raise ValueError(f"{name} holds {kinds[1]} but train_dataset {kinds[0]}: give both the same kind of prompt.")


def summary(
    prefix: str,
    totals: list[float],
    per_function: dict[str, list[float]],
    lengths: list[int],
    truncated: list[bool],
    rewarded: bool = True,
) -> dict[str, float]:
    """TRL's evaluation metrics from every completion's total reward (unless not ``rewarded``: distillation), each
    function's rewards, its length and whether it was cut at max_completion_length (no EOS)."""

    def mean(values):
        return sum(values) / len(values)

    def std(values):  # unbiased, as torch.std
        return math.sqrt(sum((v - mean(values)) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0

    metrics = {f"{prefix}_reward": mean(totals), f"{prefix}_reward_std": std(totals)} if rewarded else {}
    for name, values in per_function.items():
        values = [v for v in values if not math.isnan(v)] or [math.nan]  # None (NaN): the function did not apply
        metrics[f"{prefix}_rewards/{name}/mean"] = mean(values)
        metrics[f"{prefix}_rewards/{name}/std"] = std(values)
    metrics[f"{prefix}_completions/mean_length"] = mean(lengths)
    metrics[f"{prefix}_completions/min_length"] = float(min(lengths))
    metrics[f"{prefix}_completions/max_length"] = float(max(lengths))
    metrics[f"{prefix}_completions/clipped_ratio"] = mean([float(t) for t in truncated])
    return metrics


def joined(parts: list[Sampled]) -> Sampled:
    """Consecutive batches of evaluation rows as one, with what the loss and the metrics read of them (the reward
    functions' inputs were spent on each batch)."""
    if len(parts) == 1:
        return parts[0]
    generation = Generation.concatenate([part.generation for part in parts])
    env_masks = [getattr(part.generation, "env_mask", None) for part in parts]
    if all(mask is not None for mask in env_masks):  # multi-turn: the tokens the policy sampled
        env_mask = [row for mask in env_masks for row in mask]
        generation = Trajectories(generation.completion_ids, generation.logprobs, env_mask=env_mask)
    return Sampled(
        [prompt for part in parts for prompt in part.prompts],
        {name: [value for part in parts for value in part.columns[name]] for name in parts[0].columns},
        [ids for part in parts for ids in part.prompt_ids],
        generation,
        0.0,
    )


class EvaluationMixin:
    """``evaluate()`` for ``OnPolicyTrainer``."""

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict[str, float]:
        """Generate ``num_generations_eval`` (default ``n_samples_per_prompt``) completions for every prompt of
        ``eval_dataset`` (default: the trainer's), score them with the reward functions, log and return the
        metrics: ``eval_reward``, ``eval_reward_std``, ``eval_rewards/<name>/mean`` and ``/std``,
        ``eval_completions/mean_length``, ``min_length``, ``max_length``, ``clipped_ratio``, and for GRPO, RLOO and
        distillation ``eval_loss`` (the evaluation rollout's loss; distillation has no reward metrics). A dict of
        datasets is evaluated one by one, as by ``Trainer``: the metrics of ``{"a": ...}`` are named
        ``eval_a_reward``, ....

        Outside ``train()`` it takes output_dir's lock first (``OutputDirInUse`` while another run holds it: it would
        push weights into that run's vLLM server and write into its logs) and releases the vLLM server at its end."""
        if self.is_in_train:  # train() holds the lock, and releases the server as it ends
            return self.evaluate_datasets(eval_dataset, ignore_keys, metric_key_prefix)
        with output_dir_locked(self.args.output_dir, self.accelerator):
            try:
                return self.evaluate_datasets(eval_dataset, ignore_keys, metric_key_prefix)
            finally:
                self.backend.release()

    def evaluate_datasets(self, eval_dataset, ignore_keys, metric_key_prefix: str) -> dict[str, float]:
        """``evaluate()``'s work, with output_dir locked."""
        if eval_dataset is None:
            eval_dataset = self.eval_dataset
        else:
            check_eval_dataset(eval_dataset, self.conversational)
        if eval_dataset is None:
            raise ValueError("evaluate() needs an eval_dataset: pass one to the trainer or to evaluate().")
        if isinstance(eval_dataset, dict):
            metrics = {}
            for name, dataset in eval_dataset.items():
                metrics.update(self.evaluate_datasets(dataset, ignore_keys, f"{metric_key_prefix}_{name}"))
            return metrics
        if not self.reward_funcs and self.algorithm.uses_rewards:
            raise ValueError("evaluate() scores completions with reward_funcs or reward_model; this trainer has none.")
        if is_stream(eval_dataset):  # a stream is read whole at each evaluation, as TRL's eval DataLoader reads it
            eval_dataset = datasets.Dataset.from_list(list(eval_dataset))
        self.rollout_source.drain()  # max_staleness: the server is free before evaluation pushes the current weights
        with rng_untouched():  # HF generate draws from the global RNG, which belongs to training
            torch.manual_seed(self.args.seed)
            metrics = self.evaluation_metrics(eval_dataset, metric_key_prefix)
        self.log(metrics)
        self.control = self.callback_handler.on_evaluate(self.args, self.state, self.control, metrics=metrics)
        return metrics

    @torch.no_grad()
    def evaluation_metrics(self, dataset, prefix: str) -> dict[str, float]:
        args, world, rank = self.args, self.accelerator.num_processes, self.accelerator.process_index
        k = args.num_generations_eval or args.n_samples_per_prompt
        # Every process takes the same number of prompts (wrapping around at the end, the repeats left out of the
        # metrics): under ZeRO-3, generation and reward-model passes are collective and must match in number.
        per_process = math.ceil(len(dataset) / world)
        indices = range(rank * per_process, (rank + 1) * per_process)
        rows = dataset[[i % len(dataset) for i in indices]]  # {column: values}
        counted = [i < len(dataset) for i in indices for _ in range(k)]
        prompts, columns = repeat_rows(rows, k, not args.remove_unused_columns)
        seeds = [sampling_seed(args.seed, EVAL_ROLLOUT, indices[i // k], i % k) for i in range(len(prompts))]
        sampled, scores = self.predicted_batches(prompts, columns, seeds)  # scores [M, R]
        completion_ids = sampled.generation.completion_ids
        tokens = pad_prompts_and_completions(sampled.prompt_ids, completion_ids, self.processing_class.pad_token_id)
        no_eos = ends_without_eos(
            tokens["completion_ids"], tokens["completion_mask"], self.processing_class.eos_token_id
        )
        total = self.rewards.total(scores, no_eos)

        def kept(values) -> list:
            values = [v for v, keep in zip(values, counted) if keep]
            return gather_object(values) if world > 1 else values  # every process gets every process's values

        per_function = {reward_func_name(f): kept(scores[:, j].tolist()) for j, f in enumerate(self.reward_funcs)}
        lengths = kept([len(ids) for ids in completion_ids])
        rewarded = self.algorithm.uses_rewards
        metrics = summary(prefix, kept(total.tolist()), per_function, lengths, kept(no_eos.tolist()), rewarded)
        if self.algorithm.evaluates_loss:
            metrics[f"{prefix}_loss"] = self.evaluation_loss(sampled, scores)
        return metrics

    def predicted_batches(self, prompts: list, columns: dict, seeds: list[int]) -> tuple[Sampled, torch.Tensor]:
        """This process's evaluation rows completed and scored ``per_device_eval_batch_size`` at a time, each batch
        followed by ``on_prediction_step`` as ``Trainer``'s evaluation loop fires it; all of them and their scores
        [M, R]."""
        size, parts, scores = self.args.per_device_eval_batch_size, [], []
        for start in range(0, len(prompts), size):
            rows = slice(start, start + size)
            batch_columns = {name: values[rows] for name, values in columns.items()}
            batch_prompts, prompt_ids, _, generation = self.rollout_source.complete(
                prompts[rows], batch_columns, seeds[rows], self.state.global_step, chunk=size
            )
            parts.append(Sampled(batch_prompts, batch_columns, prompt_ids, generation, 0.0))
            scores.append(self.scorer(parts[-1], self.state)[0])
            self.control = self.callback_handler.on_prediction_step(self.args, self.state, self.control)
        return joined(parts), torch.cat(scores)

    def evaluation_loss(self, sampled: Sampled, scores: torch.Tensor) -> float:
        """The loss of the evaluation rollout as a training step computes it (the scoring passes, the algorithm's
        advantages, the loss of each micro-batch of ``micro_train_batch_size``, the model in eval mode), averaged over
        the micro-batches and the processes: TRL's ``eval_loss``."""
        rollout, _ = self.rollout_builder(sampled, scores, {})
        args, k = self.args, self.args.num_generations_eval or self.args.n_samples_per_prompt
        trained_k, args.n_samples_per_prompt = args.n_samples_per_prompt, k  # groups of the evaluation's size
        try:
            rollout = rollout.with_advantages(self.algorithm.advantages(rollout))
        finally:
            args.n_samples_per_prompt = trained_k
        model, size, device = self.model_wrapped, self.args.micro_train_batch_size, self.accelerator.device
        pad_id = getattr(self.processing_class, "pad_token_id", None) or 0  # masked: any id keeps the numbers
        padding = {"multiple_of": self.args.pad_to_multiple_of, "pad_token_id": pad_id}
        was_training, losses = model.training, []
        model.eval()
        try:
            for start in range(0, len(rollout), size):
                batch = rollout.select(slice(start, start + size)).trimmed(**padding).to(device)
                loss = self.algorithm.loss(model, batch)[0]
                losses.append(float(sum(loss.values()) if isinstance(loss, dict) else loss))
        finally:
            model.train(was_training)
        mean = torch.tensor([sum(losses) / len(losses)], dtype=torch.float64, device=device)
        total = self.algorithm.processes.sum
        return (mean if total is None else total(mean) / self.accelerator.num_processes).item()
