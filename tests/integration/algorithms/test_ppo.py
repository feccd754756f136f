"""PPOTrainer: critic initialisation, what is exported, and bad input refused before training."""

import pytest
import torch
from conftest import step_entries
from support.toy_run import make_config
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    Qwen2Config,
    Qwen2ForSequenceClassification,
)

from steadyrl import PPOConfig, PPOTrainer
from steadyrl.toy import build_tokenizer, letters_reward, toy_dataset, toy_reward_model_path


@pytest.fixture(scope="module")
def reward_model_path():
    return toy_reward_model_path()


def ppo_trainer(output_dir, toy_path, **kwargs):
    overrides = kwargs.pop("overrides", {})
    kwargs.setdefault("reward_funcs", [letters_reward])
    return PPOTrainer(
        model=toy_path, args=make_config(output_dir, "ppo", **overrides), train_dataset=toy_dataset(), **kwargs
    )


def test_critic_from_reward_model_holds_its_backbone_and_head_at_step_0(tmp_path, toy_path, reward_model_path):
    trainer = ppo_trainer(tmp_path, toy_path, reward_funcs=None, reward_model=reward_model_path)
    reward_model = AutoModelForSequenceClassification.from_pretrained(reward_model_path, num_labels=1)
    expected, critic = reward_model.state_dict(), trainer.critic.model.state_dict()
    assert set(critic) == set(expected) and any(name.startswith("score.") for name in critic)
    for name, tensor in expected.items():
        assert torch.equal(critic[name], tensor), f"critic {name} differs from the reward model's"

    trainer.args.max_steps = 2
    trainer.train()
    trained = trainer.critic.model.score.weight
    assert not torch.equal(trained, expected["score.weight"]), "the critic did not learn"
    assert torch.equal(trainer.reward_model.score.weight, expected["score.weight"]), "the reward model changed"


def test_critic_from_policy_has_policy_backbone_and_seeded_head(tmp_path, toy_path):
    first = ppo_trainer(tmp_path / "a", toy_path)
    second = ppo_trainer(tmp_path / "b", toy_path)
    policy = AutoModelForCausalLM.from_pretrained(toy_path)
    backbone = first.critic.model.model.state_dict()
    for name, tensor in policy.model.state_dict().items():
        assert torch.equal(backbone[name], tensor), name
    assert torch.equal(first.critic.model.score.weight, second.critic.model.score.weight)


def test_save_model_writes_the_actor_only(tmp_path, toy_path):
    trainer = ppo_trainer(tmp_path, toy_path, overrides={"max_steps": 1})
    trainer.train()
    trainer.save_model(str(tmp_path / "export"))
    names = {p.name for p in (tmp_path / "export").iterdir()}
    assert "model.safetensors" in names and not any("critic" in n or "optimizer" in n for n in names)
    actor = AutoModelForCausalLM.from_pretrained(tmp_path / "export")
    assert actor.config.architectures == ["Qwen2ForCausalLM"]
    assert torch.equal(actor.lm_head.weight, trainer.model.lm_head.weight)


def tiny_classifier(vocab_size: int, hidden_size: int = 64) -> Qwen2ForSequenceClassification:
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=0,
    )
    return Qwen2ForSequenceClassification(config)


def test_reward_model_with_another_vocabulary_is_refused(tmp_path, toy_path):
    with pytest.raises(ValueError, match=r"reward_model has vocab_size=100 but the policy has vocab_size=46"):
        ppo_trainer(tmp_path, toy_path, reward_model=tiny_classifier(100))


def test_reward_model_with_the_policys_tokenizer_and_a_padded_embedding_scores_the_policys_ids(tmp_path, toy_path):
    """As Qwen2.5's reward models (152,064 embedding rows for 151,665 tokens): given as a path whose tokenizer is the
    policy's, a reward model with more embedding rows than the policy is accepted and scores the policy's token ids
    as they are (not re-rendered), and a PPO step trains on its scores."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(toy_path)
    padded = tiny_classifier(len(tokenizer) + 18)
    padded.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    trainer = ppo_trainer(
        tmp_path / "run", toy_path, reward_funcs=None, reward_model=str(tmp_path / "rm"), overrides={"max_steps": 1}
    )
    scorer = trainer.reward_funcs[-1]
    assert scorer.tokenizer is None, "the policy's token ids must be scored as they are"
    trainer.train()
    assert trainer.state.global_step == 1


def test_reward_model_with_another_tokenizer_scores_text_and_the_critic_starts_from_the_policy(
    tmp_path, toy_path, reward_model_path, caplog
):
    other = build_tokenizer()
    other.add_tokens(["<extra>"])
    trainer = ppo_trainer(tmp_path, toy_path, reward_model=reward_model_path, reward_processing_class=other)
    assert trainer.reward_funcs[-1].tokenizer is other, "another vocabulary: the reward model reads re-rendered text"
    assert "The critic starts from the policy's backbone, not from a copy of reward_model" in caplog.text
    policy = trainer.model.model
    for name, param in policy.named_parameters():
        assert torch.equal(param, trainer.critic.model.model.get_parameter(name)), name


def test_value_model_with_a_head_of_another_hidden_size_is_refused(tmp_path, toy_path):
    value_model = tiny_classifier(46, hidden_size=64)
    value_model.score = torch.nn.Linear(128, 1, bias=False)
    with pytest.raises(ValueError, match="value_model's score head expects hidden size 128, but its backbone has"):
        ppo_trainer(tmp_path, toy_path, value_model=value_model)


def test_value_model_with_several_labels_is_refused(tmp_path, toy_path):
    value_model = tiny_classifier(46)
    value_model.score = torch.nn.Linear(64, 2, bias=False)
    with pytest.raises(ValueError, match="value_model has num_labels=2"):
        ppo_trainer(tmp_path, toy_path, value_model=value_model)


@pytest.mark.parametrize(
    "setting, message",
    [
        ({"gamma": 0.0}, r"gamma=0.0 is invalid: it must be in \(0, 1\]"),
        ({"gamma": 1.5}, r"gamma=1.5 is invalid"),
        ({"lam": -0.5}, r"lam=-0.5 is invalid: it must be in \(0, 1\]"),
        ({"cliprange_value": 0}, r"cliprange_value=0 is invalid: it must be > 0"),
        ({"kl_estimator": "k2"}, r"kl_estimator='k2' is invalid: use 'k1' or 'k3'"),
        ({"target_kl": -1.0}, r"target_kl=-1.0 is invalid"),
    ],
)
def test_bad_ppo_settings_are_refused_at_construction(tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(output_dir=str(tmp_path), rollout_batch_size=4, n_samples_per_prompt=2, train_batch_size=8, **setting)


def test_no_reward_at_all_is_refused(tmp_path, toy_path):
    with pytest.raises(ValueError, match="No reward source provided: pass reward_funcs"):
        ppo_trainer(tmp_path, toy_path, reward_funcs=None)


def test_memory_options_change_no_result(tmp_path, toy_path, reward_model_path):
    """Gradient checkpointing and offloading the reference / reward models trade memory, not results."""
    logs = []
    for name, options in [("plain", {}), ("saving", {"gradient_checkpointing": True, "ref_reward_offload": True})]:
        trainer = ppo_trainer(
            tmp_path / name, toy_path, reward_model=reward_model_path, overrides={"max_steps": 3, **options}
        )
        trainer.train()
        logs.append(step_entries(trainer.state.log_history))
    for plain, saving in zip(*logs):
        for key in ("loss", "policy_loss", "value_loss", "reward", "kl", "grad_norm", "critic_grad_norm"):
            assert saving[key] == pytest.approx(plain[key], rel=1e-5, abs=1e-6), key
