"""Does GKD train SmolLM2-135M-Instruct from its GRPO-trained self as on-policy distillation does? Held-out greedy
accuracy before and after, and the per-token divergence, side by side, with ``steadyrl demo --algorithm
distillation``'s settings (steadyrl/real/demo.py: 16 prompts per step, one completion of up to 16 tokens each,
reverse KL (beta 1), learning rate 2e-5 constant, float32, HF generate). GKD differs in one thing: each rollout is the
student's samples with probability lmbda (TRL's 0.5), else the arithmetic task's answers as the completions (TRL's
``messages``: the last, assistant message); its divergence is at temperature 1 as TRL's (the demo samples at 1).

    steadyrl demo --model smollm2 --max_steps 15 --output_dir out/teacher     # the teacher (GRPO)
    python bench/distillation_real.py --teacher out/teacher/actor --runs distillation,gkd --output_dir out/dr

Prints one JSON line per run and writes them to OUTPUT_DIR/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import steadyrl
from steadyrl.real import arithmetic_dataset, greedy_accuracy, smollm2_path
from steadyrl.real.demo import DISTILLATION_SETTINGS

RUNS = {  # name -> (registry name, settings over the demo's distillation)
    "distillation": ("distillation", {}),
    "gkd": ("gkd", {"lmbda": 0.5, "beta": 1.0, "temperature": 1.0}),  # the demo's divergence and sampling
}


def with_answers(dataset):
    """The arithmetic prompts with their answers as the assistant's last message (TRL's GKD format)."""

    def messages(row):
        return {"messages": row["prompt"] + [{"role": "assistant", "content": row["answer"]}]}

    return dataset.map(messages, remove_columns=["prompt"])


def run(name: str, teacher: str, max_steps: int, output_dir: Path, eval_size: int) -> dict:
    algorithm, own = RUNS[name]
    config_class, trainer_class = steadyrl.ALGORITHMS[algorithm]
    args = config_class(
        output_dir=str(output_dir / name),
        max_steps=max_steps,
        per_device_train_batch_size=16,
        **{**DISTILLATION_SETTINGS, "save_steps": 1000, "save_final_checkpoint": False, **own},
    )
    train = arithmetic_dataset("train")
    train = with_answers(train) if algorithm == "gkd" else train
    trainer = trainer_class(model=smollm2_path(), teacher_model=teacher, args=args, train_dataset=train)
    held_out, length = arithmetic_dataset("eval", size=eval_size), args.max_completion_length
    before, _ = greedy_accuracy(trainer.model, trainer.processing_class, held_out, length)
    teacher_accuracy, _ = greedy_accuracy(trainer.teacher_model, trainer.processing_class, held_out, length)
    start = time.time()
    trainer.train()
    minutes = (time.time() - start) / 60
    after, replies = greedy_accuracy(trainer.model, trainer.processing_class, held_out, length)
    steps = [log for log in trainer.state.log_history if "divergence" in log]
    return {
        "run": name,
        "steps": trainer.state.global_step,
        "accuracy_before": before,
        "accuracy_after": after,
        "teacher_accuracy": teacher_accuracy,
        "training_minutes": round(minutes, 2),
        "divergence_first": steps[0]["divergence"],
        "divergence_last_5": sum(log["divergence"] for log in steps[-5:]) / len(steps[-5:]),
        "on_policy": [log.get("on_policy", 1.0) for log in steps],
        "example": f"{held_out['prompt'][0][-1]['content']!r} -> {replies[0]!r}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--teacher", required=True, help="the GRPO demo's actor")
    parser.add_argument("--runs", default="distillation,gkd", help=f"comma-separated, of {', '.join(RUNS)}")
    parser.add_argument("--max_steps", type=int, default=15)
    parser.add_argument("--eval_size", type=int, default=128)
    parser.add_argument("--output_dir", default="distillation-real")
    opts = parser.parse_args()
    out = Path(opts.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in opts.runs.split(","):
        result = run(name, opts.teacher, opts.max_steps, out, opts.eval_size)
        print(json.dumps(result), flush=True)
        with open(out / "results.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
