"""Memory a merged LoRA push costs: steadyrl's merge from the live weights against PEFT's ``merge_and_unload`` on the
base model loaded again (what a merged push did before, and what a PEFT user does), on SmolLM2-135M-Instruct.

    python bench/merge_memory.py [--rounds 2]

Each measurement runs in a process of its own: it loads the model, wraps it in a LoRA adapter (``r=16``, non-zero
weights) on ``q_proj`` and ``v_proj``, or on every linear layer, saves the adapter, then samples its RSS every 2 ms
while it merges. The extra memory is the peak RSS during the merge minus the RSS just before it. The two merges'
weights are compared by their sum (tests/integration/publish/test_hub.py checks them equal tensor by tensor).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGETS = {
    "q_proj,v_proj": ["q_proj", "v_proj"],
    "every linear": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}


def rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2**20


def peak_during(work) -> tuple[object, float]:
    """``work()``'s result and the most RSS (MB) above the RSS before it, sampled every 2 ms. The heap's free pages
    are returned to the system first (``malloc_trim``), so that reusing them does not hide what the work allocates."""
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    before, peak, done = rss_mb(), [0.0], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], rss_mb())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = work()
    finally:
        done.set()
        sampler.join()
    return result, max(peak[0], rss_mb()) - before


def measure(method: str, targets: str) -> dict:
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    from steadyrl.generation.weights import plain_state_dict
    from steadyrl.real import smollm2_path

    torch.manual_seed(0)
    base = smollm2_path()
    config = LoraConfig(r=16, lora_alpha=32, target_modules=TARGETS[targets], init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), config)
    with tempfile.TemporaryDirectory() as adapter:
        model.save_pretrained(adapter)
        if method == "live":
            weights, extra = peak_during(lambda: plain_state_dict(model, adapted_to="cpu"))
        else:

            def reload_and_merge():
                fresh = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
                return PeftModel.from_pretrained(fresh, adapter).merge_and_unload().state_dict()

            weights, extra = peak_during(reload_and_merge)
        digest = sum(float(t.double().sum()) for t in weights.values())
    return {"method": method, "targets": targets, "extra_mb": extra, "digest": digest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "TARGETS"), help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        print(json.dumps(measure(*opts.worker)))
        return
    rows = {}
    for _ in range(opts.rounds):
        for targets in TARGETS:
            for method in ("live", "reload"):
                out = subprocess.run(
                    [sys.executable, __file__, "--worker", method, targets], check=True, capture_output=True, text=True
                ).stdout
                result = json.loads(out.strip().splitlines()[-1])
                rows.setdefault((targets, method), []).append(result)
    print("| LoRA targets | steadyrl: merge from the live weights | PEFT: base loaded again + merge_and_unload |")
    print("|---|---|---|")
    for targets in TARGETS:
        live, reload = rows[(targets, "live")], rows[(targets, "reload")]
        same = all(abs(a["digest"] - b["digest"]) <= 1e-6 * abs(b["digest"]) for a, b in zip(live, reload))
        print(
            f"| {targets} | {max(r['extra_mb'] for r in live):.0f} MB | {max(r['extra_mb'] for r in reload):.0f} MB"
            f"{'' if same else ' (results differ!)'} |"
        )


if __name__ == "__main__":
    main()
