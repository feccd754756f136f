"""HF generate prefills each distinct prompt once and its rows (a group's samples) decode from that cache: the
completions, logits and samples equal one plain ``generate`` over every row, and the model sees each prompt once."""

from __future__ import annotations

import logging

import pytest
import torch

from steadyrl.generation import HFGenerationBackend, SamplingSettings
from steadyrl.generation import shared_prefill as sp
from steadyrl.generation.base import trim_completion
from steadyrl.generation.seeded_sampling import seeded_generation

NEW_TOKENS = 6


@pytest.fixture(autouse=True)
def fresh_log(monkeypatch):
    monkeypatch.setattr(sp, "_said", set())  # each fallback reason is said once per process


@pytest.fixture
def rows(tokenizer):
    """Three prompts of different lengths, G=3 each, duplicates out of order."""
    a, b, c = (tokenizer(text)["input_ids"] for text in ("abc:", "hello world:", "zq"))
    return [a, b, a, c, b, a, c, b, c]


def backend(tokenizer, **extra) -> HFGenerationBackend:
    return HFGenerationBackend(tokenizer, SamplingSettings(max_new_tokens=NEW_TOKENS, extra=extra))


def plain(model, tokenizer, rows, config, **kwargs):
    ids, mask = sp.left_pad(rows, tokenizer.pad_token_id, torch.device("cpu"))
    with torch.inference_mode():
        return ids.shape[1], model.generate(input_ids=ids, attention_mask=mask, generation_config=config, **kwargs)


def completions(output, width, eos):
    return [trim_completion(row, eos) for row in output[:, width:].tolist()]


def test_distinct_prompts_keep_first_appearance_order():
    assert sp.distinct_prompts([[1, 2], [3], [1, 2], [4], [3]]) == ([[1, 2], [3], [4]], [0, 1, 0, 2, 1])


def test_greedy_completions_equal_plain_generate(model, tokenizer, rows):
    hf = backend(tokenizer, do_sample=False)
    with torch.inference_mode():
        assert sp.prefilled_cache(model, hf.generation_config(), rows, tokenizer.pad_token_id) is not None
    shared = hf.generate(model, rows, seeds=[0] * len(rows)).completion_ids
    width, output = plain(model, tokenizer, rows, hf.generation_config())
    assert shared == completions(output, width, tokenizer.eos_token_id)
    assert len({tuple(shared[i]) for i in (0, 1, 3)}) == 3, "the three prompts should continue differently"


def test_logits_of_every_step_agree_with_plain_generate(model, tokenizer, rows):
    config = backend(tokenizer, do_sample=False).generation_config()
    scores = dict(output_logits=True, return_dict_in_generate=True)
    width, reference = plain(model, tokenizer, rows, config, **scores)
    ids, mask = sp.left_pad(rows, tokenizer.pad_token_id, torch.device("cpu"))
    with torch.inference_mode():
        cache = sp.prefilled_cache(model, config, rows, tokenizer.pad_token_id)
        assert cache is not None and cache.get_seq_length() == width - 1 and cache.layers[0].keys.shape[0] == len(rows)
        shared = model.generate(
            input_ids=ids, attention_mask=mask, generation_config=config, past_key_values=cache, **scores
        )
    assert torch.equal(shared.sequences, reference.sequences)
    assert len(shared.logits) == len(reference.logits) >= 1
    for step, (got, want) in enumerate(zip(shared.logits, reference.logits)):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=f"step {step}")


def test_the_model_sees_each_distinct_prompt_once(model, tokenizer, rows):
    counted = []
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda _, args: counted.append(args[0].numel()))
    hf = backend(tokenizer, do_sample=False, min_new_tokens=NEW_TOKENS)  # every row decodes NEW_TOKENS tokens
    try:
        hf.generate(model, rows, seeds=[0] * len(rows))
    finally:
        hook.remove()
    width, distinct = max(map(len, rows)), 3
    # the distinct prompts but their last token once; then every row's last prompt token and its decode steps
    assert counted[0] == distinct * (width - 1)
    assert sum(counted) == distinct * (width - 1) + len(rows) * NEW_TOKENS
    assert sum(counted) < len(rows) * width + len(rows) * (NEW_TOKENS - 1), "plain generate: every row's prompt"


def test_sampling_from_the_shared_cache_draws_as_plain_generate(model, tokenizer, rows):
    """Each row is drawn from its seed (seeded_sampling.py), from the shared cache as from a plain generate call."""
    hf, seeds = backend(tokenizer, do_sample=True, temperature=1.5), list(range(len(rows)))
    torch.manual_seed(7)
    first = hf.generate(model, rows, seeds).completion_ids
    torch.manual_seed(8)
    assert hf.generate(model, rows, seeds).completion_ids == first
    assert len({tuple(first[i]) for i in (0, 2, 5)}) > 1, "a group's rows are sampled independently"
    greedy, processors = seeded_generation(hf.generation_config(), seeds, torch.device("cpu"))
    width, output = plain(model, tokenizer, rows, greedy, logits_processor=processors)
    assert completions(output, width, tokenizer.eos_token_id) == first


def test_a_static_cache_falls_back_and_says_why(model, tokenizer, rows, caplog):
    hf = HFGenerationBackend(
        tokenizer,
        SamplingSettings(max_new_tokens=NEW_TOKENS, extra={"do_sample": False}, cache_implementation="static"),
    )
    with caplog.at_level(logging.INFO, logger=sp.__name__):
        shared = hf.generate(model, rows, seeds=[0] * len(rows)).completion_ids
        hf.generate(model, rows, seeds=[0] * len(rows))
    said = [r.getMessage() for r in caplog.records if r.name == sp.__name__]
    assert len(said) == 1 and "cache_implementation='static'" in said[0], said
    width, output = plain(model, tokenizer, rows, backend(tokenizer, do_sample=False).generation_config())
    assert shared == completions(output, width, tokenizer.eos_token_id)


def test_no_repeated_prompt_falls_back(model, tokenizer, rows, caplog):
    with caplog.at_level(logging.INFO, logger=sp.__name__):
        with torch.inference_mode():
            assert sp.prefilled_cache(model, backend(tokenizer).generation_config(), rows[:2], 0) is None
    assert "no prompt is repeated" in caplog.text


class RefusingGenerate(torch.nn.Module):
    """A wrapper whose ``generate`` takes no cache, as some wrapped models' do."""

    def __init__(self, inner):
        super().__init__()
        self.inner, self.generation_config = inner, inner.generation_config

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)

    def generate(self, input_ids, attention_mask, generation_config):
        return self.inner.generate(
            input_ids=input_ids, attention_mask=attention_mask, generation_config=generation_config
        )


def test_a_generate_that_refuses_the_cache_is_called_plainly_from_the_same_rng(model, tokenizer, rows, caplog):
    """It takes no logits processor either: it samples from the global RNG, as a plain generate call does."""
    hf, wrapped = backend(tokenizer, do_sample=True), RefusingGenerate(model)
    torch.manual_seed(11)
    with caplog.at_level(logging.INFO, logger=sp.__name__):
        first = hf.generate(wrapped, rows, seeds=[0] * len(rows)).completion_ids
    assert "RefusingGenerate.generate refused a prefilled cache" in caplog.text
    torch.manual_seed(11)
    width, output = plain(model, tokenizer, rows, hf.generation_config())
    assert first == completions(output, width, tokenizer.eos_token_id)
    with torch.inference_mode():  # not given a cache again
        assert sp.prefilled_cache(wrapped, hf.generation_config(), rows, tokenizer.pad_token_id) is None
