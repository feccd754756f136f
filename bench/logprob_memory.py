"""Peak memory and time of one log-prob + backward pass over a long completion at Qwen2.5's 151,936-token vocabulary:
steadyrl's chunked LM head (log-probs from the hidden states, ``completion_logprobs``), steadyrl's logits path
(``chunked_head=False``: [B, C, V] logits, log-softmax a few rows at a time) and TRL's ``ChunkedLogProbFunction``
(trl/kernels/chunked_logprob.py, on the same hidden states and head weight).

    python bench/logprob_memory.py [--lengths 1024 4096 16384] [--methods chunked logits trl] [--threads 1]

One sequence: 16 prompt tokens and C completion tokens. The model is an embedding, one hidden layer and an untied
nn.Linear LM head (hidden 64): the head and its [C, V] logits are what grow with C. Each case runs in a fresh
process: a warm-up pass at C = 64, then the measured pass (log-probs and entropy at temperature 0.7, backward of a
weighted sum of the log-probs). The peak is the process's high-water RSS during the pass (reset through
/proc/self/clear_refs) minus its RSS just before. The logits path and TRL run at C > 4096 only with more than 22 GB
available (the logits path's peak is about 3.8 x C x V x 4 bytes: 9.5 GB at 4k, about 38 GB at 16k).
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

VOCAB, HIDDEN, PROMPT, TEMPERATURE = 151_936, 64, 16, 0.7
BIG_CASE_NEEDS_GB = 22


def make_model():
    import torch
    from torch import nn

    class HeadHeavyLM(nn.Module):
        """A causal LM in miniature: embedding, one tanh layer, an untied LM head; takes ``logits_to_keep``."""

        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(VOCAB, HIDDEN)
            self.layer = nn.Linear(HIDDEN, HIDDEN)
            self.lm_head = nn.Linear(HIDDEN, VOCAB, bias=False)

        def get_output_embeddings(self):
            return self.lm_head

        def hidden_states(self, input_ids):
            return torch.tanh(self.layer(self.embed_tokens(input_ids)))

        def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False, logits_to_keep=0):
            return SimpleNamespace(logits=self.lm_head(self.hidden_states(input_ids)[:, -logits_to_keep:]))

    torch.manual_seed(0)
    return HeadHeavyLM()


def rss_mb(field: str) -> float:
    with open("/proc/self/status") as status:
        line = next(line for line in status if line.startswith(field + ":"))
    return int(line.split()[1]) / 1024


def one_pass(method: str, model, tokens) -> tuple[float, float]:
    """Sum of the log-probs and the LM head's gradient norm after one forward + backward."""
    import torch

    from steadyrl.ops import completion_logprobs

    model.zero_grad(set_to_none=True)
    if method == "trl":
        from trl.kernels.chunked_logprob import ChunkedLogProbFunction

        from steadyrl.ops import joined_inputs

        hidden = model.hidden_states(joined_inputs(*tokens.values())["input_ids"])[:, PROMPT - 1 : -1]
        targets = tokens["completion_ids"].reshape(-1)
        weight, chunk = model.lm_head.weight, 32768  # TRL's GRPO trainer's vocabulary chunk
        logprobs, entropy, *_ = ChunkedLogProbFunction.apply(
            hidden.reshape(-1, HIDDEN), weight, None, targets, TEMPERATURE, chunk, None, 1.0, ("entropy",)
        )
    else:
        logprobs, entropy = completion_logprobs(
            model, *tokens.values(), temperature=TEMPERATURE, with_entropy=True, chunked_head=method == "chunked"
        )
    weights = torch.linspace(-1, 1, logprobs.numel()).view(logprobs.shape)
    (logprobs * weights).sum().backward()
    return float(logprobs.detach().sum()), float(model.lm_head.weight.grad.norm())


def run_case(method: str, length: int) -> dict:
    import torch

    from steadyrl.ops import pad_prompts_and_completions

    model = make_model()
    generator = torch.Generator().manual_seed(1)

    def tokens_of(width):
        ids = torch.randint(3, VOCAB, (PROMPT + width,), generator=generator).tolist()
        return pad_prompts_and_completions([ids[:PROMPT]], [ids[PROMPT:]], pad_token_id=0)

    one_pass(method, model, tokens_of(64))  # warm-up
    tokens = tokens_of(length)
    model.zero_grad(set_to_none=True)
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
    before = rss_mb("VmRSS")
    start = time.perf_counter()
    logprob_sum, head_grad_norm = one_pass(method, model, tokens)
    seconds = time.perf_counter() - start
    return {
        "method": method,
        "length": length,
        "seconds": round(seconds, 2),
        "peak_mb": round(rss_mb("VmHWM") - before),
        "logprob_sum": logprob_sum,
        "head_grad_norm": head_grad_norm,
    }


def available_gb() -> float:
    with open("/proc/meminfo") as meminfo:
        return next(int(line.split()[1]) for line in meminfo if line.startswith("MemAvailable:")) / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--methods", nargs="+", default=["chunked", "logits", "trl"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--case", nargs=2, metavar=("METHOD", "LENGTH"), help=argparse.SUPPRESS)
    parser.add_argument("--output", default="bench-output/logprob_memory.json")
    args = parser.parse_args()
    if args.case:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(run_case(args.case[0], int(args.case[1]))))
        return
    results = []
    for length in args.lengths:
        for method in args.methods:
            if method != "chunked" and length > 4096 and available_gb() <= BIG_CASE_NEEDS_GB:
                result = {"method": method, "length": length, "skipped": f"{available_gb():.0f} GB available"}
            else:
                env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
                command = [sys.executable, __file__, "--case", method, str(length), "--threads", str(args.threads)]
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    result = {"method": method, "length": length, "failed": done.stderr.strip().splitlines()[-1:]}
                else:
                    result = json.loads(done.stdout.strip().splitlines()[-1])
            print(json.dumps(result), flush=True)
            results.append(result)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(results, indent=1))
    print("\n| C | method | peak RSS above baseline (MB) | seconds |\n|---|---|---|---|")
    for r in results:
        cells = (r.get("peak_mb", r.get("skipped") or r.get("failed")), r.get("seconds", "-"))
        print(f"| {r['length']} | {r['method']} | {cells[0]} | {cells[1]} |")


if __name__ == "__main__":
    main()
