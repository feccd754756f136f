"""What TRL's fields do in the trainers: clip-higher, truncated completions out of the loss, reward clipping,
generation settings, loading settings, dropout, dataset order and columns, online DPO's reward_model_path."""

import pytest
import torch
from support.toy_run import make_config, make_trainer
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForSequenceClassification

from steadyrl import OnlineDPOTrainer, RLOOTrainer
from steadyrl.data.sampling import PromptSampler
from steadyrl.rollout import Rollout
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path


class FixedLogits(torch.nn.Module):
    """A two-token vocabulary model whose log-prob of token 1 at every completion position is ``logprobs``."""

    def __init__(self, logprobs):
        super().__init__()
        self.logprobs = logprobs

    def forward(self, input_ids, **kwargs):
        p = self.logprobs.exp()
        logits = torch.zeros(*input_ids.shape, 2)
        logits[:, -p.shape[1] - 1 : -1] = torch.stack([1 - p, p], dim=-1).log()
        return type("Out", (), {"logits": logits})()


def batch(new_ratio: list[float], advantages: list[float], eos_id: int, ended: list[bool]) -> tuple:
    """Two-token completions of token 1 (the second token is EOS where ``ended``), old log-prob log 0.4, and the
    model that gives them ratio ``new_ratio`` against it."""
    old = torch.log(torch.full((len(new_ratio), 2), 0.4))
    completion_ids = torch.tensor([[1, eos_id if e else 1] for e in ended])
    rollout = Rollout(
        prompt_ids=torch.zeros(len(new_ratio), 1, dtype=torch.long),
        prompt_mask=torch.ones(len(new_ratio), 1),
        completion_ids=completion_ids,
        completion_mask=torch.ones_like(completion_ids),
        scores=torch.zeros(len(ended)),
        ref_logprobs=old,
        old_logprobs=old,
        advantages=torch.tensor(advantages),
    )
    model = FixedLogits(old + torch.log(torch.tensor(new_ratio))[:, None])
    return model, rollout


def test_epsilon_high_and_masked_truncated_completions_shape_the_loss(tmp_path):
    trainer = make_trainer(tmp_path, epsilon=0.2, epsilon_high=0.28, mask_truncated_completions=True)
    eos = trainer.processing_class.eos_token_id
    # completion_ids of token 1 only make sense for FixedLogits' two-token vocabulary when EOS is 1 or 0 there;
    # the loss reads only log-probs and the EOS test, so any ids do
    model, rollout = batch([1.5, 1.5], [1.0, 1.0], eos, ended=[True, False])
    loss, metrics = trainer.algorithm.loss(model, rollout)
    # row 0 ended with EOS: ratio 1.5, A=+1 clipped at 1 + epsilon_high = 1.28; row 1 (no EOS) is left out
    torch.testing.assert_close(loss, torch.tensor(-1.28))
    assert metrics["clip_ratio"] == 1.0


def test_rloo_reward_clip_range_clips_the_scores_before_the_kl_penalty(tmp_path):
    trainer = make_trainer(tmp_path, reward_clip_range=[-1.0, 1.0], beta=0.0, n_samples_per_prompt=2)
    rollout = Rollout(
        prompt_ids=torch.zeros(2, 1, dtype=torch.long),
        prompt_mask=torch.ones(2, 1),
        completion_ids=torch.ones(2, 1),
        completion_mask=torch.ones(2, 1),
        scores=torch.tensor([5.0, -0.5]),
        ref_logprobs=torch.zeros(2, 1),
        old_logprobs=torch.zeros(2, 1),
    )
    added = trainer.algorithm.advantages(rollout)
    torch.testing.assert_close(added.advantages, torch.tensor([1.5, -1.5]))  # 1 - (-0.5) and back


def test_generation_settings_reach_transformers_generate(tmp_path):
    trainer = make_trainer(
        tmp_path,
        min_p=0.05,
        repetition_penalty=1.3,
        cache_implementation="static",
        generation_kwargs='{"no_repeat_ngram_size": 2}',
    )
    config = trainer.backend.generation_config()
    assert (config.min_p, config.repetition_penalty, config.cache_implementation) == (0.05, 1.3, "static")
    assert config.no_repeat_ngram_size == 2


def test_cache_implementation_with_vllm_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cache_implementation='static' is for transformers' generate"):
        make_trainer(tmp_path, use_vllm=True, cache_implementation="static")


def test_model_init_kwargs_load_the_policy_in_the_given_dtype(tmp_path):
    trainer = make_trainer(tmp_path, model_init_kwargs={"dtype": "bfloat16"}, allow_low_precision_weights=True)
    assert next(trainer.model.parameters()).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="dtype='bfloat17' is not a torch dtype"):
        make_trainer(tmp_path, model_init_kwargs={"dtype": "bfloat17"})


def test_disable_dropout_zeroes_every_dropout_layer_of_policy_and_reference(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=1, n_head=2, n_positions=64))
    with pytest.raises(ValueError, match="processing_class is required"):
        RLOOTrainer(model, args=make_config(tmp_path), train_dataset=toy_dataset(), reward_funcs=[letters_reward])
    trainer = RLOOTrainer(
        model,
        args=make_config(tmp_path, disable_dropout=True),
        train_dataset=toy_dataset(),
        processing_class=tokenizer,
        reward_funcs=[letters_reward],
    )
    layers = [m for net in (trainer.model, trainer.ref_model) for m in net.modules() if isinstance(m, torch.nn.Dropout)]
    assert layers and all(m.p == 0.0 for m in layers)


def test_unshuffled_prompts_come_in_dataset_order_every_epoch():
    sampler = PromptSampler(5, seed=0, shuffle=False)
    assert sampler.next(7) == [0, 1, 2, 3, 4, 0, 1]
    assert PromptSampler(5, seed=0).next(5) != [0, 1, 2, 3, 4], "the default shuffles"


def test_remove_unused_columns_passes_no_dataset_column_to_the_reward_functions(tmp_path):
    seen = []

    def recording(completions, **kwargs):
        seen.append(set(kwargs))
        return [0.0] * len(completions)

    make_trainer(tmp_path, reward_funcs=[recording], remove_unused_columns=True).make_rollout_buffer()
    always = {"prompts", "completion_ids", "trainer_state", "log_metric", "log_extra"}  # TRL's: never a column
    assert seen == [always]
    make_trainer(tmp_path, reward_funcs=[recording]).make_rollout_buffer()
    assert seen[-1] == always | {"letters"}


def test_online_dpo_loads_the_reward_model_from_reward_model_path(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
    )
    Qwen2ForSequenceClassification(config).save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    args = make_config(tmp_path / "out", "online-dpo", reward_model_path=str(tmp_path / "rm"))
    trainer = OnlineDPOTrainer(toy_model_path(), args=args, train_dataset=toy_dataset(num_prompts=8))
    assert trainer.reward_model is not None and trainer.reward_funcs[0].__name__ == "reward_model"
    with pytest.raises(ValueError, match="reward_model and args.reward_model_path"):
        OnlineDPOTrainer(
            toy_model_path(),
            args=args,
            train_dataset=toy_dataset(num_prompts=8),
            reward_model=str(tmp_path / "rm"),
            reward_funcs=[letters_reward],
        )
