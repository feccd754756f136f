"""Dynamic sampling (dynamic_sampling, max_num_gen_batches) on the toy task, with a reward that is the same for every
completion of half the prompts (those whose word starts with a-m): those groups are dropped and replaced by further
draws, every trained group's rewards differ, the counts are logged, the bound stops the run as verl's does (and a
resume may raise it), and multi-turn rollouts are filtered alike."""

import zlib

import pytest
import torch
from support.toy_run import half_constant_reward, make_trainer, tool_task

from steadyrl.checkpoint import CheckpointError
from steadyrl.generation import Generation
from steadyrl.trainers.loop.dynamic_sampling import DynamicSamplingError
from steadyrl.trainers.loop.sources import Sampled

ROLLOUT_PROMPTS, K = 4, 2  # support/toy_run.py's rollout: 4 prompts x 2 samples


def record_rollouts(trainer) -> list:
    """Every rollout the trainer makes, as it trains on it."""
    rollouts, make_rollout_buffer = [], trainer.make_rollout_buffer

    def recorded():
        buffer = make_rollout_buffer()
        rollouts.append(buffer.rollout)
        return buffer

    trainer.make_rollout_buffer = recorded
    return rollouts


def drawn_prompts(trainer, count: int) -> list[str]:
    """The first ``count`` prompts the run's sampler draws, in order (a fresh sampler of the same seed)."""
    from steadyrl.data.sampling import make_sampler

    sampler = make_sampler(trainer.train_dataset, trainer.args.seed, trainer.args.shuffle_dataset)
    return trainer.train_dataset[sampler.next(count)]["prompt"]


@pytest.mark.parametrize(("algorithm", "bound"), [("grpo", 0), ("rloo", 10)])
def test_groups_without_signal_are_replaced_by_further_draws_and_counted(tmp_path, algorithm, bound):
    trainer = make_trainer(
        tmp_path,
        algorithm=algorithm,
        reward_funcs=[half_constant_reward],
        dynamic_sampling=True,
        max_num_gen_batches=bound,  # 0: no limit
        max_steps=8,  # 2 rollouts of 4 steps
        save_steps=8,
    )
    rollouts = record_rollouts(trainer)
    trainer.train()
    tokenizer = trainer.processing_class
    assert len(rollouts) == 2
    for rollout in rollouts:
        assert len(rollout) == ROLLOUT_PROMPTS * K  # full, whatever was dropped
        groups = rollout.scores.view(-1, K)
        assert (groups.max(1).values > groups.min(1).values).all(), "a trained group's rewards are all equal"
        prompts = tokenizer.batch_decode(rollout.prompt_ids[::K], skip_special_tokens=True)
        assert all(prompt[0] >= "n" for prompt in prompts), prompts  # none of the constant-reward prompts

    logs = [entry for entry in trainer.state.log_history if "dynamic_sampling/draws" in entry]
    assert [entry["step"] for entry in logs] == list(range(1, 9))
    per_rollout = [logs[0], logs[4]]  # a rollout's counts, logged with each of its 4 steps
    draws = [int(entry["dynamic_sampling/draws"]) for entry in per_rollout]
    assert all(draw >= 2 for draw in draws), draws  # with 4 prompts a draw, one draw rarely fills a rollout
    assert trainer.prompt_draw.draws == sum(draws)
    assert trainer.sampler.consumed == ROLLOUT_PROMPTS * sum(draws)  # every drawn prompt, dropped ones too
    drawn = drawn_prompts(trainer, trainer.sampler.consumed)
    first = 0
    for entry, rollout_draws in zip(per_rollout, draws):
        mine = drawn[first : first + ROLLOUT_PROMPTS * rollout_draws]
        first += len(mine)
        constant = sum(prompt[0] < "n" for prompt in mine)
        assert entry["dynamic_sampling/prompts_drawn"] == len(mine)
        assert entry["dynamic_sampling/groups_dropped"] == constant
        assert entry["dynamic_sampling/groups_unused"] == len(mine) - constant - ROLLOUT_PROMPTS
        assert entry.get("frac_reward_zero_std", 0.0) == 0.0  # GRPO's own count of groups without signal


def test_the_bound_stops_the_run_before_any_step_with_every_draw_counted(tmp_path):
    trainer = make_trainer(
        tmp_path,
        algorithm="grpo",
        reward_funcs=[lambda completions, **kwargs: [1.0] * len(completions)],
        dynamic_sampling=True,
        max_num_gen_batches=3,
    )
    with pytest.raises(DynamicSamplingError, match=r"dynamic_sampling: 3 batches of rollout_batch_size=4 prompts"):
        trainer.train()
    assert trainer.state.global_step == 0 and not list(tmp_path.glob("checkpoint-*"))
    assert trainer.sampler.consumed == 3 * ROLLOUT_PROMPTS and trainer.prompt_draw.draws == 3


def test_without_dynamic_sampling_zero_variance_groups_are_trained_on(tmp_path):
    trainer = make_trainer(tmp_path, algorithm="grpo", reward_funcs=[half_constant_reward], max_steps=4)
    rollouts = record_rollouts(trainer)
    trainer.train()
    assert trainer.sampler.consumed == ROLLOUT_PROMPTS and trainer.prompt_draw.draws == 1
    groups = rollouts[0].scores.view(-1, K)
    assert bool((groups[:, 0] == groups[:, 1]).any()), "the toy draw has constant-reward prompts"
    assert torch.isfinite(rollouts[0].advantages).all()
    assert not any("dynamic_sampling/draws" in entry for entry in trainer.state.log_history)


def test_a_resume_may_raise_the_bound_but_not_turn_dynamic_sampling_off(tmp_path):
    settings = dict(algorithm="grpo", reward_funcs=[half_constant_reward], dynamic_sampling=True, save_steps=4)
    make_trainer(tmp_path, max_steps=4, **settings).train()
    refused = make_trainer(tmp_path, max_steps=8, **{**settings, "dynamic_sampling": False})
    with pytest.raises(CheckpointError, match=r"\(dynamic_sampling: checkpoint True, now False\)"):
        refused.train(resume_from_checkpoint=True)
    resumed = make_trainer(tmp_path, max_steps=8, max_num_gen_batches=0, **settings)  # from 10: no limit
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 8 and resumed.prompt_draw.draws >= 4


def alternating_for_odd_prompts(prompts, completions, **kwargs) -> list[float]:
    """0 and 1 alternately (a group's two samples differ) for a prompt of odd CRC, else 0.5 (dropped)."""
    texts = [prompt[-1]["content"] for prompt in prompts]
    return [float(i % 2) if zlib.crc32(text.encode()) % 2 else 0.5 for i, text in enumerate(texts)]


def test_multi_turn_rollouts_are_filtered_after_their_tool_calls(tmp_path):
    task = {**tool_task("environment"), "reward_funcs": [alternating_for_odd_prompts]}
    trainer = make_trainer(tmp_path, algorithm="grpo", dynamic_sampling=True, max_steps=4, save_steps=4, **task)
    rollouts = record_rollouts(trainer)
    trainer.train()
    (rollout,) = rollouts
    assert rollout.env_mask is not None and (rollout.env_mask == 0).any(), "tool results are masked as before"
    groups = rollout.scores.view(-1, K)
    assert len(rollout) == ROLLOUT_PROMPTS * K and (groups[:, 0] != groups[:, 1]).all()
    logged = trainer.state.log_history[0]
    assert logged["dynamic_sampling/draws"] >= 2 and "tools/call_frequency" in logged


def test_the_filter_reads_the_total_reward_the_rollout_holds(tmp_path):
    """Weighted rewards (None left out) less missing_eos_penalty: what RolloutBuilder puts in Rollout.scores."""
    trainer = make_trainer(
        tmp_path,
        algorithm="rloo",
        dynamic_sampling=True,
        missing_eos_penalty=0.25,
        reward_weights=[2.0, 1.0],
        reward_funcs=[half_constant_reward, half_constant_reward],
    )
    eos = trainer.processing_class.eos_token_id
    sampled = Sampled(
        prompts=["ab:"] * 4,
        columns={},
        prompt_ids=[[5, 6]] * 4,
        generation=Generation([[7, eos], [7, 8], [9, 9, eos], [9]]),
        generation_time=0.0,
    )
    scores = torch.tensor([[0.5, 0.5], [0.5, float("nan")], [0.1, 0.2], [0.3, 0.0]])
    rollout = trainer.rollout_builder.padded(
        sampled.prompt_ids, sampled.generation.completion_ids, scores, False, sampled.generation
    )
    totals = trainer.dynamic_sampling.totals(sampled, scores)
    torch.testing.assert_close(totals, rollout.scores, rtol=0, atol=0)
    torch.testing.assert_close(totals, torch.tensor([1.5, 0.75, 0.4, 0.35]))
