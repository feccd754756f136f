"""Generation on a separate vLLM server (vllm_mode='server') vs the colocated in-process engine, on this machine.

    python bench/vllm_server_vs_colocated.py [--rounds 5] [--completion_length 64] [--models toy,25m]

For each model: a server started with ``steadyrl vllm-serve`` on a free local port, and a colocated engine in this
process, each given the same weights (seeded noise on the model) and asked for the same 64 completions (16 prompts x
4 samples, sampling at temperature 1, one seed each) in turn. Reported: median generated tokens/s, and median
seconds per weight push (a new version each time: the state dict as safetensors + the server's in-place reload,
vs the in-process reload). On one machine the server competes with the trainer for the same CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from launching import start_vllm_server  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402
from vllm_vs_hf import model_25m_path  # noqa: E402

from steadyrl.generation import SamplingSettings, sampling_seed  # noqa: E402
from steadyrl.generation.vllm import EngineSettings, VLLMGenerationBackend  # noqa: E402
from steadyrl.generation.vllm_server import ServerSettings, VLLMServerBackend  # noqa: E402
from steadyrl.toy import toy_dataset, toy_model_path  # noqa: E402

MAX_MODEL_LEN = 256


def noisy(model, version: int):
    generator = torch.Generator().manual_seed(version)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 1e-3)
    return model


def bench_model(name: str, path: str, rounds: int, completion_length: int, out: Path) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    prompts = [tokenizer(p)["input_ids"] for p in toy_dataset()["prompt"][:16] for _ in range(4)]
    settings = SamplingSettings(max_new_tokens=completion_length, temperature=1.0)
    out.mkdir(parents=True, exist_ok=True)
    proc, url = start_vllm_server(path, out / f"{name}-server.log", "--max-model-len", str(MAX_MODEL_LEN))
    try:
        backends = {
            "server": VLLMServerBackend(
                tokenizer,
                settings,
                ServerSettings(
                    base_url=url,
                    timeout=600,
                    weight_transfer="file",
                    weights_dir=str(out / f"{name}-weights"),
                    group_host="",
                    group_port=0,
                    model=path,
                    max_model_len=MAX_MODEL_LEN,
                    dtype="float32",
                    logprobs_mode="processed_logprobs",
                ),
            ),
            "colocated": VLLMGenerationBackend(
                tokenizer,
                settings,
                EngineSettings(max_model_len=MAX_MODEL_LEN, dtype="float32", logprobs_mode="processed_logprobs"),
                torch.device("cpu"),
            ),
        }
        samples = {backend: {"tokens_per_second": [], "push_s": []} for backend in backends}
        for version in range(rounds + 1):  # version 0: warm-up
            noisy(model, version)
            seeds = [sampling_seed(0, version, i // 4, i % 4) for i in range(len(prompts))]
            for backend_name, backend in backends.items():
                start = time.perf_counter()
                backend.sync_weights(model, version)
                push = time.perf_counter() - start
                start = time.perf_counter()
                generation = backend.generate(model, prompts, seeds)
                seconds = time.perf_counter() - start
                if version:
                    tokens = sum(len(ids) for ids in generation.completion_ids)
                    samples[backend_name]["tokens_per_second"].append(tokens / seconds)
                    samples[backend_name]["push_s"].append(push)
        for backend in backends.values():
            backend.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    result = {"model": name, "parameters": sum(p.numel() for p in model.parameters()), "rounds": rounds}
    for backend_name, rows in samples.items():
        for key, values in rows.items():
            result[f"{backend_name}_{key}"] = statistics.median(values)
    result["tokens_per_second_ratio"] = result["server_tokens_per_second"] / result["colocated_tokens_per_second"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--completion_length", type=int, default=64)
    parser.add_argument("--models", default="toy,25m")
    parser.add_argument("--output_dir", default="bench-output")
    opts = parser.parse_args()
    paths = {"toy": toy_model_path, "25m": model_25m_path}
    out = Path(opts.output_dir)
    results = [
        bench_model(name, paths[name](), opts.rounds, opts.completion_length, out) for name in opts.models.split(",")
    ]
    print(json.dumps(results, indent=1))
    print(
        f"\nmachine: {os.cpu_count()} CPU cores; 64 completions x up to {opts.completion_length} new tokens; "
        f"medians of {opts.rounds} rounds"
    )
    print("| model | params | colocated tok/s | server tok/s | ratio | colocated push s | server push s |")
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['parameters'] / 1e6:.1f}M | {r['colocated_tokens_per_second']:.0f} | "
            f"{r['server_tokens_per_second']:.0f} | {r['tokens_per_second_ratio']:.2f}x | "
            f"{r['colocated_push_s']:.3f} | {r['server_push_s']:.3f} |"
        )


if __name__ == "__main__":
    main()
