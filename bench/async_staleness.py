"""Generation ahead of training (``max_staleness``) on 2 cores: a vLLM server of SmolLM2-135M-Instruct on core 1, the
trainer on core 0.

    python bench/async_staleness.py speed [--steps 8] [--staleness 0,1,2]
    python bench/async_staleness.py curve [--steps 24] [--staleness 0,1] [--eval_every 8]

``speed``: GRPO on the arithmetic task (``--prompts_per_step`` x 8 generations, one optimizer step per rollout,
``--max_completion_length`` tokens), optimizer steps per second over steps 2..N at each staleness, and where the time
went (the trainer's wait for generation, the generator's idle time). ``curve``: the same runs for ``--steps`` steps,
then the held-out greedy accuracy (128 problems) of each, so staleness 1 and 0 are compared at the same number of
samples. ``--correction``: ``vllm_importance_sampling_mode`` (token_truncate: one truncated weight per token, the
mode for a policy lag; TRL's default sequence_mask zeroes whole sequences the last update made likelier).

A level ``1p`` in ``--staleness`` is staleness 1 with partial rollouts (``--partial`` tokens of each completion ahead,
the rest at the hand-over). ``--reasoning``: the reasoning shape, each prompt led by a system message that asks for
the steps (about 150-token prompts), with ``--max_completion_length 256``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from launching import start_vllm_server  # noqa: E402

REASONING = (
    "You are a careful mathematics tutor who helps students check their arithmetic. When you are given a question, "
    "first restate the two numbers, then add the ones digits and say whether there is a carry, then add the tens "
    "digits together with any carry, and say whether there is a carry into the hundreds. Explain each step in one "
    "short sentence so that a student can follow the reasoning and find their own mistake. Do not skip steps, do "
    "not use a calculator, and do not add any other commentary. When you are done, give the final sum on its own."
)


def with_reasoning(dataset):
    """The reasoning shape: each prompt led by a system message asking for the steps (about 150 tokens in all)."""
    return dataset.map(lambda row: {"prompt": [{"role": "system", "content": REASONING}, *row["prompt"]]})


def run(
    url: str,
    staleness: int,
    steps: int,
    output_dir: str,
    evaluate: bool,
    completion_length: int,
    prompts: int,
    correction: str,
    seed: int,
    eval_every: int,
    partial: int = 0,
    reasoning: bool = False,
    seed_accuracy: float | None = None,
) -> dict:
    import torch
    from transformers import TrainerCallback

    from steadyrl import GRPOConfig, GRPOTrainer
    from steadyrl.real import answer_format, arithmetic_dataset, correct_answer, greedy_accuracy, smollm2_path

    class StepTimes(TrainerCallback):
        """Each step's end; in ``curve`` mode the held-out accuracy every ``eval_every`` steps (not timed)."""

        def __init__(self):
            self.ends, self.accuracy, self.trainer, self.evaluating = [], {}, None, 0.0

        def evaluate(self, step: int) -> None:
            start = time.perf_counter()
            self.accuracy[step] = greedy_accuracy(
                self.trainer.model, self.trainer.processing_class, held_out, completion_length
            )[0]
            self.evaluating += time.perf_counter() - start

        def on_train_begin(self, args, state, control, **kwargs):
            if evaluate and seed_accuracy is None:
                self.evaluate(0)

        def on_step_end(self, args, state, control, **kwargs):
            if evaluate and state.global_step % eval_every == 0:
                self.evaluate(state.global_step)
            self.ends.append(time.perf_counter() - self.evaluating)

    torch.set_num_threads(1)
    train, held_out = arithmetic_dataset("train"), arithmetic_dataset("eval")
    if reasoning:
        train, held_out = with_reasoning(train), with_reasoning(held_out)
    args = GRPOConfig(
        output_dir=output_dir,
        num_generations=8,
        per_device_train_batch_size=8 * prompts,
        max_completion_length=completion_length,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        reward_weights=[1.0, 0.2],
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_dtype="float32",
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode=correction,
        max_staleness=staleness,
        partial_rollout_tokens=partial,
        max_steps=steps,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        bf16=False,
        seed=seed,
        disable_tqdm=True,
    )
    times = StepTimes()
    trainer = GRPOTrainer(
        model=smollm2_path(),
        reward_funcs=[correct_answer, answer_format],
        args=args,
        train_dataset=train,
        callbacks=[times],
    )
    times.trainer = trainer
    if seed_accuracy is not None:
        times.accuracy[0] = seed_accuracy  # every level starts from the same weights: evaluated once
    start = time.perf_counter()
    trainer.train()
    marks = [start, *times.ends]
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    result = {
        "staleness": f"{staleness}" + (f", partial {partial}" if partial else ""),
        "completion_length": sum(e["completion_length"] for e in logs) / len(logs),
        "fresh_token_share": sum(e.get("async/partial/fresh_token_share", 0.0) for e in logs) / len(logs),
        "steps_per_second": (len(marks) - 2) / (marks[-1] - marks[1]),  # steps 2..N: the first fills the pipeline
        "trainer_wait_s": sum(e.get("async/trainer_wait_s", 0.0) for e in logs[1:]) / max(len(logs) - 1, 1),
        "generator_wait_s": sum(e.get("async/generator_wait_s", 0.0) for e in logs[1:]) / max(len(logs) - 1, 1),
        "reward": [round(e["reward"], 3) for e in logs],
    }
    if evaluate:
        result["held_out_accuracy"] = times.accuracy[steps]
        result["accuracy_by_step"] = times.accuracy
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["speed", "curve"])
    parser.add_argument("--steps", type=int)
    parser.add_argument("--staleness")
    parser.add_argument("--max_completion_length", type=int, default=16)
    parser.add_argument("--prompts_per_step", type=int, default=4, help="prompts per step, 8 completions each")
    parser.add_argument("--correction", default="token_truncate", help="vllm_importance_sampling_mode")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--partial", type=int, default=64, help="partial_rollout_tokens of the levels marked p")
    parser.add_argument("--reasoning", action="store_true", help="about 150-token prompts asking for the steps")
    parser.add_argument(
        "--eval_every", type=int, help="curve: held-out accuracy every this many steps (default: at the end only)"
    )
    opts = parser.parse_args()
    steps = opts.steps or (8 if opts.mode == "speed" else 24)
    levels = (opts.staleness or ("0,1,2" if opts.mode == "speed" else "0,1")).split(",")
    from steadyrl.real import smollm2_path

    os.sched_setaffinity(0, {0})  # the trainer: core 0; the server: core 1
    work = Path(tempfile.mkdtemp(prefix="async-staleness-"))
    server_env = {"VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1"}
    max_model_len = str(512 + opts.max_completion_length)
    proc, url = start_vllm_server(
        smollm2_path(),
        work / "server.log",
        "--max-model-len",
        max_model_len,
        "--dtype",
        "float32",
        cores="1",
        env=server_env,
    )
    try:
        results = []
        for level in levels:
            first_accuracy = results[0]["accuracy_by_step"][0] if results and opts.mode == "curve" else None
            results.append(
                run(
                    url,
                    int(level.rstrip("p")),
                    steps,
                    str(work / f"s{level}"),
                    opts.mode == "curve",
                    opts.max_completion_length,
                    opts.prompts_per_step,
                    opts.correction,
                    opts.seed,
                    opts.eval_every or steps,
                    opts.partial if level.endswith("p") else 0,
                    opts.reasoning,
                    first_accuracy,
                )
            )
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    print(json.dumps(results))
    base = results[0]["steps_per_second"]
    print(
        "| max_staleness | steps/s | vs first | trainer waited (s/step) | generator idle (s/step) | completion tokens "
        "| fresh tokens | held-out accuracy |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        accuracy = f"{r['held_out_accuracy']:.1%}" if "held_out_accuracy" in r else "-"
        print(
            f"| {r['staleness']} | {r['steps_per_second']:.4f} | {r['steps_per_second'] / base:.2f}x | "
            f"{r['trainer_wait_s']:.1f} | {r['generator_wait_s']:.1f} | {r['completion_length']:.0f} | "
            f"{r['fresh_token_share']:.0%} | {accuracy} |"
        )


if __name__ == "__main__":
    main()
