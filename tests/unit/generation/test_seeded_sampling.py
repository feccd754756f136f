"""HF generate samples each completion from its own seed: a completion is the same whatever rows share its generate
call, in whatever order (how a rollout is split over processes and calls), and the draws follow the sampling settings
(temperature, top-k, top-p, min-p) as generate's own sampling does."""

from __future__ import annotations

import copy
import logging

import torch

from steadyrl.generation import HFGenerationBackend, SamplingSettings, seeded_sampling
from steadyrl.generation.seeded_sampling import SeededSampler, warpers_of


def generate(model, tokenizer, rows, seeds, **settings):
    backend = HFGenerationBackend(tokenizer, SamplingSettings(max_new_tokens=8, **settings))
    return backend.generate(model, rows, seeds).completion_ids


def test_a_completion_depends_on_its_seed_not_on_the_rows_beside_it(model, tokenizer):
    a, b, c = (tokenizer(text)["input_ids"] for text in ("abc:", "hello world:", "zq"))
    rows, seeds = [a, a, b, c, b, a], [11, 12, 13, 14, 15, 16]
    settings = dict(temperature=0.8, top_k=40, top_p=0.95)
    together = generate(model, tokenizer, rows, seeds, **settings)
    torch.manual_seed(123)  # the global RNG plays no part
    halves = generate(model, tokenizer, rows[:3], seeds[:3], **settings)
    halves += generate(model, tokenizer, rows[3:], seeds[3:], **settings)
    reversed_ = generate(model, tokenizer, rows[::-1], seeds[::-1], **settings)[::-1]
    assert together == halves == reversed_
    assert len({tuple(ids) for ids in together[:2]}) == 2  # one prompt, two seeds: two different completions


def test_each_draw_follows_the_warped_distribution():
    """1,000 rows from one distribution: top-k and top-p leave the same tokens possible as transformers' warpers,
    and the drawn frequencies match the warped probabilities."""
    from transformers import GenerationConfig

    torch.manual_seed(0)
    scores = torch.randn(1, 12).repeat(4000, 1)
    config = GenerationConfig(do_sample=True, temperature=0.7, top_k=6, top_p=0.9)
    warped = scores
    for warper in warpers_of(config):
        warped = warper(None, warped)
    expected = torch.softmax(warped[0], -1)
    sampler = SeededSampler(list(range(4000)), warpers_of(config), torch.device("cpu"))
    picked = sampler(None, scores.clone()).argmax(-1)
    counts = torch.bincount(picked, minlength=12).float() / 4000
    assert set(picked.tolist()) <= set(torch.nonzero(expected).flatten().tolist())
    assert (counts - expected).abs().max() < 0.03


def test_settings_it_cannot_reproduce_keep_generates_own_sampling(model, tokenizer, caplog, monkeypatch):
    monkeypatch.setattr(seeded_sampling, "_said", set())
    rows = [tokenizer("abc:")["input_ids"]] * 2
    with caplog.at_level(logging.WARNING, logger="steadyrl.generation.seeded_sampling"):
        out = generate(model, tokenizer, rows, [1, 2], extra={"typical_p": 0.5})
    assert len(out) == 2
    assert "typical_p" in caplog.text and "global RNG" in caplog.text


def test_repetition_penalty_reads_a_rows_own_tokens_not_the_left_padding_beside_it(model, tokenizer, monkeypatch):
    """vLLM penalises the prompt's and the completion's tokens; transformers' processor also penalised the pad ids
    before a shorter prompt, and pad is EOS when a tokenizer has no pad token: a row's logits then depended on the
    longer prompts beside it (its first EOS logit -2.786 alone, -4.179 left-padded, with penalty 1.5)."""
    eos_pad = copy.deepcopy(tokenizer)
    eos_pad.pad_token = eos_pad.eos_token  # as load_policy sets it for a tokenizer without a pad token
    short, long_ = eos_pad("ab:")["input_ids"], eos_pad("hello world, a longer prompt:")["input_ids"]
    seen = []  # [B, V] per step: the scores each draw is made from, the logits after the penalty (no warper is set)
    draw = SeededSampler.__call__
    monkeypatch.setattr(
        SeededSampler, "__call__", lambda self, ids, scores: seen.append(scores.clone()) or draw(self, ids, scores)
    )
    seeds, alone, alone_scores = [0, 1, 2, 3], [], []
    for seed in seeds:
        seen.clear()
        alone += generate(model, eos_pad, [short], [seed], repetition_penalty=1.5)
        alone_scores.append([step[0] for step in seen])
    seen.clear()
    padded = generate(model, eos_pad, [long_] * 4 + [short] * 4, seeds * 2, repetition_penalty=1.5)[4:]
    assert padded == alone
    # float32 rounding of a padded, prefix-shared batch against a lone row: ~1e-5 on logits of a few units; the
    # penalty on a pad id moves its logit by a third of itself (1.39 on EOS's first)
    for row, (completion, scores) in enumerate(zip(alone, alone_scores)):
        for step in range(len(completion)):
            torch.testing.assert_close(seen[step][4 + row], scores[step], atol=1e-4, rtol=1e-4, msg=f"{row=} {step=}")
