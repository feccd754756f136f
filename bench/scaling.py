"""How steadyrl RLOO's step time grows with the completion length and the rollout size (toy model, HF generate).

    python bench/scaling.py [--rounds 4] [--warmup 1] [--lengths 64,128,256] [--sizes 8,16,32,64] [--suppress_eos]

Two sweeps on the toy model: max completion length 64 -> 128 -> 256 at 32 sequences per rollout, and rollout size
8 -> 16 -> 32 -> 64 sequences (4 samples per prompt) at length 128. Every configuration is its own RLOO trainer
(train_batch_size 8 = micro batch, one epoch, so a rollout of N sequences is N/8 optimizer steps; the whole rollout is
generated in one ``generate`` call); they take turns, one iteration each per round (``iterate`` of
bench/vllm_vs_hf.py: rollout, then its optimizer steps), and medians over the rounds after the warm-up are reported.

The toy model is randomly initialised and samples EOS about once in 46 tokens, so completions stop early (mean ~40
tokens) whatever the limit; HF generate still runs each batch until its longest row stops. steadyrl has no setting to
suppress EOS, so ``--suppress_eos`` patches the HF backend's GenerationConfig here (``suppress_tokens=[eos]``) to make
every completion run to the limit: the worst case, where step time follows the limit.
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

import torch  # noqa: E402
from vllm_vs_hf import iterate  # noqa: E402

from steadyrl import RLOOConfig, RLOOTrainer  # noqa: E402
from steadyrl.generation.hf import HFGenerationBackend  # noqa: E402
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path  # noqa: E402


def suppress_eos() -> None:
    config = HFGenerationBackend.generation_config

    def without_eos(self):
        generation_config = config(self)
        generation_config.suppress_tokens = [self.tokenizer.eos_token_id]
        return generation_config

    HFGenerationBackend.generation_config = without_eos


def make_trainer(sequences: int, length: int, output_dir: str) -> RLOOTrainer:
    args = RLOOConfig(
        output_dir=output_dir,
        rollout_batch_size=sequences // 4,
        n_samples_per_prompt=4,
        micro_rollout_batch_size=sequences,
        train_batch_size=8,
        micro_train_batch_size=8,
        num_ppo_epochs=1,
        max_completion_length=length,
        learning_rate=1e-5,
        seed=0,
        report_to="none",
        disable_tqdm=True,
        save_steps=10**9,
    )
    return RLOOTrainer(toy_model_path(), args=args, train_dataset=toy_dataset(), reward_funcs=[letters_reward])


def measure(trainer: RLOOTrainer) -> dict[str, float]:
    cpu = time.process_time()
    row = iterate(trainer)
    row["cpu_iteration_s"] = time.process_time() - cpu
    lengths = trainer.training_buffer.buffer.rollout.completion_mask.sum(1)
    row["max_length"] = lengths.max().item()
    row["generation_s"] = lengths.sum().item() / row["tokens_per_second"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--lengths", default="64,128,256", help="max completion lengths, at --length_sweep_size")
    parser.add_argument("--sizes", default="8,16,32,64", help="sequences per rollout, at --size_sweep_length")
    parser.add_argument("--length_sweep_size", type=int, default=32)
    parser.add_argument("--size_sweep_length", type=int, default=128)
    parser.add_argument("--suppress_eos", action="store_true", help="completions always run to the length limit")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (see BENCHMARKS.md)")
    parser.add_argument("--output_dir", default="bench-output/scaling")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    if opts.suppress_eos:
        suppress_eos()
    configs = [(opts.length_sweep_size, int(n)) for n in opts.lengths.split(",")]
    configs += [(int(s), opts.size_sweep_length) for s in opts.sizes.split(",")]
    configs = list(dict.fromkeys(configs))  # the two sweeps share one point
    trainers = {c: make_trainer(*c, f"{opts.output_dir}/{c[0]}x{c[1]}") for c in configs}
    samples = {c: [] for c in configs}
    for r in range(opts.warmup + opts.rounds):
        for c in configs if r % 2 == 0 else configs[::-1]:
            if r == 0:
                trainers[c].prepare_for_training(max_steps=10**6)
            row = measure(trainers[c])
            if r >= opts.warmup:
                samples[c].append(row)
    results = []
    for (sequences, length), rows in samples.items():
        result = {key: statistics.median(row[key] for row in rows) for key in rows[0]}
        result.update(sequences=sequences, max_completion_length=length, steps=sequences // 8)
        result["step_s"] = result["iteration_s"] / result["steps"]
        result["train_step_s"] = (result["iteration_s"] - result["rollout_s"]) / result["steps"]
        results.append(result)
    Path(opts.output_dir).mkdir(parents=True, exist_ok=True)
    (Path(opts.output_dir) / "results.json").write_text(json.dumps(results, indent=1))
    print(
        f"\nmachine: {os.cpu_count()} CPU cores, {opts.threads} torch thread(s); toy model; suppress_eos="
        f"{opts.suppress_eos}; medians of {opts.rounds} rounds after {opts.warmup} warm-up"
    )
    print(
        "| seqs/rollout | max len | mean len | longest | gen s | gen tok/s | rollout s | train s/step | steps | "
        "iteration s | s/step (incl. rollout) | CPU iteration s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['sequences']} | {r['max_completion_length']} | {r['completion_length']:.1f} | "
            f"{r['max_length']:.0f} | {r['generation_s']:.2f} | {r['tokens_per_second']:.0f} | "
            f"{r['rollout_s']:.2f} | {r['train_step_s']:.2f} | {r['steps']} | {r['iteration_s']:.2f} | "
            f"{r['step_s']:.2f} | {r['cpu_iteration_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
