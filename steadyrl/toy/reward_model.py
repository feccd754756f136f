"""A small reward model for the toy task, trained here (offline, about 30 s on 2 cores, once) and cached on disk.

It is a Qwen2 sequence classifier (``num_labels=1``) on the toy tokenizer, regressed onto ``letters_reward`` over
synthetic completions that range from noise to pure prompt letters, so it ranks the policy's completions like the
rule does without being the rule. While it trains, a second linear head (dropped afterwards) learns from the same
last hidden states which completion tokens are letters of the prompt's word: that per-token signal teaches the
backbone the membership the reward counts far sooner than one score per sequence does, so 400 steps suffice
(correlation 0.96 with the rule on 1,024 held-out synthetic completions) where 1,500 steps without it took ~3 min.
Like any learned reward model it can still be over-optimised, which is what the KL penalty and the held-out rule
reward in the tests keep in check.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

from ..cache import build_cached
from ..ops import joined_inputs, pad_prompts_and_completions
from .task import CHARACTERS, COMPLETION_LENGTH, _fingerprint, build_tokenizer, letters_reward

REWARD_MODEL_CONFIG = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=8,  # head_dim 32
    num_key_value_heads=4,
    max_position_embeddings=256,
)
TRAIN_STEPS = 400
RECIPE_VERSION = 7  # bump when the data or training changes, so caches rebuild
BATCH_SIZE = 64
LEARNING_RATE = 1e-3
MEMBERSHIP_WEIGHT = 0.3  # of the per-token membership loss (binary cross-entropy) beside the score's squared error


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


def letter_membership(tokenizer, prompts: list[str], completion_ids: list[list[int]]) -> list[list[float]]:
    """Per completion token: 1.0 where it is a letter of its prompt's word (a character ``letters_reward`` counts),
    else 0.0 (other characters, special tokens, EOS)."""
    special = set(tokenizer.all_special_ids)
    characters = dict(enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))))
    return [
        [float(i not in special and characters[i] in prompt.removesuffix(":")) for i in ids]
        for prompt, ids in zip(prompts, completion_ids)
    ]


def train_reward_model(tokenizer, steps: int = TRAIN_STEPS, seed: int = 0):
    """Fit a fresh sequence classifier to ``letters_reward`` by mean squared error, with the per-token membership
    loss of a training-only head (``MEMBERSHIP_WEIGHT``); return it in eval mode."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    config = Qwen2Config(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, num_labels=1, **REWARD_MODEL_CONFIG
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForSequenceClassification(config)
        membership_head = torch.nn.Linear(config.hidden_size, 1)
        parameters = [*model.parameters(), *membership_head.parameters()]
        optimizer = torch.optim.AdamW(parameters, lr=LEARNING_RATE)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / steps)
        prompts, completion_ids, targets = synthetic_examples(tokenizer, steps * BATCH_SIZE, seed)
        membership = letter_membership(tokenizer, prompts, completion_ids)
        prompt_ids, targets = tokenizer(prompts)["input_ids"], torch.tensor(targets)
        for step in range(steps):
            rows = slice(step * BATCH_SIZE, (step + 1) * BATCH_SIZE)
            batch = pad_prompts_and_completions(prompt_ids[rows], completion_ids[rows], tokenizer.pad_token_id)
            # sequence_scores' computation, keeping the hidden states for the membership head
            hidden = model.model(**joined_inputs(*batch.values()), use_cache=False).last_hidden_state
            prompt_width, completion_mask = batch["prompt_ids"].shape[1], batch["completion_mask"]
            last = prompt_width - 1 + completion_mask.sum(1)
            scores = model.score(hidden).squeeze(-1).gather(1, last.unsqueeze(1)).squeeze(1)
            letters = torch.zeros(completion_mask.shape)
            for row, values in enumerate(membership[rows]):
                letters[row, : len(values)] = torch.tensor(values)
            mask = completion_mask.bool()
            logits = membership_head(hidden[:, prompt_width:]).squeeze(-1)
            loss = torch.nn.functional.mse_loss(scores, targets[rows])
            loss = loss + MEMBERSHIP_WEIGHT * torch.nn.functional.binary_cross_entropy_with_logits(
                logits[mask], letters[mask]
            )
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
