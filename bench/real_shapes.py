"""Models, data and rewards for benchmarks at the shapes users run, built offline and cached (steadyrl.toy's cache).

- ``small100``: Qwen2, hidden 128, 2 layers, the chat fixture's 100-token character vocabulary, random weights (so
  completions run to their full length); prompts: the toy task's.
- ``qwen-vocab``: Qwen2, hidden 64, 2 layers, a word-level vocabulary of 151,936 tokens as Qwen2.5's: the LM head
  and the [batch, tokens, vocabulary] logits dominate, as in real models; prompts of ``--prompt_length`` words.
- ``qwen05b-shape``: Qwen2.5-0.5B's shape (hidden 896, 24 layers, 494M parameters) with ``qwen-vocab``'s tokenizer,
  random weights: for memory at a real model's size.
- ``smollm2``: the real pretrained SmolLM2-135M-Instruct (``steadyrl.real``) on the arithmetic task, with the
  ``correct_answer`` reward.
- ``smollm2-shape``: SmolLM2-135M-Instruct's architecture and tokenizer with random weights, on the same task, for
  machines that cannot install the model package (the GPU machine): its config and tokenizer come from the directory
  ``$STEADYRL_SMOLLM2_SPEC`` (``write_smollm2_spec``) or else from the installed model.

``phase_timers(library)`` instruments a trainer class so each round reports the seconds spent generating, scoring
(the rest of making a rollout: tokenizing, reward functions, log-prob passes) and training (forward and backward
of the optimizer steps).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

QWEN_VOCAB = 151_936
SPECIALS = ["<pad>", "<unk>", "<eos>"]
PHASES = {"generate_s": 0.0, "rollout_s": 0.0, "train_s": 0.0}


def qwen_vocab_tokenizer():
    """A word-level tokenizer with Qwen2.5's vocabulary size: tokens ``w0`` ... separated by spaces."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + [f"w{i}" for i in range(QWEN_VOCAB - len(SPECIALS))])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, eos_token="<eos>", pad_token="<pad>", unk_token="<unk>", padding_side="left"
    )


def build(name: str, tokenizer, **shape) -> str:
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from steadyrl.cache import build_cached

    def write(directory: Path) -> None:
        import torch

        config = Qwen2Config(
            vocab_size=len(tokenizer),
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
            **shape,
        )
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(config)
        model.generation_config = GenerationConfig(
            eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    return build_cached(name, write)


def small100_path() -> str:
    from steadyrl.toy import build_chat_tokenizer

    shape = dict(
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
    )
    return build("bench-small100-v1", build_chat_tokenizer(), **shape)


def qwen_vocab_path() -> str:
    shape = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=1024,
    )
    return build("bench-qwen-vocab-v1", qwen_vocab_tokenizer(), **shape)


def qwen05b_shape_path() -> str:
    """Random weights in Qwen2.5-0.5B's shape (494M parameters, 24 layers, hidden 896, tied 151,936-token head)."""
    shape = dict(
        hidden_size=896,
        intermediate_size=4864,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        max_position_embeddings=4096,
    )
    return build("bench-qwen05b-shape-v1", qwen_vocab_tokenizer(), **shape)


def write_smollm2_spec(directory: str) -> None:
    """SmolLM2-135M-Instruct's config, generation config and tokenizer, without its weights, into ``directory``."""
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from steadyrl.real import smollm2_path

    source = smollm2_path()
    AutoConfig.from_pretrained(source).save_pretrained(directory)
    GenerationConfig.from_pretrained(source).save_pretrained(directory)
    AutoTokenizer.from_pretrained(source).save_pretrained(directory)


def smollm2_shape_path() -> str:
    """SmolLM2-135M-Instruct's architecture and tokenizer with random weights (seeded), built once into the cache."""
    import os

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from steadyrl.cache import build_cached

    spec = os.environ.get("STEADYRL_SMOLLM2_SPEC")
    if spec is None:
        from steadyrl.real import smollm2_path

        spec = smollm2_path()

    def write(directory: Path) -> None:
        import torch

        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(spec), dtype=torch.float32)
        model.generation_config = GenerationConfig.from_pretrained(spec)
        model.save_pretrained(directory)
        AutoTokenizer.from_pretrained(spec).save_pretrained(directory)

    return build_cached("bench-smollm2-shape-v1", write)


def load_tokenizer(model_path: str):
    """The model's own tokenizer (AutoTokenizer would read the word-level one as Qwen2's byte-level BPE)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if "qwen-vocab" in model_path or "qwen05b" in model_path:
        return PreTrainedTokenizerFast.from_pretrained(model_path)
    return AutoTokenizer.from_pretrained(model_path)


def word_prompts(num_prompts: int, length: int, seed: int = 0):
    """Prompts of ``length`` random words of the word-level vocabulary, as a ``datasets.Dataset``."""
    from datasets import Dataset

    rng = random.Random(seed)
    prompts = [
        " ".join(f"w{rng.randrange(QWEN_VOCAB - len(SPECIALS))}" for _ in range(length)) for _ in range(num_prompts)
    ]
    return Dataset.from_dict({"prompt": prompts})


CONTEXT_WORDS = (
    "the ledger lists each delivery by date and weight while the clerk notes which crates arrived late and which "
    "driver signed for them before the market opened on a cold morning in the old harbour town near the river"
).split()


def arithmetic_with_context(prompt_tokens: int, seed: int = 0):
    """The arithmetic task with a passage of plain words before each question, so that a SmolLM2 chat prompt is
    about ``prompt_tokens`` tokens long (the template and question take ~40; a word is ~1 token), asking for the
    reasoning first: long prompts (retrieval, tool output) and completions of varied length."""
    from datasets import Dataset

    from steadyrl.real import arithmetic_dataset

    rng = random.Random(seed)
    base = arithmetic_dataset()
    words = max(0, prompt_tokens - 40)
    prompts = []
    for row in base["prompt"]:
        passage = " ".join(rng.choice(CONTEXT_WORDS) for _ in range(words))
        question = f"{passage}\n\n{row[0]['content']} Think it through step by step, then give the number."
        prompts.append([{"role": "user", "content": question}])
    return Dataset.from_dict({"prompt": prompts, "answer": base["answer"]})


def word_overlap(prompts, completions, **kwargs) -> list[float]:
    """The share of a completion's words that are in its prompt."""
    return [sum(w in set(p.split()) for w in c.split()) / max(1, len(c.split())) for p, c in zip(prompts, completions)]


def task(model: str, prompt_length: int):
    """``(model path, train_dataset, reward function)`` of a benchmark model name."""
    from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

    if model == "smollm2":
        from steadyrl.real import arithmetic_dataset, correct_answer, smollm2_path

        return smollm2_path(), arithmetic_dataset(), correct_answer
    if model == "smollm2-context":
        from steadyrl.real import correct_answer, smollm2_path

        return smollm2_path(), arithmetic_with_context(prompt_length), correct_answer
    if model == "smollm2-shape":
        from steadyrl.real import arithmetic_dataset, correct_answer

        return smollm2_shape_path(), arithmetic_dataset(), correct_answer
    if model == "qwen-vocab":
        return qwen_vocab_path(), word_prompts(512, prompt_length), word_overlap
    if model == "small100":
        return small100_path(), toy_dataset(), letters_reward
    if model == "25m":
        from vllm_vs_hf import model_25m_path

        return model_25m_path(), toy_dataset(), letters_reward
    return toy_model_path(), toy_dataset(), letters_reward


def _timed(cls, method: str, phase: str) -> None:
    original = getattr(cls, method)

    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            PHASES[phase] += time.perf_counter() - start

    setattr(cls, method, timed)


def phase_timers(library: str) -> None:
    """Time rollout making and training in either library (generation is timed inside the engine's generate)."""
    if library.startswith("steadyrl"):
        from steadyrl.trainers import OnPolicyTrainer

        _timed(OnPolicyTrainer, "make_rollout_buffer", "rollout_s")
        _timed(OnPolicyTrainer, "train_on_minibatch", "train_s")
        return
    from trl import GRPOTrainer, RLOOTrainer

    # TRL makes its rollouts inside _prepare_inputs, which training_step calls: train = training_step - rollout
    for trainer_class in (RLOOTrainer, GRPOTrainer):
        _timed(trainer_class, "_prepare_inputs", "rollout_s")
        _timed(trainer_class, "training_step", "train_s")


def phase_shares(report: dict, library: str) -> dict[str, float]:
    """Seconds of a round in generation, scoring (rollout minus generation) and training."""
    rollout, train = report["rollout_s"], report["train_s"]
    if library == "trl":
        train -= rollout
    return {"gen": report["seconds"], "score": rollout - report["seconds"], "train": train}
