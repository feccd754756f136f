"""The scorer and the scoring passes alone, built from their inputs (a config, a tokenizer, an algorithm, the rewards,
two tiny models), no trainer: the reward functions see TRL's inputs and the trainer state they are given; the rollout
holds the weighted total less missing_eos_penalty, the policy's log-probs where the algorithm asks for them and the
reference's where a KL term reads them."""

import torch
from accelerate import Accelerator
from transformers import TrainerState

from steadyrl import RLOOConfig
from steadyrl.generation import Generation
from steadyrl.ops import completion_logprobs
from steadyrl.toy.task import build_model, build_tokenizer
from steadyrl.trainers.loop.algorithm import Processes
from steadyrl.trainers.loop.rollout_builder import RolloutBuilder
from steadyrl.trainers.loop.rollout_rewards import RolloutRewards, Scorer
from steadyrl.trainers.loop.sources import Sampled
from steadyrl.trainers.rloo import RLOO


def length_reward(completions, trainer_state, **kwargs):
    return [len(text) + trainer_state.global_step for text in completions]


def parts(tmp_path, **settings):
    tokenizer = build_tokenizer()
    args = RLOOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, **settings)
    policy, reference = build_model(tokenizer, seed=0).eval(), build_model(tokenizer, seed=1).eval()
    algorithm = RLOO(args, Processes(Accelerator(cpu=True)), tokenizer.eos_token_id, policy)
    rewards = RolloutRewards([length_reward, lambda completions, **kw: [1.0] * len(completions)], torch.ones(2), args)
    passes = RolloutBuilder(
        args, tokenizer, torch.device("cpu"), algorithm, rewards, policy, reference, args.beta > 0, False
    )
    return tokenizer, args, policy, reference, rewards, passes


def sampled(tokenizer) -> Sampled:
    eos = tokenizer.eos_token_id
    prompts = ["ab", "ab", "cde", "cde"]
    prompt_ids = [tokenizer(p)["input_ids"] for p in prompts]
    completions = [
        tokenizer("xy")["input_ids"] + [eos],
        tokenizer("z")["input_ids"],
        [eos],
        tokenizer("qq")["input_ids"],
    ]
    return Sampled(prompts, {}, prompt_ids, Generation(completions), generation_time=0.5)


def test_the_scorer_gives_the_reward_functions_trls_inputs_and_the_given_state(tmp_path):
    tokenizer, args, *_, rewards, _ = parts(tmp_path)
    state = TrainerState()
    state.global_step = 10
    scores, _ = Scorer(rewards, tokenizer, False, args)(sampled(tokenizer), state)
    assert scores.tolist() == [[12.0, 1.0], [11.0, 1.0], [10.0, 1.0], [12.0, 1.0]]  # len(text) + step, then 1


def test_the_rollout_holds_the_total_and_the_log_probs_the_algorithm_and_the_kl_term_read(tmp_path):
    tokenizer, args, policy, reference, rewards, passes = parts(tmp_path, beta=0.1, missing_eos_penalty=0.5)
    scores = torch.tensor([[2.0, 1.0], [1.0, 1.0], [0.0, 1.0], [2.0, 1.0]])
    rollout, metrics = passes(sampled(tokenizer), scores, {})
    assert rollout.scores.tolist() == [3.0, 1.5, 1.0, 2.5]  # the sum, less 0.5 for the two completions without EOS
    assert passes.algorithm.needs_old_logprobs()  # RLOO's KL penalty is in its reward
    with torch.no_grad():
        own = completion_logprobs(policy, *rollout.token_tensors, temperature=args.temperature)[0]
        ref = completion_logprobs(reference, *rollout.token_tensors, temperature=args.temperature)[0]
    mask = rollout.completion_mask.bool()
    torch.testing.assert_close(rollout.old_logprobs[mask], own[mask])
    torch.testing.assert_close(rollout.ref_logprobs[mask], ref[mask])
    assert metrics["tokens_per_second"] == rollout.completion_mask.sum().item() / 0.5
    assert metrics["rewards/length_reward/mean"] == 1.25  # each function's own scores, before weighting

    _, _, _, _, _, no_kl = parts(tmp_path / "beta0", beta=0.0)
    plain, _ = no_kl(sampled(tokenizer), scores, {})
    assert plain.ref_logprobs is None and plain.old_logprobs is None  # trained once, no KL: no pass at all
    assert plain.scores.tolist() == [3.0, 2.0, 1.0, 3.0]  # no missing_eos_penalty
