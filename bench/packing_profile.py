"""Where a training pass's time goes, packed against padded, on SmolLM2-135M-Instruct at a bench/vs_trl.py shape.

    python bench/packing_profile.py [--prompt 150] [--completions 8] [--max_completion 256] [--repeats 2]

One micro-batch of one prompt group (``--completions`` completions of lengths spread evenly from a tenth of
``--max_completion`` to all of it, a fixed seed), the log-probs and entropy with their backward pass as GRPO's loss
takes them, gradient checkpointing on, float32, one torch thread. For each of ``packing=False`` and ``True``: the
median wall time of ``--repeats`` passes after one warm-up, the positions computed, and a torch profiler table of one
pass grouped as: attention (``scaled_dot_product_attention``, recomputed and backward), the LM head's log-probs (the
chunked head's forward and backward) and the rest (the layers' projections and MLPs, norms, RoPE).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

# top-level profiler events (their time includes their children's) -> group
GROUPS = {
    "attention": ("aten::scaled_dot_product_attention", "ScaledDotProduct", "FlashAttention"),
    "LM head (log-probs)": ("ChunkedHeadLogProbs",),
}


def batch(tokenizer, prompt_tokens: int, completions: int, longest: int):
    from steadyrl.ops import pad_prompts_and_completions

    generator = torch.Generator().manual_seed(0)
    vocab = torch.arange(1000, 20000)
    prompt = vocab[torch.randint(len(vocab), (prompt_tokens,), generator=generator)].tolist()
    lengths = torch.linspace(longest // 10, longest, completions).long().tolist()
    rows = [vocab[torch.randint(len(vocab), (n,), generator=generator)].tolist() for n in lengths]
    return tuple(pad_prompts_and_completions([prompt] * completions, rows, tokenizer.pad_token_id).values())


def one_pass(model, tokens, packing: bool) -> None:
    from steadyrl.ops import completion_logprobs

    logprobs, entropy = completion_logprobs(model, *tokens, with_entropy=True, packing=packing)
    mask = tokens[3]
    ((logprobs * mask).sum() + 0.01 * (entropy * mask).sum()).backward()


def grouped_profile(model, tokens, packing: bool) -> dict[str, float]:
    """Seconds of one pass in attention (forward, recomputed and backward), in the LM head's log-probs (forward and
    backward) and in the rest (the layers' projections and MLPs, norms, RoPE, ...), from the profiler's totals."""
    from torch.profiler import ProfilerActivity, profile

    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        one_pass(model, tokens, packing)
    seconds = {"total": time.perf_counter() - start}
    for event in prof.key_averages():
        name = event.key
        top = name == "aten::scaled_dot_product_attention" or name == "ChunkedHeadLogProbs"
        top = top or name.startswith("autograd::engine::evaluate_function:")
        for group, needles in GROUPS.items():
            if top and any(needle in name for needle in needles):
                seconds[group] = seconds.get(group, 0.0) + event.cpu_time_total / 1e6
    seconds["rest"] = seconds["total"] - sum(seconds.get(g, 0.0) for g in GROUPS)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=150)
    parser.add_argument("--completions", type=int, default=8)
    parser.add_argument("--max_completion", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    opts = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from steadyrl.ops.packing import pack_shared_prompts
    from steadyrl.real import smollm2_path

    path = smollm2_path()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    tokens = batch(tokenizer, opts.prompt, opts.completions, opts.max_completion)
    print(f"prompt {opts.prompt} tokens, completions {tokens[3].sum(1).tolist()}")
    print("| pass | positions | s (median) | profiled: attention s | LM head s | rest s |")
    print("|---|---|---|---|---|---|")
    for packing in (False, True):
        one_pass(model, tokens, packing)  # warm-up (and the packing probe)
        times = []
        for _ in range(opts.repeats):
            model.zero_grad()
            start = time.perf_counter()
            one_pass(model, tokens, packing)
            times.append(time.perf_counter() - start)
        groups = grouped_profile(model, tokens, packing)
        positions = pack_shared_prompts(*tokens).positions if packing else tokens[0].numel() + tokens[2].numel()
        parts = " | ".join(f"{groups.get(g, 0.0):.2f}" for g in ("attention", "LM head (log-probs)", "rest"))
        print(f"| {'packed' if packing else 'padded'} | {positions} | {statistics.median(times):.2f} | {parts} |")


if __name__ == "__main__":
    main()
