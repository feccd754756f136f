"""Does an algorithm teach SmolLM2-135M-Instruct the arithmetic task? Held-out greedy accuracy before and after, side
by side, with ``make demo``'s settings (steadyrl/real/demo.py: 4 prompts x 8 completions of up to 16 tokens per
step, learning rate 1e-5 constant, float32, HF generate, rewards correct_answer + 0.2 x answer_format), each
algorithm with its own KL default.

    python bench/arithmetic_learning.py --runs reinforce,reinforce_baseline,grpo --max_steps 15 --output_dir out/al

Prints one JSON line per run (accuracy before and after on the 128 held-out problems, minutes of training, the
logged reward of the first and last 3 steps) and writes them to OUTPUT_DIR/results.jsonl.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import steadyrl
from steadyrl.real import answer_format, arithmetic_dataset, correct_answer, greedy_accuracy, smollm2_path
from steadyrl.real.demo import TRAINING_SETTINGS

RUNS = {  # name -> (registry name, settings over the demo's)
    "grpo": ("grpo", {}),  # the demo's: beta 0 (TRL's GRPO default), no reference model
    "reinforce": ("reinforce-pp", {"advantage_estimator": "reinforce"}),  # OpenRLHF's init_kl_coef 0.01, k1
    "reinforce_baseline": ("reinforce-pp", {"advantage_estimator": "reinforce_baseline"}),
}


def run(name: str, max_steps: int, output_dir: Path, eval_size: int) -> dict:
    algorithm, own = RUNS[name]
    config_class, trainer_class = steadyrl.ALGORITHMS[algorithm]
    settings = {key: value for key, value in TRAINING_SETTINGS.items() if algorithm == "grpo" or key != "beta"}
    args = config_class(
        output_dir=str(output_dir / name),
        max_steps=max_steps,
        per_device_train_batch_size=8 * 4,  # 4 prompts x 8 completions, one optimizer step per rollout
        **{**settings, "save_steps": 1000, "save_final_checkpoint": False, **own},
    )
    trainer = trainer_class(
        model=smollm2_path(),
        reward_funcs=[correct_answer, answer_format],
        args=args,
        train_dataset=arithmetic_dataset("train"),
    )
    held_out = arithmetic_dataset("eval", size=eval_size)
    before, _ = greedy_accuracy(trainer.model, trainer.processing_class, held_out, args.max_completion_length)
    start = time.time()
    trainer.train()
    minutes = (time.time() - start) / 60
    after, replies = greedy_accuracy(trainer.model, trainer.processing_class, held_out, args.max_completion_length)
    rewards = [log["reward"] for log in trainer.state.log_history if "reward" in log]
    return {
        "run": name,
        "steps": trainer.state.global_step,
        "beta": args.beta,
        "accuracy_before": before,
        "accuracy_after": after,
        "training_minutes": round(minutes, 2),
        "reward_first_3": sum(rewards[:3]) / 3,
        "reward_last_3": sum(rewards[-3:]) / 3,
        "example": replies[0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", default="reinforce,reinforce_baseline,grpo")
    parser.add_argument("--max_steps", type=int, default=15)
    parser.add_argument("--eval_size", type=int, default=128)
    parser.add_argument("--output_dir", default="out/arithmetic-learning")
    opts = parser.parse_args()
    output_dir = Path(opts.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    for name in opts.runs.split(","):
        result = run(name, opts.max_steps, output_dir, opts.eval_size)
        print(json.dumps(result), flush=True)
        with open(output_dir / "results.jsonl", "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
