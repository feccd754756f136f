"""Peak RSS per process, phase by phase, through an RLOO run's first steps: 2 CPU processes under DeepSpeed ZeRO-3
and FSDP2, on the real SmolLM2-135M-Instruct and on random weights in Qwen2.5-0.5B's shape.

    python bench/step_memory.py [--models smollm2,qwen05b] [--engines zero3,fsdp2] [--steps 2]

Each (model, engine) is one ``accelerate launch`` of this script as a worker (examples/accelerate_configs/
zero3.yaml or fsdp2.yaml, one torch thread per process): RLOO with HF generate, 4 prompts x 2 samples per rollout,
micro-batches of 2, 64 new tokens, beta 0.05 (so a reference model). The worker resets its peak RSS (``VmHWM``,
through /proc/self/clear_refs) at the start of each phase and reads it at its end: building the trainer, then in
every step generation, the log-prob passes (policy and reference) and the update (forward, backward, optimizer).
Each phase's peak is the highest over the steps. Results go to bench-output/step_memory.json (not tracked).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from launching import WorkerFailed, launch_worker  # noqa: E402

PHASES = ("build", "generate", "logprobs", "update")


def peak_gb() -> float:
    """This process's peak RSS since the last reset, in GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1e6
    raise RuntimeError("no VmHWM in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS


class PhasePeaks:
    """The highest peak RSS seen in each phase."""

    def __init__(self) -> None:
        self.peaks = dict.fromkeys(PHASES, 0.0)

    def end(self, phase: str) -> None:
        self.peaks[phase] = max(self.peaks[phase], peak_gb())
        reset_peak()

    def around(self, cls, method: str, phase: str) -> None:
        """Make ``cls.method`` a phase of its own (the time before it ends the phase then running)."""
        original = getattr(cls, method)

        @functools.wraps(original)
        def timed(trainer, *args, **kwargs):
            reset_peak()
            try:
                return original(trainer, *args, **kwargs)
            finally:
                self.end(phase)

        setattr(cls, method, timed)


def task(model: str):
    """The model's path, tokenizer, dataset and reward function."""
    if model == "smollm2":
        from steadyrl.real import arithmetic_dataset, correct_answer, smollm2_path

        path = smollm2_path()
        from transformers import AutoTokenizer

        return path, AutoTokenizer.from_pretrained(path), arithmetic_dataset(size=64), correct_answer
    import real_shapes

    path = real_shapes.qwen05b_shape_path()
    return path, real_shapes.load_tokenizer(path), real_shapes.word_prompts(64, 16), real_shapes.word_overlap


def worker(model: str, steps: int, output_dir: str, result: str) -> None:
    import torch

    from steadyrl import RLOOConfig, RLOOTrainer
    from steadyrl.trainers.loop.learner import Learner
    from steadyrl.trainers.loop.rollout_builder import RolloutBuilder
    from steadyrl.trainers.loop.sources import ActorGenerator

    path, tokenizer, dataset, reward = task(model)
    peaks = PhasePeaks()
    peaks.around(ActorGenerator, "__call__", "generate")
    peaks.around(RolloutBuilder, "policy_logprobs", "logprobs")
    peaks.around(Learner, "step", "update")
    args = RLOOConfig(
        output_dir=output_dir,
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        micro_rollout_batch_size=4,
        train_batch_size=8,
        micro_train_batch_size=2,
        max_completion_length=64,
        learning_rate=1e-6,
        beta=0.05,
        seed=0,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        max_steps=steps,
        logging_steps=1,
    )
    reset_peak()
    trainer = RLOOTrainer(model=path, reward_funcs=reward, args=args, train_dataset=dataset, processing_class=tokenizer)
    peaks.end("build")
    trainer.train()
    mine = torch.tensor([peaks.peaks[phase] for phase in PHASES])
    every = trainer.accelerator.gather(mine.unsqueeze(0)).tolist()
    if trainer.accelerator.is_main_process:
        Path(result).write_text(json.dumps([dict(zip(PHASES, rank)) for rank in every]))
    trainer.accelerator.end_training()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2,qwen05b")
    parser.add_argument("--engines", default="zero3,fsdp2")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--output_dir")
    parser.add_argument("--result")
    opts = parser.parse_args()
    if opts.worker:
        worker(opts.models, opts.steps, opts.output_dir, opts.result)
        return
    rows = []
    for model in opts.models.split(","):
        for engine in opts.engines.split(","):
            try:
                peaks = launch_worker(__file__, engine, "--models", model, "--steps", str(opts.steps))
            except WorkerFailed as failure:
                peaks = "killed (out of memory)" if failure.killed else str(failure)
            row = {"model": model, "engine": engine, "peak_gb": peaks}
            rows.append(row)
            print(json.dumps(row), flush=True)
    out = ROOT / "bench-output"
    out.mkdir(exist_ok=True)
    (out / "step_memory.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
