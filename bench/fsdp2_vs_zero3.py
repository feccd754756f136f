"""RLOO step time and peak memory under FSDP2 (torch's ``fully_shard``) and DeepSpeed ZeRO-3, 2 CPU processes (gloo).

    python bench/fsdp2_vs_zero3.py [--models toy,25m] [--steps 12] [--warmup 4] [--rounds 1]

For each model (the toy model, and the ~25M-parameter model of bench/vllm_vs_hf.py) and each engine, one
``accelerate launch`` of this script as a worker (examples/accelerate_configs/fsdp2.yaml or zero3.yaml) trains RLOO
for ``--steps`` global steps with HF generate: 8 prompts x 4 samples per rollout, 2 optimizer steps per rollout, 32
new tokens, one torch thread per process. Reported per launch: the median wall time of a global step after the
``--warmup`` steps (a rollout's time falls on the first step of the two it feeds, so the median of whole rollouts
is taken: the mean over pairs of steps), and the peak RSS (``ru_maxrss``) of each of the two processes. Engines take
turns over ``--rounds``; results go to bench-output/fsdp2_vs_zero3.json (not tracked).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from launching import launch_worker  # noqa: E402


def worker(model: str, steps: int, output_dir: str, result: str) -> None:
    import torch
    from transformers import TrainerCallback

    from steadyrl import RLOOConfig, RLOOTrainer
    from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

    if model == "25m":
        from vllm_vs_hf import model_25m_path

        path = model_25m_path()
    else:
        path = toy_model_path()

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.ends = [time.perf_counter()]

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    clock = StepClock()
    args = RLOOConfig(
        output_dir=output_dir,
        rollout_batch_size=8,
        n_samples_per_prompt=4,
        micro_rollout_batch_size=16,
        train_batch_size=16,
        micro_train_batch_size=8,
        num_ppo_epochs=1,
        max_completion_length=32,
        learning_rate=1e-5,
        seed=0,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        max_steps=steps,
        logging_steps=1,
    )
    trainer = RLOOTrainer(path, [letters_reward], args, toy_dataset(), callbacks=[clock])
    trainer.train()
    step_s = [b - a for a, b in zip(clock.ends, clock.ends[1:])]
    rss = torch.tensor([resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0])
    rss = trainer.accelerator.gather(rss).tolist()
    if trainer.accelerator.is_main_process:
        Path(result).write_text(json.dumps({"step_s": step_s, "peak_rss_mb": rss}))
    trainer.accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="toy,25m")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--output_dir")
    parser.add_argument("--result")
    opts = parser.parse_args()
    if opts.worker:
        worker(opts.models, opts.steps, opts.output_dir, opts.result)
        return
    rows = []
    for model in opts.models.split(","):
        runs = {"fsdp2": [], "zero3": []}
        for _ in range(opts.rounds):
            for engine in runs:
                runs[engine].append(launch_worker(__file__, engine, "--models", model, "--steps", str(opts.steps)))
        for engine, results in runs.items():
            pairs = [sum(r["step_s"][i : i + 2]) / 2 for r in results for i in range(opts.warmup, opts.steps - 1, 2)]
            row = {
                "model": model,
                "engine": engine,
                "step_s": statistics.median(pairs),
                "peak_rss_mb": [max(r["peak_rss_mb"][rank] for r in results) for rank in (0, 1)],
            }
            rows.append(row)
            print(json.dumps(row))
    out = ROOT / "bench-output"
    out.mkdir(exist_ok=True)
    (out / "fsdp2_vs_zero3.json").write_text(json.dumps(rows, indent=1))
    for model in opts.models.split(","):
        fsdp2, zero3 = (next(r for r in rows if r["model"] == model and r["engine"] == e) for e in ("fsdp2", "zero3"))
        print(f"{model}: step time FSDP2/ZeRO-3 {fsdp2['step_s'] / zero3['step_s']:.2f}x")


if __name__ == "__main__":
    main()
