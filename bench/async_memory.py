"""Memory of generation ahead (``max_staleness``) on 2 training processes (DDP on the CPU), against a vLLM server:
each process's peak RSS with ``max_staleness=1`` and with 0 (synchronous), and the copies of the actor's weights
held for requests not generated yet (``async/weight_copies_mb/max``, the largest of any process, as each rollout is
handed over).

    python bench/async_memory.py [--models smollm2,qwen05b-shape] [--steps 4]

Only the main process (the driver, which generates every process's rollouts) holds a copy; the others hold none.
Each run: GRPO, 2 prompts x 4 completions of 8 tokens a step, SGD (no optimizer state, so that the 0.5B shape fits
beside its server on this machine), float32, the server on core 1.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from launching import start_vllm_server  # noqa: E402

MODELS = ("smollm2", "qwen05b-shape")


def model_task(model: str):
    """``(model path, train_dataset, reward function)``."""
    import real_shapes

    if model == "qwen05b-shape":
        return real_shapes.qwen05b_shape_path(), real_shapes.word_prompts(512, 32), real_shapes.word_overlap
    return real_shapes.task(model, 32)


def worker(opts) -> None:
    """One training process: train, then write its peak RSS and the logged copies of the weights."""
    import psutil
    import torch
    from transformers import TrainerCallback

    from steadyrl import GRPOConfig, GRPOTrainer

    class Rss(TrainerCallback):
        def __init__(self):
            self.by_step = {}

        def on_step_end(self, args, state, control, **kwargs):
            self.by_step[state.global_step] = psutil.Process().memory_info().rss / 2**20

    torch.set_num_threads(1)
    path, dataset, reward = model_task(opts.model)
    args = GRPOConfig(
        output_dir=opts.output_dir,
        num_generations=4,
        per_device_train_batch_size=4,
        max_completion_length=8,
        learning_rate=1e-6,
        optim="sgd",
        lr_scheduler_type="constant",
        gradient_checkpointing=False,
        use_vllm=True,
        vllm_mode="server",
        vllm_server_base_url=opts.url,
        vllm_dtype="float32",
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate",
        max_staleness=opts.staleness,
        max_steps=opts.steps,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        bf16=False,
        use_cpu=True,
        disable_tqdm=True,
    )
    rss = Rss()
    from real_shapes import load_tokenizer

    trainer = GRPOTrainer(
        model=path,
        reward_funcs=[reward],
        args=args,
        train_dataset=dataset,
        processing_class=load_tokenizer(path),
        callbacks=[rss],
    )
    trainer.train()
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    report = {
        "rank": trainer.accelerator.process_index,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_mb_by_step": rss.by_step,
        "weight_copies_mb": [entry.get("async/weight_copies_mb/max") for entry in logs],
        "parameters": sum(p.numel() for p in trainer.model.parameters()),
    }
    Path(opts.report).with_suffix(f".{report['rank']}.json").write_text(json.dumps(report))
    trainer.accelerator.end_training()
    sys.stdout.flush()
    os._exit(0)  # as the example scripts do (docs/ddp.md): gloo may abort a finished process at interpreter exit


def measure(model: str, steps: int, directory: Path) -> dict:
    path, _, _ = model_task(model)
    server, url = start_vllm_server(path, directory / f"server-{model}.log", "--max-model-len", "1024", cores="1")
    results = {}
    try:
        for staleness in (0, 1):
            report = directory / f"{model}-{staleness}"
            config = ROOT / "examples" / "accelerate_configs" / "multi_cpu.yaml"
            cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
            cmd += ["--num_processes", "2"]
            cmd += [__file__, "worker", "--model", model, "--url", url, "--staleness", str(staleness)]
            cmd += ["--steps", str(steps), "--output_dir", str(directory / f"run-{model}-{staleness}")]
            cmd += ["--report", str(report)]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
            results[staleness] = [json.loads(report.with_suffix(f".{rank}.json").read_text()) for rank in (0, 1)]
    finally:
        os.killpg(server.pid, signal.SIGKILL)
    return results


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", nargs="?", default="measure", choices=["measure", "worker"])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--model")
    parser.add_argument("--url")
    parser.add_argument("--staleness", type=int)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--output_dir")
    parser.add_argument("--report")
    opts = parser.parse_args()
    if opts.mode == "worker":
        worker(opts)
        return
    with tempfile.TemporaryDirectory() as tmp:
        for model in opts.models.split(","):
            results = measure(model, opts.steps, Path(tmp))
            for staleness, ranks in results.items():
                for r in ranks:
                    copies = [round(v, 1) for v in r["weight_copies_mb"] if v is not None]
                    print(
                        f"{model} staleness={staleness} rank={r['rank']} parameters={r['parameters']} "
                        f"peak_rss_mb={r['peak_rss_mb']:.0f} weight_copies_mb={copies}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
