"""HF generate samples each completion from its own seed: a completion is the same whatever rows share its generate
call, in whatever order (how a rollout is split over processes and calls), and the draws follow the sampling settings
(temperature, top-k, top-p, min-p) as generate's own sampling does."""

from __future__ import annotations

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
