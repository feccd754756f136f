"""A reward model with a tokenizer of its own scores the completion's text re-rendered for it, as in TRL.

The reward model's tokenizer has the policy's tokens under permuted ids, and its embedding rows are permuted to
match: it is the same function of text as the original model, so its scores on re-rendered text must equal the
original model's scores on that text tokenized the policy's way. Its tokenizer is reward_processing_class, or the one
saved with it (at its path, or at the ``config._name_or_path`` of a model object, as TRL loads it).
"""

import copy
import logging

import pytest
import torch
from support.toy_run import make_trainer
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForSequenceClassification

from steadyrl.models.scalar_head import sequence_scores
from steadyrl.ops import pad_prompts_and_completions
from steadyrl.toy import toy_model_path


def permuted_tokenizer(tokenizer) -> tuple[PreTrainedTokenizerFast, list[int]]:
    """A character tokenizer with ``tokenizer``'s tokens in reverse id order, and the id map old -> new."""
    vocab = tokenizer.get_vocab()
    new_ids = {token: len(vocab) - 1 - i for token, i in vocab.items()}
    backend = Tokenizer(models.WordLevel(vocab=new_ids, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    special = {"eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"}
    permuted = PreTrainedTokenizerFast(tokenizer_object=backend, **special)
    return permuted, [new_ids[token] for token, _ in sorted(vocab.items(), key=lambda item: item[1])]


def classifier(vocab_size: int, **settings) -> Qwen2ForSequenceClassification:
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        **settings,
    )
    return Qwen2ForSequenceClassification(config).eval()


@pytest.fixture
def permuted_reward_model(tmp_path):
    """(the original model, the reward model, its directory with the permuted tokenizer saved beside it, that
    tokenizer as ``AutoTokenizer`` loads it from there, the id map)."""
    policy_tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    torch.manual_seed(0)
    original = classifier(len(policy_tokenizer), pad_token_id=policy_tokenizer.pad_token_id)
    reward_tokenizer, new_id = permuted_tokenizer(policy_tokenizer)
    reward_model = copy.deepcopy(original)
    with torch.no_grad():
        reward_model.model.embed_tokens.weight[new_id] = original.model.embed_tokens.weight.clone()
    reward_model.config.pad_token_id = reward_tokenizer.pad_token_id
    directory = tmp_path / "rm"
    reward_model.save_pretrained(directory)
    reward_tokenizer.save_pretrained(directory)
    return original, reward_model, directory, AutoTokenizer.from_pretrained(directory), new_id


def expected_text_scores(trainer, original, reward_tokenizer, new_id) -> tuple[torch.Tensor, torch.Tensor]:
    """One rollout's reward-model scores, and the original model's scores on the same texts tokenized by the reward
    tokenizer (one token per character: "mnu 5505" is 8 tokens, where the policy's tokenizer may merge " 5"), mapped
    back to the original model's ids and scored at their last token."""
    policy_tokenizer = trainer.processing_class
    rollout = trainer.make_rollout_buffer().rollout
    prompts = policy_tokenizer.batch_decode(
        [ids[mask.bool()] for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask)]
    )
    completions = policy_tokenizer.batch_decode(
        [ids[mask.bool()] for ids, mask in zip(rollout.completion_ids, rollout.completion_mask)],
        skip_special_tokens=True,
    )
    old_id = {new: old for old, new in enumerate(new_id)}
    texts = [[old_id[i] for i in reward_tokenizer(p)["input_ids"]] for p in prompts]
    answers = [[old_id[i] for i in reward_tokenizer(c)["input_ids"]] for c in completions]
    with torch.no_grad():
        expected = sequence_scores(original, *pad_prompts_and_completions(texts, answers, 0).values())
    return rollout.reward_scores[:, 0], expected


def test_reward_model_with_its_own_tokenizer_scores_the_text(tmp_path, permuted_reward_model):
    original, reward_model, _, reward_tokenizer, new_id = permuted_reward_model
    trainer = make_trainer(
        tmp_path / "run",
        reward_funcs=[],
        reward_model=reward_model,
        reward_processing_class=reward_tokenizer,
        n_samples_per_prompt=2,
    )
    assert trainer.reward_funcs[0].tokenizer is reward_tokenizer, "a different vocabulary takes the text path"
    torch.testing.assert_close(*expected_text_scores(trainer, original, reward_tokenizer, new_id), atol=1e-5, rtol=1e-5)


def test_a_reward_model_object_reads_text_with_the_tokenizer_saved_at_its_name_or_path(tmp_path, permuted_reward_model):
    """Without reward_processing_class, a reward model object's tokenizer is loaded from ``config._name_or_path`` as
    TRL does. Its vocabulary has the policy's size, so comparing sizes alone fed it the policy's ids: it read the
    policy's 'a' as another character."""
    original, _, directory, reward_tokenizer, new_id = permuted_reward_model
    loaded = Qwen2ForSequenceClassification.from_pretrained(directory)
    trainer = make_trainer(tmp_path / "run", reward_funcs=[], reward_model=loaded, n_samples_per_prompt=2)
    used = trainer.reward_funcs[0].tokenizer
    assert used is not None and used.get_vocab() == reward_tokenizer.get_vocab(), "its own tokenizer, from its path"
    policy_a = trainer.processing_class.convert_tokens_to_ids("a")
    assert used.convert_ids_to_tokens(policy_a) != "a", "the two tokenizers map 'a' to different ids"
    torch.testing.assert_close(*expected_text_scores(trainer, original, reward_tokenizer, new_id), atol=1e-5, rtol=1e-5)


def test_a_reward_model_without_a_saved_tokenizer_reads_the_policys_ids_and_says_so(tmp_path, caplog):
    """Where ``_name_or_path`` names no tokenizer (a model built from a config, a directory of weights alone), the
    reward model must have the policy's vocab_size; it is read on the policy's ids, and a warning says so."""
    policy_tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    classifier(len(policy_tokenizer)).save_pretrained(tmp_path / "weights-only")
    for reward_model in (classifier(len(policy_tokenizer)), str(tmp_path / "weights-only")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="steadyrl.models.loading"):
            trainer = make_trainer(tmp_path / "run", reward_funcs=[], reward_model=reward_model)
        assert trainer.reward_funcs[0].tokenizer is None, "the fast path, on the policy's token ids"
        assert "reward_model has no tokenizer of its own" in caplog.text and "reward_processing_class" in caplog.text


def test_a_saved_tokenizer_equal_to_the_policys_keeps_the_token_ids(tmp_path):
    """An equal tokenizer at ``_name_or_path``: the fast path, and its embedding may be padded past the tokenizer."""
    policy_tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    classifier(len(policy_tokenizer) + 18).save_pretrained(tmp_path / "rm")
    policy_tokenizer.save_pretrained(tmp_path / "rm")
    loaded = Qwen2ForSequenceClassification.from_pretrained(tmp_path / "rm")
    trainer = make_trainer(tmp_path / "run", reward_funcs=[], reward_model=loaded)
    assert trainer.reward_funcs[0].tokenizer is None


def test_reward_model_with_the_policys_tokenizer_keeps_the_token_ids(tmp_path):
    policy_tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    trainer = make_trainer(
        tmp_path,
        reward_funcs=[],
        reward_model=classifier(len(policy_tokenizer)),
        reward_processing_class=AutoTokenizer.from_pretrained(toy_model_path()),
    )
    assert trainer.reward_funcs[0].tokenizer is None, "an equal tokenizer keeps the fast path on the sampled ids"
