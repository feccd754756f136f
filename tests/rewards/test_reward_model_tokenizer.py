"""A reward model with a tokenizer of its own scores the completion's text re-rendered for it, as in TRL.

The reward model's tokenizer has the policy's tokens under permuted ids, and its embedding rows are permuted to
match: it is the same function of text as the original model, so its scores on re-rendered text must equal the
original model's scores on that text tokenized the policy's way.
"""

import copy

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


def test_reward_model_with_its_own_tokenizer_scores_the_text(tmp_path):
    policy_tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    config = Qwen2Config(
        vocab_size=len(policy_tokenizer),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
        pad_token_id=policy_tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    original = Qwen2ForSequenceClassification(config).eval()
    reward_tokenizer, new_id = permuted_tokenizer(policy_tokenizer)
    reward_model = copy.deepcopy(original)
    with torch.no_grad():
        reward_model.model.embed_tokens.weight[new_id] = original.model.embed_tokens.weight.clone()
    reward_model.config.pad_token_id = reward_tokenizer.pad_token_id

    trainer = make_trainer(
        tmp_path,
        reward_funcs=[],
        reward_model=reward_model,
        reward_processing_class=reward_tokenizer,
        n_samples_per_prompt=2,
    )
    assert trainer.reward_funcs[0].tokenizer is reward_tokenizer, "a different vocabulary takes the text path"
    rollout = trainer.make_rollout().rollout
    prompts = policy_tokenizer.batch_decode(
        [ids[mask.bool()] for ids, mask in zip(rollout.prompt_ids, rollout.prompt_mask)]
    )
    completions = policy_tokenizer.batch_decode(
        [ids[mask.bool()] for ids, mask in zip(rollout.completion_ids, rollout.completion_mask)],
        skip_special_tokens=True,
    )
    # the text as the reward tokenizer reads it (one token per character: "mnu 5505" is 8 tokens, where the policy's
    # tokenizer may merge " 5"), mapped back to the original model's ids and scored by it at its last token
    old_id = {new: old for old, new in enumerate(new_id)}
    texts = [[old_id[i] for i in reward_tokenizer(p)["input_ids"]] for p in prompts]
    answers = [[old_id[i] for i in reward_tokenizer(c)["input_ids"]] for c in completions]
    with torch.no_grad():
        expected = sequence_scores(original, *pad_prompts_and_completions(texts, answers, 0).values())
    torch.testing.assert_close(rollout.reward_scores[:, 0], expected, atol=1e-5, rtol=1e-5)


def test_reward_model_with_the_policys_tokenizer_keeps_the_token_ids(tmp_path):
    policy_tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    config = Qwen2Config(
        vocab_size=len(policy_tokenizer),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_labels=1,
    )
    trainer = make_trainer(
        tmp_path,
        reward_funcs=[],
        reward_model=Qwen2ForSequenceClassification(config),
        reward_processing_class=AutoTokenizer.from_pretrained(toy_model_path()),
    )
    assert trainer.reward_funcs[0].tokenizer is None, "an equal tokenizer keeps the fast path on the sampled ids"
