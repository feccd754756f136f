"""Checkpoint cost of steadyrl's trainers: save time and size on disk against the step time, and resume time.

    python bench/checkpoint_cost.py [--models toy,25m,smollm2] [--algorithms rloo,ppo,online-dpo] [--steps 12]

For each trainer (RLOO, PPO with a critic made from the policy, online DPO) and model (the toy model and the ~25M
model of bench/vllm_vs_hf.py on the toy task; SmolLM2-135M-Instruct on the arithmetic task, see real_shapes.py), in
this process, with HF generate and up to ``--completion_length`` (64) new tokens:

1. A fresh run of ``--steps`` optimizer steps saving every 2 (``save_total_limit=2``). RLOO and PPO: 8 prompts x 4
   samples, 16 samples per step, micro batch 8, 2 epochs = 4 steps per rollout, so checkpoints alternate between
   mid-rollout (the unused rollout buffer is saved too) and rollout boundaries. Online DPO: 16 prompts x 2, 16 per
   step = 2 steps per rollout. Save time is the wall time of ``trainer.save_checkpoint`` (write under a temporary
   name, sha256 + fsync of every file, manifest, rename, rotation). Step time is the wall time per optimizer step
   after the first rollout, including its share of generation, saves excluded.
2. A new trainer in the same process (its construction is timed separately) with one more step calls
   ``trainer.train(resume_from_checkpoint=True)``: "load" is the time from that call to ``on_train_begin``
   (checkpoint lookup and manifest verification, optimizer creation, loading weights, optimizer, scheduler, sampler
   and state), "to first step" from that call to the first ``on_step_end`` (the checkpoint is at a rollout
   boundary, so that step generates a rollout). A fresh run's train() call to first ``on_step_end`` is given for
   comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from real_shapes import task  # noqa: E402
from transformers import PrinterCallback, TrainerCallback  # noqa: E402

import steadyrl  # noqa: E402
from steadyrl.checkpoint.layout import actor_files  # noqa: E402

SETTINGS = {  # per registry name (steadyrl.ALGORITHMS)
    "rloo": dict(rollout_batch_size=8, n_samples_per_prompt=4, micro_rollout_batch_size=32, num_ppo_epochs=2),
    "ppo": dict(
        rollout_batch_size=8,
        n_samples_per_prompt=4,
        micro_rollout_batch_size=32,
        num_ppo_epochs=2,
        target_kl=0.5,
        kl_horizon=100,
        normalize_reward=True,
        kl_estimator="k3",
        missing_eos_penalty=0.1,
    ),
    "online-dpo": dict(rollout_batch_size=16, micro_rollout_batch_size=8, missing_eos_penalty=0.1),
}


class Clock(TrainerCallback):
    def __init__(self) -> None:
        self.train_begin, self.step_ends = None, []

    def on_train_begin(self, args, state, control, **kwargs):
        self.train_begin = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.step_ends.append(time.perf_counter())


def make_trainer(algorithm: str, model: str, output_dir: Path, max_steps: int, clock: Clock, completion_length: int):
    config_class, trainer_class = steadyrl.ALGORITHMS[algorithm]
    settings = SETTINGS[algorithm]
    args = config_class(
        output_dir=str(output_dir),
        train_batch_size=16,
        micro_train_batch_size=8,
        max_completion_length=completion_length,
        learning_rate=1e-5,
        max_steps=max_steps,
        save_steps=2,
        save_total_limit=2,
        seed=0,
        report_to="none",
        disable_tqdm=True,
        **settings,
    )
    model_path, dataset, reward = task(model, prompt_length=0)
    trainer = trainer_class(model_path, args=args, train_dataset=dataset, reward_funcs=[reward], callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # keep stdout for the results
    return trainer


def size_mb(path: Path) -> float:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20


def actor_mb(checkpoint: Path) -> float:
    """The actor's files of a checkpoint (at its top level, beside the optimizer and the run's state)."""
    names = json.loads((checkpoint / "manifest.json").read_text())["files"]
    return sum((checkpoint / name).stat().st_size for name in actor_files(names)) / 2**20


def bench(algorithm: str, model: str, steps: int, completion_length: int, out: Path) -> dict:
    directory = out / f"{model}-{algorithm}"
    shutil.rmtree(directory, ignore_errors=True)
    clock = Clock()
    trainer = make_trainer(algorithm, model, directory, steps, clock, completion_length)
    saves, save = [], trainer.save_checkpoint

    def timed_save(*args, **kwargs):
        start = time.perf_counter()
        path = save(*args, **kwargs)
        saves.append((start, time.perf_counter() - start))
        return path

    trainer.save_checkpoint = timed_save
    start = time.perf_counter()
    trainer.train()
    first_step = clock.step_ends[0] - start
    per_rollout = trainer.args.steps_per_rollout
    measured_from = clock.step_ends[per_rollout - 1]
    saving = sum(seconds for begin, seconds in saves if begin > measured_from)
    step_s = (clock.step_ends[-1] - measured_from - saving) / (steps - per_rollout)
    checkpoint, mid = directory / f"checkpoint-{steps}", directory / f"checkpoint-{steps - 2}"
    sizes = dict(size_mb=size_mb(checkpoint), size_mid_rollout_mb=size_mb(mid), actor_mb=actor_mb(checkpoint))
    del trainer

    resume_clock = Clock()
    begin = time.perf_counter()
    resumed = make_trainer(algorithm, model, directory, steps + 1, resume_clock, completion_length)
    construct = time.perf_counter() - begin
    begin = time.perf_counter()
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == steps + 1
    save_s = statistics.median(seconds for _, seconds in saves)
    result = {
        "algorithm": algorithm,
        "model": model,
        "steps_per_rollout": per_rollout,
        "step_s": step_s,
        "save_s": save_s,
        "save_over_step": save_s / step_s,
        "saves": len(saves),
        **sizes,
        "fresh_first_step_s": first_step,
        "construct_s": construct,
        "load_s": resume_clock.train_begin - begin,
        "resume_first_step_s": resume_clock.step_ends[0] - begin,
    }
    shutil.rmtree(directory)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="toy,25m")
    parser.add_argument("--algorithms", default=",".join(SETTINGS))
    parser.add_argument("--steps", type=int, default=12, help="steps of the fresh run (a multiple of 4)")
    parser.add_argument("--completion_length", type=int, default=64, help="max new tokens")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (see BENCHMARKS.md)")
    parser.add_argument("--output_dir", default="bench-output/checkpoint_cost")
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    out = Path(opts.output_dir)
    results = []
    for model in opts.models.split(","):
        for algorithm in opts.algorithms.split(","):
            results.append(bench(algorithm, model, opts.steps, opts.completion_length, out))
            print(json.dumps(results[-1]), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(
        f"\nmachine: {os.cpu_count()} CPU cores, {opts.threads} torch thread(s); {opts.steps} steps saving every 2; "
        f"up to {opts.completion_length} new tokens"
    )
    print(
        "| model | trainer | step s | save s | save / step | size MB (boundary / mid-rollout) | of which actor MB | "
        "construct s | resume: load s | resume: to 1st step s | fresh: to 1st step s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['algorithm']} | {r['step_s']:.2f} | {r['save_s']:.2f} | "
            f"{r['save_over_step']:.2f} | {r['size_mb']:.0f} / {r['size_mid_rollout_mb']:.0f} | "
            f"{r['actor_mb']:.0f} | {r['construct_s']:.2f} | {r['load_s']:.2f} | {r['resume_first_step_s']:.2f} | "
            f"{r['fresh_first_step_s']:.2f} |"
        )


if __name__ == "__main__":
    main()
