"""What keeping non-finite numbers out of a run costs, at SmolLM2-135M-Instruct's shapes, beside the work it guards.

    python bench/nonfinite_cost.py [--repeats 5] [--output_dir bench-output/nonfinite_cost]

SmolLM2-135M-Instruct (float32, 134.5M parameters) after one AdamW step on a real backward pass (8 sequences of 128
tokens), in this process, each figure the median of ``--repeats``:

1. a save's check (checkpoint/health.py): every weight and the optimizer state checked finite in memory, beside what
   that save writes: ``save_pretrained`` of the weights and ``torch.save`` of the optimizer state;
2. a resume's check of a checkpoint an earlier steadyrl wrote (no ``finite_checked`` mark): its weights and optimizer
   file read back and checked, beside the manifest verification every resume does (sha256 of the same files);
3. the learner's verdict per step: the gradient norm without clipping (``max_grad_norm=0``; with clipping the norm is
   computed anyway) and the verdict, beside the forward and backward pass of the 8 x 128 tokens whose gradients it
   judges (a training step's smallest part: generation and scoring passes come on top).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from steadyrl.checkpoint.health import (  # noqa: E402
    nonfinite_in_checkpoint,
    refuse_nonfinite_state,
    refuse_nonfinite_weights,
)
from steadyrl.trainers.loop.update_guard import verdicts  # noqa: E402


def timed(work, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def sha256_files(directory: Path) -> None:
    for path in sorted(directory.iterdir()):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output_dir", default="bench-output/nonfinite_cost")
    opts = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from steadyrl.real import smollm2_path

    out = Path(opts.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(smollm2_path(), dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    ids = torch.randint(0, model.config.vocab_size, (8, 128), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    params = sum(p.numel() for p in model.parameters())

    checkpoint = out / "checkpoint"
    checkpoint.mkdir(exist_ok=True)

    def save() -> None:
        model.save_pretrained(checkpoint)
        torch.save(optimizer.state_dict(), checkpoint / "optimizer.pt")

    def save_check() -> None:
        refuse_nonfinite_weights(model, "actor")
        refuse_nonfinite_state(optimizer.state_dict(), "the actor's optimizer state")

    results = {
        "parameters": params,
        "save_s": timed(save, opts.repeats),
        "save_check_s": timed(save_check, opts.repeats),
    }
    (checkpoint / "steadyrl_state.json").write_text(json.dumps({"format": 5, "fingerprint": {}}))  # unmarked
    results["resume_verify_s"] = timed(lambda: sha256_files(checkpoint), opts.repeats)
    results["resume_check_s"] = timed(lambda: nonfinite_in_checkpoint(checkpoint), opts.repeats)
    assert nonfinite_in_checkpoint(checkpoint) == []

    grads = [p.grad for p in model.parameters() if p.grad is not None]

    def verdict() -> None:
        norm = float(torch.nn.utils.get_total_norm(grads))
        verdicts({"actor": 0.5}, {"actor": norm})

    def forward_backward() -> None:
        model(input_ids=ids, labels=ids).loss.backward()

    results["forward_backward_s"] = timed(forward_backward, opts.repeats)
    results["verdict_s"] = timed(verdict, opts.repeats)
    results["torch_threads"] = torch.get_num_threads()
    print(json.dumps(results, indent=2))
    (out / "results.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
