"""Multi-turn GRPO with a tool, steadyrl against TRL's GRPOTrainer, on SmolLM2-135M-Instruct.

    python bench/multi_turn_vs_trl.py [--steps 5] [--warmup_steps 30]

SmolLM2-135M-Instruct does not call tools on its own, so both trainers start from the same copy taught the call
format (``teach_tool_format``: supervised steps on conversations, a quarter of them calling with the question's numbers
and the rest with random ones; built once and cached).
Each trainer then runs ``--steps`` GRPO steps with ``environment_factory=Calculator`` (its ``add`` method is the
tool; ``get_reward`` pays for a call that added the question's numbers) and ``correct_sum``, with the same settings
(TRL's GRPOConfig given to both, converted by steadyrl), HF generate, one process. It prints seconds per step (the
first step left out: both trainers warm up in it), tool calls per rollout, failed calls and the share of completion
tokens the environment wrote, each as the mean over the steps.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def warm_model(steps: int) -> str:
    """SmolLM2-135M-Instruct taught the call format for ``steps`` steps, with the tool template (cached)."""
    from steadyrl.cache import build_cached

    def build(directory: Path) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from steadyrl.real import smollm2_path
        from steadyrl.toy.tools import RESPONSE_TEMPLATE, TOOL_CHAT_TEMPLATE, teach_tool_format

        tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
        tokenizer.chat_template, tokenizer.response_template = TOOL_CHAT_TEMPLATE, RESPONSE_TEMPLATE
        model = AutoModelForCausalLM.from_pretrained(smollm2_path())
        teach_tool_format(model, tokenizer, steps=steps, batch_size=8, learning_rate=5e-5, seed=0, right_share=0.25)
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    return build_cached(f"smollm2-tool-format-{steps}-right-0.25", build)


def worker(trainer_name: str, model: str, steps: int, output_dir: str) -> dict:
    from trl import GRPOConfig

    if trainer_name == "trl":
        from trl import GRPOTrainer
    else:
        from steadyrl import GRPOTrainer
    from transformers import TrainerCallback

    from steadyrl.toy.tools import Calculator, correct_sum, sum_dataset

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.times = []

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter())

    args = GRPOConfig(
        output_dir=output_dir,
        num_generations=8,
        per_device_train_batch_size=32,
        max_steps=steps,
        max_completion_length=96,
        max_tool_calling_iterations=1,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        seed=0,
        beta=0.0,
    )
    times = StepTimes()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[correct_sum],
        args=args,
        train_dataset=sum_dataset(256),
        environment_factory=Calculator,
        callbacks=[times],
    )
    start = time.perf_counter()
    trainer.train()
    marks = [start, *times.times]
    per_step = [b - a for a, b in zip(marks, marks[1:])]
    logs = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry]

    def mean(key):
        values = [entry[key] for entry in logs if key in entry]
        return sum(values) / len(values) if values else None

    return {
        "seconds_per_step": sum(per_step[1:]) / max(len(per_step) - 1, 1),
        "first_step": per_step[0],
        "calls_per_rollout": mean("tools/call_frequency"),
        "failed": mean("tools/failure_frequency"),
        "env_token_share": mean("env_token_share"),
        "steps": len(logs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup_steps", type=int, default=30)
    parser.add_argument("--worker", choices=["steadyrl", "trl"])
    parser.add_argument("--model")
    parser.add_argument("--output_dir")
    opts = parser.parse_args()
    if opts.worker:
        print(json.dumps(worker(opts.worker, opts.model, opts.steps, opts.output_dir)))
        return
    model = warm_model(opts.warmup_steps)
    results = {}
    for name in ("steadyrl", "trl"):
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [
                sys.executable,
                __file__,
                "--worker",
                name,
                "--model",
                model,
                "--steps",
                str(opts.steps),
                "--output_dir",
                tmp,
            ]
            env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": str(ROOT)}
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if proc.returncode != 0:
                raise RuntimeError(f"{name} failed:\n{proc.stderr[-3000:]}")
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    print("| trainer | s/step | first step (s) | tool calls / rollout | failed calls | env token share |")
    print("|---|---|---|---|---|---|")
    for name, r in results.items():
        share = "not logged" if r["env_token_share"] is None else f"{r['env_token_share']:.2f}"
        print(
            f"| {name} | {r['seconds_per_step']:.1f} | {r['first_step']:.1f} | {r['calls_per_rollout']:.2f} | "
            f"{r['failed']:.2f} | {share} |"
        )


if __name__ == "__main__":
    main()
