"""A small reward model for the toy task, trained here (offline, ~2.5 min on 2 cores, once) and cached on disk.

It is a Qwen2 sequence classifier (``num_labels=1``) on the toy tokenizer, regressed onto
``letters_reward`` over synthetic completions that range from noise to pure prompt letters, so it
ranks the policy's completions like the rule does without being the rule. Like any learned reward
model it can be over-optimised: PPO against it finds completions it over-scores (runs of one common
letter), which is what the KL penalty and the held-out rule reward in the tests keep in check.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from ..cache import build_cached
from ..models.scalar_head import sequence_scores
from ..ops import pad_prompts_and_completions
from .task import CHARACTERS, COMPLETION_LENGTH, _fingerprint, build_tokenizer, letters_reward

REWARD_MODEL_CONFIG = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,  # head_dim 32
    num_key_value_heads=4,
    max_position_embeddings=256,
)
TRAIN_STEPS = 1500
RECIPE_VERSION = 6  # bump when the data or training changes, so caches rebuild
BATCH_SIZE = 64


def synthetic_examples(tokenizer, count: int, seed: int) -> tuple[list[str], list[list[int]], list[float]]:
    """Prompts, completion token ids and their ``letters_reward``.

    The share of prompt letters in a completion is uniform in [0, 1]; the other tokens are random, special
    tokens such as ``<unk>`` and ``<pad>`` included (the rule reward drops them when decoding, so they earn
    nothing), drawn from letters not in the prompt, the whole vocabulary, or a small per-example alphabet.
    Half the completions end with EOS.
    """
    rng = random.Random(seed)
    characters = [tokenizer.convert_tokens_to_ids(c) for c in CHARACTERS]
    specials = [i for i in tokenizer.all_special_ids if i != tokenizer.eos_token_id]  # <pad> can be sampled too
    prompts, completion_ids, targets = [], [], []
    for i in range(count):
        word = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6)))
        letters = [tokenizer.convert_tokens_to_ids(c) for c in word]
        others = [tokenizer.convert_tokens_to_ids(c) for c in string.ascii_lowercase if c not in word]
        noise = rng.choice(
            [
                others,  # hard negatives: letters, but not the prompt's
                characters + specials * 8,
                rng.sample(characters + specials, rng.randint(1, 3)),  # runs such as "jjjj" or "<unk><unk>"
            ]
        )
        share = rng.random()
        length = rng.randint(1, COMPLETION_LENGTH)
        ids = [rng.choice(letters) if rng.random() < share else rng.choice(noise) for _ in range(length)]
        targets += letters_reward([tokenizer.decode(ids, skip_special_tokens=True)], [word])
        prompts.append(f"{word}:")
        completion_ids.append(ids + [tokenizer.eos_token_id] * (i % 2))
    return prompts, completion_ids, targets


def train_reward_model(tokenizer, steps: int = TRAIN_STEPS, seed: int = 0):
    """Fit a fresh sequence classifier to ``letters_reward`` by mean squared error; return it in eval mode."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    config = Qwen2Config(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, num_labels=1, **REWARD_MODEL_CONFIG
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
        prompts, completion_ids, targets = synthetic_examples(tokenizer, steps * BATCH_SIZE, seed)
        prompt_ids, targets = tokenizer(prompts)["input_ids"], torch.tensor(targets)
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

    return build_cached(f"toy-reward-model-{_fingerprint()}-{RECIPE_VERSION}", build)
