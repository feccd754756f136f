"""Bytes moved and seconds per weight sync of a LoRA actor to vLLM: adapter-only (``vllm_lora_sync='adapter'``)
against merged weights (``'merged'``), on SmolLM2-135M-Instruct with a typical LoRA (r=16 on q, k, v, o, gate, up,
down projections).

    python bench/lora_sync_bytes.py [--rounds 5] [--no-server]

Colocated: one in-process engine per mode (the adapter-only one with ``enable_lora``); after its first sync (which
starts the engine and, for adapter-only, pushes the base weights once), ``--rounds`` syncs of new versions, the
adapter's B moved between them, timed around ``backend.sync_weights``. Server: a ``steadyrl vllm-serve`` of the
model with ``--max-lora-rank 16`` on a free local port, the same syncs through ``VLLMServerBackend`` ('file'
transfer of the merged state dict, or the adapter over the authenticated ``/steadyrl/lora_adapter`` route).
With the synced weights, the colocated engine's median generated tokens/s for 64 completions (16 prompts x 4
samples, up to 64 new tokens): what serving the adapter (vLLM's LoRA kernels at every forward) costs generation.
Bytes: merged, the state dict vLLM receives (every weight, each adapted one merged; a tied weight once, though the
'file' transfer writes it twice: ``merged_file_bytes``); adapter-only, the adapter's tensors (and the safetensors
body the server route receives, its header and config included).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402
from launching import start_vllm_server  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from steadyrl.generation import SamplingSettings  # noqa: E402
from steadyrl.generation.lora_sync import adapter_bytes, adapter_state, engine_rank  # noqa: E402
from steadyrl.generation.vllm import EngineSettings, VLLMGenerationBackend  # noqa: E402
from steadyrl.generation.vllm_server import ServerSettings, VLLMServerBackend  # noqa: E402
from steadyrl.generation.weights import plain_state_dict  # noqa: E402
from steadyrl.real import smollm2_path  # noqa: E402

RANK = 16
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
MAX_MODEL_LEN = 256  # as bench/vllm_server_vs_colocated.py's server


def lora_actor(path: str):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return get_peft_model(model, LoraConfig(r=RANK, lora_alpha=32, target_modules=TARGETS, init_lora_weights=False))


@torch.no_grad()
def update(model, step: int) -> None:
    """A new version of the adapter (its B moved), as an optimizer step makes one."""
    generator = torch.Generator().manual_seed(step)
    for name, param in model.named_parameters():
        if "lora_B" in name:
            param.add_(torch.randn(param.shape, generator=generator) * 1e-3)


def tensor_bytes(tensors: dict[str, torch.Tensor]) -> int:
    """The bytes of ``tensors``, a tensor that shares memory with an earlier one (tied embeddings) counted once."""
    seen, total = set(), 0
    for tensor in tensors.values():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset())
        total += 0 if key in seen else tensor.numel() * tensor.element_size()
        seen.add(key)
    return total


def timed_syncs(backend, model, rounds: int) -> dict:
    start = time.perf_counter()
    backend.sync_weights(model, version=0)
    first = time.perf_counter() - start
    times = []
    for version in range(1, rounds + 1):
        update(model, version)
        start = time.perf_counter()
        backend.sync_weights(model, version)
        times.append(time.perf_counter() - start)
    return {
        "first_sync_s": round(first, 3),
        "sync_s_median": round(statistics.median(times), 4),
        "sync_s": [round(t, 4) for t in times],
    }


def generation_speed(backend, model, tokenizer, rounds: int) -> float:
    """Median generated tokens/s for 64 completions (16 prompts x 4, up to 64 new tokens, temperature 1)."""
    from steadyrl.real import arithmetic_dataset

    texts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False)
        for p in arithmetic_dataset(size=16)["prompt"]
    ]
    prompts = [tokenizer(text)["input_ids"] for text in texts for _ in range(4)]
    speeds = []
    for round_ in range(rounds + 1):  # the first is a warm-up
        start = time.perf_counter()
        generation = backend.generate(model, prompts, seeds=[round_ * 1000 + i for i in range(len(prompts))])
        if round_:
            speeds.append(sum(map(len, generation.completion_ids)) / (time.perf_counter() - start))
    return round(statistics.median(speeds), 1)


def colocated(path: str, tokenizer, model, mode: str, rounds: int) -> dict:
    engine = EngineSettings(
        max_model_len=MAX_MODEL_LEN,
        dtype="float32",
        logprobs_mode="processed_logprobs",
        lora_rank=engine_rank(RANK) if mode == "adapter" else None,
    )
    settings = SamplingSettings(max_new_tokens=64, temperature=1.0)
    backend = VLLMGenerationBackend(tokenizer, settings, engine, torch.device("cpu"))
    try:
        result = timed_syncs(backend, model, rounds)
        result["generated_tokens_per_s"] = generation_speed(backend, model, tokenizer, 3)
        return result
    finally:
        backend.close()


def served(path: str, tokenizer, model, rounds: int, out: Path) -> dict:
    proc, url = start_vllm_server(
        path, out / "server.log", "--max-model-len", str(MAX_MODEL_LEN), "--max-lora-rank", str(RANK)
    )
    results = {}
    try:
        for mode in ("merged", "adapter"):
            settings = ServerSettings(
                base_url=url,
                timeout=240,
                weight_transfer="file",
                weights_dir=str(out / "weights"),
                group_host="",
                group_port=0,
                model=path,
                max_model_len=MAX_MODEL_LEN,
                dtype="float32",
                logprobs_mode="processed_logprobs",
                output_dir=str(out / mode),
                adapter_rank=RANK if mode == "adapter" else None,
            )
            backend = VLLMServerBackend(tokenizer, SamplingSettings(max_new_tokens=8), settings)
            try:
                results[mode] = timed_syncs(backend, model, rounds)
            finally:
                backend.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--no-server", action="store_true", help="colocated engines only")
    parser.add_argument("--out", default=str(ROOT / "bench-output" / "lora_sync_bytes"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = smollm2_path()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = lora_actor(path)
    tensors, config = adapter_state(model)
    report = {
        "model": "SmolLM2-135M-Instruct (float32)",
        "lora": f"r={RANK} on {','.join(TARGETS)}",
        "merged_bytes": tensor_bytes(plain_state_dict(model)),
        "merged_file_bytes": sum(t.numel() * t.element_size() for t in plain_state_dict(model).values()),
        "base_bytes_once": tensor_bytes(plain_state_dict(model, merged=False)),
        "adapter_bytes": tensor_bytes(tensors),
        "adapter_request_bytes": len(adapter_bytes(tensors, config)),
        "threads": torch.get_num_threads(),
    }
    print(json.dumps(report), flush=True)
    with tempfile.TemporaryDirectory():
        report["colocated"] = {
            mode: colocated(path, tokenizer, model, mode, args.rounds) for mode in ("merged", "adapter")
        }
        print(json.dumps(report["colocated"]), flush=True)
    if not args.no_server:
        report["server"] = served(path, tokenizer, model, args.rounds, out)
    (out / "results.json").write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
