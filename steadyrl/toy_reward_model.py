"""A small reward model for the toy task, trained here (offline, ~20 s on 2 cores) and cached on disk.

It is a Qwen2 sequence classifier (``num_labels=1``) on the toy tokenizer, regressed onto
``letters_reward`` over synthetic completions that range from random characters to pure prompt
letters, so it ranks the policy's completions like the rule does without being the rule.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from .toy import CHARACTERS, COMPLETION_LENGTH, _fingerprint, build_cached, build_tokenizer, letters_reward

REWARD_MODEL_CONFIG = dict(
    hidden_size=128,
    intermediate_size=384,
    num_hidden_layers=2,
    num_attention_heads=4,  # head_dim 32
    num_key_value_heads=2,
    max_position_embeddings=256,
)
TRAIN_STEPS = 600
BATCH_SIZE = 64


def synthetic_examples(count: int, seed: int) -> tuple[list[str], list[str]]:
    """(prompt, completion) pairs whose share of prompt letters is uniform in [0, 1]."""
    rng = random.Random(seed)
    prompts, completions = [], []
    for _ in range(count):
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6)))
        share = rng.random()
        length = rng.randint(1, COMPLETION_LENGTH)
        chars = [rng.choice(word) if rng.random() < share else rng.choice(CHARACTERS) for _ in range(length)]
        prompts.append(f"{word}:")
        completions.append("".join(chars))
    return prompts, completions


def train_reward_model(tokenizer, steps: int = TRAIN_STEPS, seed: int = 0):
    """Fit a fresh sequence classifier to ``letters_reward`` by mean squared error; return it in eval mode."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from .ops import pad_prompts_and_completions
    from .scalar_head import sequence_scores

    config = Qwen2Config(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, num_labels=1, **REWARD_MODEL_CONFIG
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
        prompts, completions = synthetic_examples(steps * BATCH_SIZE, seed)
        targets = torch.tensor(letters_reward(completions, [p[:-1] for p in prompts]))
        prompt_ids = tokenizer(prompts)["input_ids"]
        eos = [tokenizer.eos_token_id]
        completion_ids = [ids + eos * (i % 2) for i, ids in enumerate(tokenizer(completions)["input_ids"])]
        for step in range(steps):
            rows = slice(step * BATCH_SIZE, (step + 1) * BATCH_SIZE)
            batch = pad_prompts_and_completions(prompt_ids[rows], completion_ids[rows], tokenizer.pad_token_id)
            loss = torch.nn.functional.mse_loss(sequence_scores(model, *batch.values()), targets[rows])
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
    return model.eval()


def toy_reward_model_path() -> str:
    """Train the toy reward model once and cache it (with the toy tokenizer); return its directory."""

    def build(directory: Path) -> None:
        tokenizer = build_tokenizer()
        train_reward_model(tokenizer).save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    return build_cached(f"toy-reward-model-{_fingerprint()}-{TRAIN_STEPS}", build)
