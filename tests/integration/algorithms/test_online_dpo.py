"""Online DPO: its loss against TRL's, pair labelling and tie rules, the beta schedule, judges and bad input."""

import pytest
import torch
from conftest import assert_close_to_scale
from support.toy_run import make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from steadyrl import JudgeError, OnlineDPOConfig
from steadyrl.ops import chosen_first_order, pair_ties, pair_weights
from steadyrl.rollout import Rollout, TokenBatch
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

P, PROMPT_LEN, COMPLETION_LEN, BETA = 3, 4, 5, 0.3


def fixed_pairs(pad_token_id):
    """P prompts of equal length (no left padding: TRL's online DPO passes no position ids) with a chosen and a
    rejected completion each; two completions end early and are right-padded."""
    generator = torch.Generator().manual_seed(0)
    prompts = torch.randint(3, 30, (P, PROMPT_LEN), generator=generator)
    chosen, rejected = (torch.randint(3, 30, (P, COMPLETION_LEN), generator=generator) for _ in range(2))
    chosen_mask, rejected_mask = torch.ones_like(chosen), torch.ones_like(rejected)
    chosen_mask[0, 3:], rejected_mask[1, 2:] = 0, 0
    chosen[chosen_mask == 0], rejected[rejected_mask == 0] = pad_token_id, pad_token_id
    return prompts, chosen, chosen_mask, rejected, rejected_mask


def trl_online_dpo_loss(model, reference, tokenizer, loss_type, pairs, output_dir):
    """Loss of ``trl.experimental.online_dpo`` on ``pairs``: its generation is replaced by the fixed batch (prompts
    repeated, first half chosen, second half rejected) and its reward function prefers the first half."""
    from trl.experimental.online_dpo import OnlineDPOConfig as TRLConfig
    from trl.experimental.online_dpo import OnlineDPOTrainer as TRLTrainer

    prompts, chosen, chosen_mask, rejected, rejected_mask = pairs

    def first_half_wins(completions, **kwargs):
        return [1.0] * P + [0.0] * P

    args = TRLConfig(
        output_dir=str(output_dir),
        per_device_train_batch_size=P,
        beta=[BETA],
        loss_type=loss_type,
        report_to="none",
        max_new_tokens=COMPLETION_LEN,
        use_cpu=True,
        bf16=False,  # float32, as the comparison demands
    )
    dataset = toy_dataset(num_prompts=P)
    trainer = TRLTrainer(
        model, reference, reward_funcs=[first_half_wins], args=args, train_dataset=dataset, processing_class=tokenizer
    )

    def fixed_generation(model, prompt_texts, images=None):
        completions = torch.cat([chosen, rejected])
        return (
            prompts.repeat(2, 1),
            torch.ones(2 * P, PROMPT_LEN, dtype=torch.long),
            completions,
            torch.cat([chosen_mask, rejected_mask]),
            None,
        )

    trainer._generate = fixed_generation
    loss = trainer.training_step(trainer.model, {"prompt": list(dataset["prompt"])})
    return loss.item(), {key: values[-1] for key, values in trainer.stats.items() if values}


def trl_dpo_loss(model, reference, tokenizer, pairs, output_dir):
    """Loss of ``trl.DPOTrainer`` (sigmoid) on the same pairs, laid out as it expects: [chosen; rejected] rows of
    prompt + completion, right-padded, with a completion mask over the whole sequence."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    prompts, chosen, chosen_mask, rejected, rejected_mask = pairs
    dataset = Dataset.from_dict({"prompt": ["ab:"], "chosen": ["abc"], "rejected": ["xyz"]})
    args = DPOConfig(
        output_dir=str(output_dir), beta=BETA, loss_type=["sigmoid"], report_to="none", use_cpu=True, bf16=False
    )
    trainer = DPOTrainer(model, reference, args=args, train_dataset=dataset, processing_class=tokenizer)
    no_prompt = torch.zeros(P, PROMPT_LEN, dtype=torch.long)
    inputs = {
        "input_ids": torch.cat([torch.cat([prompts, chosen], 1), torch.cat([prompts, rejected], 1)]),
        "attention_mask": torch.cat(
            [torch.ones(2 * P, PROMPT_LEN, dtype=torch.long), torch.cat([chosen_mask, rejected_mask])], 1
        ),
        "completion_mask": torch.cat(
            [torch.cat([no_prompt, chosen_mask], 1), torch.cat([no_prompt, rejected_mask], 1)]
        ),
    }
    trainer.model.train()
    return trainer.compute_loss(trainer.model, inputs).item()


def steadyrl_loss(trainer, pairs):
    """steadyrl's loss on the same pairs, fed in sampling order with pair 1 sampled rejected-first, so the
    labelling step has to reorder it."""
    prompts, chosen, chosen_mask, rejected, rejected_mask = pairs
    rows, masks, scores = [], [], []
    for i in range(P):
        pair = [(chosen[i], chosen_mask[i], 1.0), (rejected[i], rejected_mask[i], 0.0)]
        for ids, mask, score in pair[::-1] if i == 1 else pair:
            rows.append(ids), masks.append(mask), scores.append(score)
    tokens = TokenBatch(
        prompt_ids=prompts.repeat_interleave(2, 0),
        prompt_mask=torch.ones(2 * P, PROMPT_LEN, dtype=torch.long),
        completion_ids=torch.stack(rows),
        completion_mask=torch.stack(masks),
    )
    with torch.no_grad():
        ref_logprobs = trainer.rollout_builder.reference_logprobs(tokens)
    rollout = Rollout(**vars(tokens), scores=torch.tensor(scores), ref_logprobs=ref_logprobs)
    rollout = rollout.with_advantages(trainer.algorithm.advantages(rollout))
    return trainer.algorithm.loss(trainer.model, rollout)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_loss_equals_trl_online_dpo_and_dpo_in_float32(tmp_path, loss_type):
    """Same toy policy (perturbed away from its reference), same reference, same pairs: same loss within 1e-5 of the
    loss's scale (~log 2)."""
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    pairs = fixed_pairs(tokenizer.pad_token_id)
    trainer = make_trainer(tmp_path, algorithm="online-dpo", beta=BETA, loss_type=loss_type)
    policy = trainer.model  # its reference copy is made; now move the policy away from it
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in policy.parameters():
            param.add_(0.01 * torch.randn(param.shape, generator=generator))
    loss, metrics = steadyrl_loss(trainer, pairs)

    reference = AutoModelForCausalLM.from_pretrained(toy_model_path())
    for name, param in reference.named_parameters():
        assert torch.equal(param, trainer.ref_model.get_parameter(name))
    trl_policy = AutoModelForCausalLM.from_pretrained(toy_model_path())
    trl_policy.load_state_dict(policy.state_dict())
    trl_loss, trl_metrics = trl_online_dpo_loss(trl_policy, reference, tokenizer, loss_type, pairs, tmp_path / "trl")
    assert_close_to_scale(loss.item(), trl_loss, scale=max(1.0, abs(trl_loss)), what="loss")
    for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies", "logps/chosen"):
        assert metrics[key] == pytest.approx(trl_metrics[key], abs=1e-5), key
    if loss_type == "sigmoid":  # TRL's DPOTrainer normalises IPO by length; its sigmoid loss is the same DPO loss
        dpo_loss = trl_dpo_loss(trl_policy, reference, tokenizer, pairs, tmp_path / "dpo")
        assert_close_to_scale(loss.item(), dpo_loss, scale=max(1.0, abs(dpo_loss)), what="DPOTrainer's loss")
    assert loss.item() != pytest.approx(torch.log(torch.tensor(2.0)).item(), abs=1e-3), "policy == reference"


@pytest.mark.parametrize("tie_rule", ["skip", "first"])
def test_pairs_are_ordered_chosen_first_and_ties_follow_the_tie_rule(tmp_path, tie_rule):
    scores = torch.tensor([0.2, 0.9, 0.5, 0.1, 0.3, 0.3, -1.0, 0.0])
    order = chosen_first_order(scores)
    assert order.tolist() == [1, 0, 2, 3, 4, 5, 7, 6]
    ties = pair_ties(scores)
    assert ties.tolist() == [False, False, True, False]
    tie_weight = 0.0 if tie_rule == "skip" else 1.0
    assert pair_weights(ties, tie_rule).tolist() == [1, 1, 1, 1, tie_weight, tie_weight, 1, 1]

    trainer = make_trainer(tmp_path, algorithm="online-dpo", tie_rule=tie_rule)
    ids = torch.arange(8).view(8, 1)  # row i is recognisable by its token id
    rollout = Rollout(ids, torch.ones_like(ids), ids, torch.ones_like(ids), scores, torch.zeros(8, 1))
    added = trainer.algorithm.advantages(rollout)
    labelled = rollout.with_advantages(added)
    assert rollout.completion_ids.flatten().tolist() == list(range(8)), "compute_advantages left its input alone"
    assert labelled.completion_ids.flatten().tolist() == [1, 0, 2, 3, 4, 5, 7, 6]
    assert labelled.scores.tolist() == pytest.approx([0.9, 0.2, 0.5, 0.1, 0.3, 0.3, 0.0, -1.0])
    assert labelled.pair_weight.tolist() == [1, 1, 1, 1, tie_weight, tie_weight, 1, 1]
    assert added.metrics["ties"] == 0.25


def test_beta_schedule_follows_the_epoch_of_each_rollout(tmp_path):
    trainer = make_trainer(tmp_path, algorithm="online-dpo", beta=[0.3, 0.2, 0.1], max_steps=20)
    betas = {}
    original = trainer.algorithm.loss

    def recording(model, batch):
        loss, metrics = original(model, batch)
        betas[trainer.state.global_step + 1] = metrics["beta"]
        return loss, metrics

    trainer.algorithm.loss = recording
    trainer.train()
    # 8 prompts, 4 per rollout, 4 steps per rollout: rollouts 1-2 are epoch 0, 3-4 epoch 1, 5 epoch 2
    assert [betas[s] for s in (1, 8, 9, 16, 17, 20)] == [0.3, 0.3, 0.2, 0.2, 0.1, 0.1]


def test_pairwise_judge_labels_the_pairs_and_trains(tmp_path):
    calls = []

    def prefers_more_prompt_letters(prompts, completion_pairs):
        calls.append((list(prompts), [list(pair) for pair in completion_pairs]))
        letters = [p.rstrip(":") for p in prompts]
        first = letters_reward([a for a, _ in completion_pairs], letters)
        second = letters_reward([b for _, b in completion_pairs], letters)
        return [int(b > a) for a, b in zip(first, second)]

    trainer = make_trainer(
        tmp_path, algorithm="online-dpo", reward_funcs=[], max_steps=4, judge=prefers_more_prompt_letters
    )
    trainer.train()
    assert trainer.state.global_step == 4 and len(calls) == 1
    prompts, pairs = calls[0]
    assert len(prompts) == 4 and all(len(pair) == 2 for pair in pairs)
    assert all(log["ties"] == 0 for log in trainer.state.log_history if "ties" in log)


def test_missing_eos_penalty_with_a_judge_ranks_eos_first_and_never_ties_a_preference(tmp_path):
    """A 0/1 judge with missing_eos_penalty=1.0 (the README's setting): the completion without EOS loses to the one
    with EOS; the judge decides between two with EOS or two without; no preference becomes a tie."""
    trainer = make_trainer(
        tmp_path, algorithm="online-dpo", reward_funcs=[], judge=lambda p, c: [0] * len(c), missing_eos_penalty=1.0
    )
    judged = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0])
    no_eos = torch.tensor([True, False, False, False, True, True, False, True])
    total = trainer.rewards.total(judged[:, None], no_eos)  # one score per completion
    order = chosen_first_order(total)
    assert order.tolist() == [1, 0, 3, 2, 4, 5, 6, 7]  # EOS beats the judge; the judge; the judge; EOS
    assert not pair_ties(total).any()
    plain = make_trainer(tmp_path / "scores", algorithm="online-dpo", missing_eos_penalty=1.0)
    assert torch.equal(plain.rewards.total(judged[:, None], no_eos), judged - no_eos.float())


@pytest.mark.parametrize(
    "answers, message",
    [
        ([0, 1, 2, 0], "returned 2 for pair 2"),
        ([0, -1, 1, 0], "returned -1 for pair 1"),
        ([0, 1, 0], "returned 3 answers for 4 completion pairs"),
        ([True, False, True, False], "returned True for pair 0"),
        (ZeroDivisionError("judge crashed"), "raised ZeroDivisionError: judge crashed"),
    ],
)
def test_bad_judge_answers_stop_the_run_before_any_step(tmp_path, answers, message):
    def judge(prompts, completion_pairs):
        if isinstance(answers, Exception):
            raise answers
        return answers

    trainer = make_trainer(tmp_path, algorithm="online-dpo", reward_funcs=[], judge=judge)
    with pytest.raises(JudgeError, match=message):
        trainer.train()
    assert trainer.state.global_step == 0
    assert not list(tmp_path.glob("checkpoint-*"))


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"beta": 0.0}, r"beta=0.0 is invalid: online DPO needs beta > 0"),
        ({"beta": -0.1}, r"beta=-0.1 is invalid"),
        ({"beta": [0.1, 0.0]}, r"beta=\[0.1, 0.0\] is invalid"),
        ({"beta": []}, r"beta=\[\] is invalid"),
        ({"n_samples_per_prompt": 4}, "n_samples_per_prompt=4 is invalid for online DPO"),
        ({"micro_train_batch_size": 1}, "micro_train_batch_size=1 is odd"),
        ({"loss_type": "hinge"}, "loss_type='hinge' is invalid: use one of sigmoid, ipo"),
        ({"tie_rule": "random"}, "tie_rule='random' is invalid"),
    ],
)
def test_bad_config_is_refused(tmp_path, overrides, message):
    settings = dict(rollout_batch_size=4, train_batch_size=4, micro_train_batch_size=2, micro_rollout_batch_size=8)
    with pytest.raises(ValueError, match=message):
        OnlineDPOConfig(output_dir=str(tmp_path), **{**settings, **overrides})


def test_judge_and_reward_funcs_together_are_refused(tmp_path):
    with pytest.raises(ValueError, match="Both judge and reward_funcs"):
        make_trainer(tmp_path, algorithm="online-dpo", judge=lambda prompts, pairs: [0] * len(pairs))
    with pytest.raises(TypeError, match="judge=42 is neither callable"):
        make_trainer(tmp_path, algorithm="online-dpo", reward_funcs=[], judge=42)


def test_missing_eos_penalty_decides_otherwise_equal_pairs(tmp_path):
    """With a constant reward, a completion that ends without EOS loses to one with EOS; two alike tie."""

    def constant(completions, **kwargs):
        return [0.0] * len(completions)

    trainer = make_trainer(
        tmp_path,
        algorithm="online-dpo",
        reward_funcs=[constant],
        missing_eos_penalty=1.0,
        rollout_batch_size=8,
        micro_rollout_batch_size=16,
        train_batch_size=16,
        micro_train_batch_size=16,
        max_completion_length=6,
    )
    rollout = trainer.make_rollout_buffer().rollout
    eos = trainer.processing_class.eos_token_id
    mask, ids = rollout.completion_mask, rollout.completion_ids
    ends_with_eos = ids.gather(1, (mask.sum(1) - 1).clamp(min=0)[:, None]).squeeze(1) == eos  # [N]
    chosen_eos, rejected_eos = ends_with_eos[0::2], ends_with_eos[1::2]
    mixed = chosen_eos != rejected_eos
    assert mixed.any() and (~mixed).any(), "the seeded rollout should hold both kinds of pairs"
    assert chosen_eos[mixed].all(), "a completion without EOS was chosen over one with EOS"
    assert rollout.pair_weight[0::2].tolist() == mixed.float().tolist()
