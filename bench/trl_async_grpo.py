"""TRL's experimental ``AsyncGRPOTrainer`` beside steadyrl's ``max_staleness=1``: a vLLM server of SmolLM2-135M-Instruct
on core 1, the trainer on core 0, the task and settings of ``bench/async_staleness.py``.

    python bench/trl_async_grpo.py [--steps 6] [--reasoning] [--max_completion_length 256] [--trl-only]

**It does not run on a CPU machine** (tried 2026-11-30 with TRL 1.16, BENCHMARKS.md): TRL's trainer forces its own
attention, ``attn_implementation="tree_fa3"``, whose forward calls FlashAttention-3 from the Hub's ``kernels`` package
(``kernels-community/flash-attn3``, Hopper GPUs; AMD's aiter on ROCm): no CPU path, and a download at run time. The
two obstacles before it are worked around here, so that the script runs as far as TRL allows:
- its constructor reads the CUDA device's name for its MFU metric, which raises on a CPU-only torch: the script
  stands in None, TRL's own value for an unknown device;
- its rollout worker parses replies with response templates it knows by chat template, and refuses SmolLM2's: the
  script sets Qwen's, whose ChatML SmolLM2 shares.

Its weights reach the server over NCCL by default (GPUs only). Its ``weight_transfer`` argument takes any
``WeightTransferProtocol``: here ``FileWeightTransfer`` pauses the server (``/pause?mode=keep``), writes the weights
as safetensors and has vLLM ``reload_weights`` them in place (as steadyrl's ``'file'`` transfer does), then resumes
it. TRL's server is vLLM's own OpenAI server in dev mode, without steadyrl's key (TRL sends none). On a Hopper GPU
with ``kernels`` installed the rest would run; that is untested.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from async_staleness import with_reasoning  # noqa: E402
from launching import answering, start_vllm_server  # noqa: E402


def weighted_reward(completions, answer, **kwargs) -> list[float]:
    """steadyrl's bench rewards with its ``reward_weights=[1.0, 0.2]``: TRL's AsyncGRPO takes no reward weights."""
    from steadyrl.real import answer_format, correct_answer

    right, concise = correct_answer(completions, answer), answer_format(completions)
    return [a + 0.2 * b for a, b in zip(right, concise)]


def post(url: str, path: str, body: dict | None = None, params: str = "") -> None:
    data = json.dumps(body or {}).encode()
    request = urllib.request.Request(f"{url}{path}{params}", data, {"Content-Type": "application/json"}, method="POST")
    urllib.request.urlopen(request, timeout=600).close()


class FileWeightTransfer:
    """TRL's ``WeightTransferProtocol`` through files: pause, write, ``reload_weights``, resume."""

    def __init__(self, url: str, directory: Path) -> None:
        self.url, self.directory, self.version = url, directory, 0

    def init_weight_transfer(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)

    def pause(self) -> None:
        post(self.url, "/pause", params="?mode=keep")

    def send_weights(self, iterator) -> None:
        from safetensors.torch import save_file

        weights = {name: tensor.detach().cpu().contiguous().clone() for name, tensor in iterator}
        if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:  # tied: vLLM needs both
            weights["lm_head.weight"] = weights["model.embed_tokens.weight"].clone()
        self.version += 1
        path = self.directory / f"v{self.version}"
        path.mkdir()
        save_file(weights, str(path / "model.safetensors"))
        post(self.url, "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(path)}})
        post(self.url, "/reset_prefix_cache")

    def resume(self) -> None:
        post(self.url, "/resume")

    def destroy(self) -> None:
        pass


def start_plain_vllm(model: str, log: Path, max_model_len: int) -> tuple[subprocess.Popen, str]:
    """vLLM's own OpenAI server (dev mode, no key) on core 1."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        "taskset", "-c", "1", sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
        "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32", "--max-model-len", str(max_model_len),
        "--enforce-eager", "--generation-config", "vllm", "--logprobs-mode", "processed_logprobs",
    ]  # fmt: skip
    env = {
        **os.environ,
        "VLLM_SERVER_DEV_MODE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "1",
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True, env=env)
    return proc, answering(proc, f"http://127.0.0.1:{port}", log)


def trl_run(url: str, out: Path, steps: int, completion_length: int, reasoning: bool, resume: bool = False) -> dict:
    """TRL's AsyncGRPOTrainer for ``steps`` steps (1 prompt x 8 completions a step, max_staleness 1): steps per
    second over steps 2..N, and the prompts each step trained on."""
    import torch
    import trl.experimental.async_grpo.async_grpo_trainer as trl_async
    from transformers import TrainerCallback
    from trl.experimental.async_grpo import AsyncGRPOConfig, AsyncGRPOTrainer

    # TRL 1.16 reads the CUDA device's name for its MFU metric in the constructor, which raises without CUDA ("Torch
    # not compiled with CUDA enabled"); None is its own answer for an unknown device (MFU off)
    trl_async.get_peak_flops_per_device = lambda accelerator, dtype: None

    from steadyrl.real import arithmetic_dataset, smollm2_path

    torch.set_num_threads(1)
    train = arithmetic_dataset("train")
    if reasoning:
        train = with_reasoning(train)

    class StepTimes(TrainerCallback):
        def __init__(self):
            self.ends = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    args = AsyncGRPOConfig(
        output_dir=str(out),
        num_generations=8,
        per_device_train_batch_size=8,
        max_completion_length=completion_length,
        learning_rate=1e-5,
        lr_scheduler_type="constant",
        vllm_server_base_url=url,
        max_staleness=1,
        weight_sync_steps=1,
        max_steps=steps,
        save_strategy="steps",
        save_steps=1,
        logging_steps=1,
        report_to="none",
        bf16=False,
        dtype="float32",
        seed=0,
        disable_tqdm=True,
        use_cpu=True,
    )
    # TRL's rollout worker parses every reply with a response template, which it knows for a list of chat templates
    # (Qwen, Llama 3, ...) and refuses SmolLM2's ("Unrecognized chat template"); SmolLM2's is ChatML, as Qwen's
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen3_template

    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    tokenizer.response_template = qwen3_template
    times = StepTimes()
    trainer = AsyncGRPOTrainer(
        model=smollm2_path(),
        processing_class=tokenizer,
        reward_funcs=[weighted_reward],
        args=args,
        train_dataset=train,
        callbacks=[times],
        weight_transfer=FileWeightTransfer(url, out / "weights"),
    )
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=resume or None)
    marks = [start, *times.ends]
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    rate = (len(marks) - 2) / (marks[-1] - marks[1]) if len(marks) > 2 else float("nan")
    return {"steps_per_second": rate, "logs": logs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--max_completion_length", type=int, default=256)
    parser.add_argument("--reasoning", action="store_true")
    parser.add_argument("--trl-only", action="store_true", help="skip steadyrl's run (its figure from async_staleness)")
    opts = parser.parse_args()
    from steadyrl.real import smollm2_path

    os.sched_setaffinity(0, {0})
    work = Path(tempfile.mkdtemp(prefix="trl-async-"))
    proc, url = start_plain_vllm(smollm2_path(), work / "trl-server.log", 512 + opts.max_completion_length)
    try:
        trl = trl_run(url, work / "trl", opts.steps, opts.max_completion_length, opts.reasoning)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
    results = {"trl": {"steps_per_second": trl["steps_per_second"]}}
    if not opts.trl_only:
        from async_staleness import run

        server, url = start_vllm_server(
            smollm2_path(),
            work / "server.log",
            "--max-model-len",
            str(512 + opts.max_completion_length),
            "--dtype",
            "float32",
            cores="1",
            env={"VLLM_CPU_OMP_THREADS_BIND": "1", "OMP_NUM_THREADS": "1"},
        )
        try:
            ours = run(url, 1, opts.steps, str(work / "steadyrl"), False, opts.max_completion_length, 1,
                       "token_truncate", 0, opts.steps, 0, opts.reasoning)  # fmt: skip
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait()
        results["steadyrl"] = {"steps_per_second": ours["steps_per_second"]}
    print(json.dumps(results))
    print(json.dumps([{k: e.get(k) for k in ("step", "loss", "reward")} for e in trl["logs"]]))


if __name__ == "__main__":
    main()
