"""steadyrl on a CUDA GPU in bf16: every trainer, the distributed engines with one process, and TRL side by side.

    python bench/cuda_check.py spec DIR          # on the CPU machine: SmolLM2-135M-Instruct's config and tokenizer
    STEADYRL_SMOLLM2_SPEC=DIR python bench/cuda_check.py run --out OUT [--parts train,engines]

The GPU machine cannot install the SmolLM2 package (no registry there, and its 93 MB GGUF file is more than can be
carried), so ``spec`` writes the model's config and tokenizer (no weights) and the GPU run builds the same
architecture with random weights (``real_shapes.smollm2_shape_path``): the same 134.5M parameters, 30 layers and
49,152-token LM head as the real model, so the same compute per token. Completions of a random model run to their
full length, and the reward (``text_length``) is a score of the text, not of arithmetic.

Parts, each case in a process of its own with a time limit, results appended to ``OUT/results.jsonl`` and every
process's output to ``OUT/log.txt``:

- ``train``: GRPO, RLOO, online DPO and PPO, ``bf16=True``, HF generate, 2 steps with a checkpoint at step 2, then
  resumed from it to step 3; for GRPO also an uninterrupted 3-step run, and how far its final weights are from the
  resumed run's (resume is bit-identical on CPU; on CUDA, kernels may be non-deterministic).
- ``engines``: RLOO under ``accelerate launch`` with DeepSpeed ZeRO-2, ZeRO-3 and FSDP2, one process, bf16, 2 steps
  and a checkpoint, then resumed to step 3.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

ALGORITHMS = ("grpo", "rloo", "online-dpo", "ppo")
ENGINES = {
    "zero2": dict(distributed_type="DEEPSPEED", deepspeed_config=dict(zero_stage=2, zero3_init_flag=False)),
    "zero3": dict(
        distributed_type="DEEPSPEED",
        deepspeed_config=dict(zero_stage=3, zero3_init_flag=True, zero3_save_16bit_model=True),
    ),
    "fsdp2": dict(
        distributed_type="FSDP",
        fsdp_config=dict(
            fsdp_version=2,
            fsdp_auto_wrap_policy="TRANSFORMER_BASED_WRAP",
            fsdp_reshard_after_forward=True,
            fsdp_state_dict_type="FULL_STATE_DICT",
            fsdp_cpu_ram_efficient_loading=False,
        ),
    ),
}


def text_length(completions, **kwargs) -> list[float]:
    """A completion's length in characters / 100 (chat completions: the reply's content): a reward that varies
    within a group of a random model's completions, so the policy loss has a gradient."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [len(t) / 100 for t in texts]


def train_case(algorithm: str, output_dir: str, max_steps: int, resume: bool) -> dict:
    """Train ``algorithm`` on the SmolLM2-shaped model; return what the run logged and where it ran."""
    import torch
    from real_shapes import smollm2_shape_path
    from transformers import AutoTokenizer

    import steadyrl
    from steadyrl.real import arithmetic_dataset

    model_path = smollm2_shape_path()
    pairs = algorithm == "online-dpo"
    config_class, trainer_class = steadyrl.ALGORITHMS[algorithm]
    args = config_class(
        output_dir=output_dir,
        max_steps=max_steps,
        save_steps=2,
        bf16=torch.cuda.is_available(),  # float32 where there is no GPU (a smoke run of this script)
        rollout_batch_size=4 if pairs else 2,
        n_samples_per_prompt=2 if pairs else 4,
        train_batch_size=8,
        micro_train_batch_size=4,
        max_completion_length=16,
        learning_rate=1e-5,
        lr_scheduler_type="constant",  # so a 2-step run resumed to 3 steps has the uninterrupted run's schedule
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    trainer = trainer_class(
        model_path,
        args=args,
        processing_class=tokenizer,
        train_dataset=arithmetic_dataset(size=256),
        reward_funcs=[text_length],
    )
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume or None)
    seconds = time.perf_counter() - start
    trainer.save_model(f"{output_dir}/final")
    parameter = next(trainer.model.parameters())
    logged = [h for h in trainer.state.log_history if "loss" in h]
    checkpoints = sorted(p.name for p in Path(output_dir).glob("checkpoint-*"))
    return dict(
        global_step=trainer.state.global_step,
        seconds=round(seconds, 2),
        device=str(parameter.device),
        parameter_dtype=str(parameter.dtype),
        bf16=trainer.args.bf16,
        peak_cuda_mb=round(torch.cuda.max_memory_allocated() / 2**20) if torch.cuda.is_available() else None,
        logged=[{k: v for k, v in h.items() if k in ("step", "loss", "reward", "kl", "grad_norm")} for h in logged],
        checkpoints=checkpoints,
    )


def weights_distance(a: str, b: str) -> dict:
    """Largest absolute difference between two exported actors, over every tensor."""
    from safetensors.torch import load_file

    wa, wb = load_file(str(Path(a) / "model.safetensors")), load_file(str(Path(b) / "model.safetensors"))
    diffs = {name: (wa[name].float() - wb[name].float()).abs().max().item() for name in wa}
    return dict(max_abs=max(diffs.values()), tensors_differing=sum(d > 0 for d in diffs.values()), tensors=len(diffs))


# ---- driver --------------------------------------------------------------------------------------------------


def run_logged(command: list[str], out: Path, timeout: int, env: dict | None = None) -> tuple[int, str]:
    """Run ``command``, append its output to OUT/log.txt; return its exit status and its last line."""
    with open(out / "log.txt", "a") as log:
        log.write(f"\n===== {' '.join(command)}\n")
        log.flush()
        try:
            done = subprocess.run(command, stdout=subprocess.PIPE, stderr=log, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            log.write(f"===== timed out after {timeout} s\n")
            return 124, ""
        log.write(done.stdout)
        lines = done.stdout.strip().splitlines()
        return done.returncode, lines[-1] if lines else ""


def record(out: Path, **entry) -> None:
    print(json.dumps(entry), flush=True)
    with open(out / "results.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def case(out: Path, name: str, command: list[str], timeout: int, env: dict | None = None) -> dict | None:
    start = time.perf_counter()
    status, last = run_logged(command, out, timeout, env)
    result = None
    if status == 0 and last.startswith("{"):
        result = json.loads(last)
    record(out, case=name, status=status, wall_s=round(time.perf_counter() - start, 1), result=result)
    return result


def accelerate_config(engine: str, directory: Path) -> Path:
    import torch
    import yaml

    gpu = torch.cuda.is_available()  # without one: a CPU smoke run of this script

    config = dict(
        compute_environment="LOCAL_MACHINE",
        num_machines=1,
        num_processes=1,
        machine_rank=0,
        mixed_precision="bf16" if gpu else "no",
        use_cpu=not gpu,
        **ENGINES[engine],
    )
    path = directory / f"{engine}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(opts) -> None:
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(opts.work)
    work.mkdir(parents=True, exist_ok=True)
    me = [sys.executable, __file__]
    parts = opts.parts.split(",")
    if "train" in parts:
        for algorithm in opts.algorithms.split(","):
            directory = str(work / f"train-{algorithm}")
            case(out, f"{algorithm} 2 steps", [*me, "case", algorithm, directory, "2"], opts.timeout)
            case(out, f"{algorithm} resumed to 3", [*me, "case", algorithm, directory, "3", "--resume"], opts.timeout)
    if "train" in parts and "grpo" in opts.algorithms.split(","):
        straight = str(work / "train-grpo-straight")
        case(out, "grpo 3 steps uninterrupted", [*me, "case", "grpo", straight, "3"], opts.timeout)
        resumed = work / "train-grpo" / "final"
        if (Path(straight) / "final").is_dir() and resumed.is_dir():
            record(
                out,
                case="grpo resumed vs uninterrupted, final weights",
                result=weights_distance(f"{straight}/final", str(resumed)),
            )
    if "engines" in parts:
        for engine in opts.engines.split(","):
            config = str(accelerate_config(engine, work))
            directory = str(work / f"engine-{engine}")
            launch = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", config, __file__, "case"]
            case(out, f"rloo {engine} 2 steps", [*launch, "rloo", directory, "2"], opts.timeout)
            case(out, f"rloo {engine} resumed to 3", [*launch, "rloo", directory, "3", "--resume"], opts.timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    spec = sub.add_parser("spec", help="write SmolLM2-135M-Instruct's config and tokenizer (no weights) to DIR")
    spec.add_argument("directory")
    go = sub.add_parser("run", help="run the parts, results into OUT")
    go.add_argument("--out", required=True)
    go.add_argument("--work", default="/tmp/cuda-check")
    go.add_argument("--parts", default="train,engines")
    go.add_argument("--algorithms", default=",".join(ALGORITHMS))
    go.add_argument("--engines", default=",".join(ENGINES))
    go.add_argument("--timeout", type=int, default=120, help="seconds per case")
    one = sub.add_parser("case", help="(internal) one training run; prints its result as JSON")
    one.add_argument("algorithm")
    one.add_argument("output_dir")
    one.add_argument("max_steps", type=int)
    one.add_argument("--resume", action="store_true")
    opts = parser.parse_args()
    if opts.command == "spec":
        from real_shapes import write_smollm2_spec

        write_smollm2_spec(opts.directory)
    elif opts.command == "run":
        run(opts)
    else:
        result = train_case(opts.algorithm, opts.output_dir, opts.max_steps, opts.resume)
        if int(os.environ.get("RANK", "0")) == 0:
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
