"""Per-process peak RSS while a trainer is built, 2 CPU processes under DeepSpeed ZeRO-3 and FSDP2.

    python bench/build_memory.py [--models smollm2,qwen05b] [--engines zero3,fsdp2] [--algorithms rloo,ppo]

For each model (the real SmolLM2-135M-Instruct of ``steadyrl.real``, and ``qwen05b_shape_path()``: random weights in
Qwen2.5-0.5B's shape, 494M parameters), engine and algorithm, one ``accelerate launch`` of this script as a worker
(examples/accelerate_configs/zero3.yaml or fsdp2.yaml) builds the trainer from the model's path (RLOO with beta > 0,
so with a reference; PPO with a critic from the policy) and trains nothing. Reported per process: the resident set
before the build (imports, dataset) and its peak (``ru_maxrss``) once the constructor returned. Results go to
bench-output/build_memory.json (not tracked). The 0.5B model's builds need up to ~10 GB of memory: run them alone.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from launching import launch_worker  # noqa: E402


def model_path(model: str) -> str:
    if model == "smollm2":
        from steadyrl.real import smollm2_path

        return smollm2_path()
    from real_shapes import qwen05b_shape_path

    return qwen05b_shape_path()


def current_rss_mb() -> float:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:")) / 1024.0


def worker(model: str, algorithm: str, output_dir: str, result: str) -> None:
    import torch

    from steadyrl import PPOConfig, PPOTrainer, RLOOConfig, RLOOTrainer
    from steadyrl.toy import letters_reward, toy_dataset

    path, dataset = model_path(model), toy_dataset()
    config, trainer_class = (PPOConfig, PPOTrainer) if algorithm == "ppo" else (RLOOConfig, RLOOTrainer)
    args = config(
        output_dir=output_dir,
        rollout_batch_size=8,
        n_samples_per_prompt=2,
        micro_rollout_batch_size=8,
        train_batch_size=8,
        micro_train_batch_size=4,
        max_completion_length=16,
        beta=0.05,
        seed=0,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        max_steps=1,
    )
    before = current_rss_mb()
    trainer = trainer_class(path, [letters_reward], args, dataset)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    rss = trainer.accelerator.gather(torch.tensor([[before, peak]], dtype=torch.float64)).tolist()
    if trainer.accelerator.is_main_process:
        report = {"before_build_mb": [r[0] for r in rss], "build_peak_mb": [r[1] for r in rss]}
        Path(result).write_text(json.dumps(report))
    trainer.accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2,qwen05b")
    parser.add_argument("--engines", default="zero3,fsdp2")
    parser.add_argument("--algorithms", default="rloo,ppo")
    parser.add_argument("--label", default="", help="a name for this tree's results (e.g. old, new)")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--output_dir")
    parser.add_argument("--result")
    opts = parser.parse_args()
    if opts.worker:
        worker(opts.models, opts.algorithms, opts.output_dir, opts.result)
        return
    out = ROOT / "bench-output"
    out.mkdir(exist_ok=True)
    results = out / "build_memory.json"
    rows = json.loads(results.read_text()) if results.exists() else []
    for model in opts.models.split(","):
        for engine in opts.engines.split(","):
            for algorithm in opts.algorithms.split(","):
                row = {
                    "label": opts.label,
                    "model": model,
                    "engine": engine,
                    "algorithm": algorithm,
                    **launch_worker(__file__, engine, "--models", model, "--algorithms", algorithm),
                }
                print(json.dumps(row), flush=True)
                rows.append(row)
                results.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
