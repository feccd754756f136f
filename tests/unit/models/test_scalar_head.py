"""Models with a scalar head (steadyrl/models/scalar_head.py) on a tiny Qwen2: the PPO critic made from the policy
(its backbone's weights, a seeded head, the run's random stream untouched), its value of each completion token's
state, and a reward or value model with the wrong head refused."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from steadyrl.models.scalar_head import Critic, critic_from_policy, load_scalar_model, sequence_scores
from steadyrl.toy import build_model, build_tokenizer

SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1)


@pytest.fixture(scope="module")
def policy():
    return build_model(build_tokenizer(), seed=0, **SMALL)


def test_the_critic_starts_from_the_policys_backbone_with_a_seeded_head(policy):
    critic = critic_from_policy(policy, seed=5)
    for name, weight in policy.model.state_dict().items():
        assert torch.equal(critic.model.state_dict()[name], weight), name
    assert critic.score.out_features == 1
    assert torch.equal(critic_from_policy(policy, seed=5).score.weight, critic.score.weight)
    assert not torch.equal(critic_from_policy(policy, seed=6).score.weight, critic.score.weight)


def test_the_random_stream_is_where_it_was_after_making_a_critic(policy):
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    critic_from_policy(policy, seed=5)
    assert torch.equal(torch.rand(3), expected)


def test_a_tokens_value_is_the_score_of_the_sequence_before_it(policy):
    """V(s_t) for completion token t reads the state just before it: the score of prompt + completion[:t]."""
    critic = critic_from_policy(policy, seed=1)
    prompt, completion = torch.tensor([[5, 6, 7]]), torch.tensor([[8, 9, 10, 11]])
    ones = torch.ones_like(prompt), torch.ones_like(completion)
    values = Critic(critic)(prompt, ones[0], completion, ones[1])
    assert values.shape == (1, 4) and values.dtype == torch.float32
    for t in range(4):
        prefix = torch.tensor([[1] * t + [0] * (4 - t)])
        score = sequence_scores(critic, prompt, ones[0], completion, prefix)
        torch.testing.assert_close(values[:, t], score)


def test_a_model_with_the_wrong_head_is_refused(policy):
    two_labels = AutoModelForSequenceClassification.from_config(
        policy.config.__class__(**SMALL, vocab_size=64, num_labels=2)
    )
    with pytest.raises(ValueError, match="value_model has num_labels=2; a reward or value model needs num_labels=1"):
        load_scalar_model(two_labels, "value_model")
    with pytest.raises(ValueError, match="reward_model must be an AutoModelForSequenceClassification"):
        load_scalar_model(policy, "reward_model")
