"""``steadyrl demo``: RLOO (or ``--algorithm ppo|online-dpo|grpo``) on the embedded toy task, on CPU, in a few minutes.

Prints the mean reward of the policy before and after training, keeps checkpoints, saves the
actor, draws the reward curve, and prints the command that resumes the run.

RLOO is the default because it shows the product best here: on this short, single-score task its
leave-one-out baseline is accurate from the first step, while PPO's critic must learn values first
(docs/demos.md has the measured comparison).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import torch

from ..trainers import ALGORITHMS
from .task import COMPLETION_LENGTH, letters_reward, toy_dataset, toy_model_path

_SHARED = dict(
    rollout_batch_size=16,
    n_samples_per_prompt=4,
    micro_rollout_batch_size=32,
    train_batch_size=64,
    micro_train_batch_size=32,
    num_ppo_epochs=1,
    max_completion_length=COMPLETION_LENGTH,
    learning_rate=5e-4,
    lr_scheduler_type="constant",
    beta=0.01,
    seed=0,
)
# per registry name; an algorithm without an entry here runs with the shared settings
TRAINING_SETTINGS = {
    "rloo": _SHARED,
    "ppo": {**_SHARED, "lam": 1.0, "critic_learning_rate": 1e-3},
    # online DPO: 32 prompts x 1 pair = the same 64 samples per rollout
    "online-dpo": {**_SHARED, "rollout_batch_size": 32, "n_samples_per_prompt": 2, "beta": 0.1},
    # GRPO with TRL's defaults: no KL term (so no reference model), DAPO's token-mean loss, group-scaled rewards
    "grpo": {**_SHARED, "beta": 0.0},
}


def mean_reward(model, tokenizer, dataset, seed: int = 1234) -> float:
    """Mean toy reward of sampled completions for ``dataset``'s prompts (global RNG left untouched)."""
    prompts, letters = list(dataset["prompt"]), list(dataset["letters"])
    was_training = model.training
    model.eval()  # in train mode a gradient-checkpointed model generates without its KV cache, losing the context
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        inputs = tokenizer(prompts, return_tensors="pt", padding=True)
        output = model.generate(
            **inputs, do_sample=True, max_new_tokens=COMPLETION_LENGTH, pad_token_id=tokenizer.pad_token_id
        )
    model.train(was_training)
    completions = tokenizer.batch_decode(output[:, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    return sum(letters_reward(completions, letters)) / len(prompts)


def demo_output_dir(output_dir: str, resume_from_checkpoint: str | None) -> Path:
    """The demo's output directory: a fresh start removes the previous demo run in it, a resume keeps it."""
    out = Path(output_dir)
    if out.exists() and resume_from_checkpoint in (None, "false"):
        print(f"Removing the previous demo run in {out}/")
        shutil.rmtree(out)
    return out


def plot_rewards(log_history: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(log["step"], log["reward"]) for log in log_history if "reward" in log]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([s for s, _ in points], [r for _, r in points], marker=".")
    ax.set_xlabel("global step")
    ax.set_ylabel("mean reward of rollout")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=formatter)
    parser.add_argument(
        "--model",
        choices=["toy", "smollm2"],
        default="toy",
        help="smollm2: GRPO on a real pretrained chat model (steadyrl demo --model smollm2 --help)",
    )
    parser.add_argument("--output_dir", default="demo-output")
    rewarded = sorted(name for name, entry in ALGORITHMS.items() if entry.trainer_class.algorithm_class.uses_rewards)
    parser.add_argument("--algorithm", choices=rewarded, default="rloo")
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument(
        "--resume_from_checkpoint", default=None, help="'true' for the newest complete checkpoint, or a path"
    )
    opts = parser.parse_args(argv)
    if opts.model != "toy":  # `steadyrl demo` sends --model smollm2 to steadyrl.real.demo
        parser.error(f"--model {opts.model} is the real-model demo: run steadyrl demo --model {opts.model}")
    out = demo_output_dir(opts.output_dir, opts.resume_from_checkpoint)

    config_class, trainer_class = ALGORITHMS[opts.algorithm]
    settings = {**TRAINING_SETTINGS.get(opts.algorithm, _SHARED), "output_dir": str(out), "max_steps": opts.max_steps}
    settings.update(
        save_steps=20, save_total_limit=3, logging_steps=5, report_to="none", save_final_checkpoint=True
    )  # the printed resume command always has a checkpoint
    trainer = trainer_class(
        model=toy_model_path(),
        args=config_class(**settings),
        train_dataset=toy_dataset(),
        reward_funcs=[letters_reward],
    )
    held_out = toy_dataset(num_prompts=128, seed=1)
    tokenizer = trainer.processing_class
    before = mean_reward(trainer.model, tokenizer, held_out)  # the initial policy: a checkpoint loads in train()
    print(f"Mean reward of the initial policy on 128 held-out prompts: {before:.3f}")
    start = time.time()
    trainer.train(resume_from_checkpoint=opts.resume_from_checkpoint)
    elapsed = time.time() - start
    after = mean_reward(trainer.model, tokenizer, held_out)
    trainer.save_model(str(out / "actor"))
    plot_rewards(trainer.state.log_history, out / "reward_curve.png", f"steadyrl {opts.algorithm} on the toy task")
    (out / "log_history.json").write_text(json.dumps(trainer.state.log_history, indent=1))

    checkpoints = sorted((p.name for p in out.glob("checkpoint-*")), key=lambda name: int(name.split("-")[1]))
    print(f"\nTrained {trainer.state.global_step} steps in {elapsed:.0f} s.")
    print(f"Mean reward on 128 held-out prompts: {before:.3f} before -> {after:.3f} after training.")
    print(f"Checkpoints: {', '.join(checkpoints)} (in {out}/)")
    print(f"Actor (plain Hugging Face model): {out / 'actor'}/   Reward curve: {out / 'reward_curve.png'}")
    print("Resume (or extend with a larger --max_steps) with:")
    command = f"{Path(sys.executable).name} -m steadyrl demo --algorithm {opts.algorithm} --output_dir {out}"
    print(f"  {command} --resume_from_checkpoint true")


if __name__ == "__main__":
    main()
