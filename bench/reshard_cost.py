"""What a checkpoint costs under ZeRO-3 and FSDP2, and what resuming it on another number of processes costs.

    python bench/reshard_cost.py [--engines zero3,fsdp2] [--output_dir bench-output/reshard_cost]

SmolLM2-135M-Instruct on the arithmetic task (tests/support/toy_run.py --real: RLOO, HF generate), under
``accelerate launch`` with 2 CPU processes (gloo), ``micro_rollout_batch_size=2``. Per engine:

1. a fresh 2-process run of 3 steps saving every step: save seconds (``save_checkpoint``'s wall time on process 0,
   the median of the 3), checkpoint size and the optimizer files' share of it;
2. checkpoint-1 resumed on 2 processes (the same number) and on 1 (2 -> 1), each to step 2; the 1-process run's
   checkpoint-2 resumed on 2 (1 -> 2) to step 3. Load seconds: from ``train()`` to ``on_train_begin`` on process 0
   (finding and verifying the checkpoint, weights, optimizer state, scheduler, loop state).

One CPU process runs without FSDP (nothing to shard over), so FSDP2's 2 -> 1 puts the shards together whole. Each
run is a fresh launch (launching.py); its worker is this file with ``--worker``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from launching import ROOT, launch_worker  # noqa: E402


def worker(output_dir: str, max_steps: int, resume: bool, result: str) -> None:
    """One process of a launched run: the real-model RLOO run of toy_run.py with its saves and load timed."""
    sys.path.insert(0, str(ROOT / "tests"))
    from support.toy_run import REAL_DEFAULTS, make_trainer, real_task
    from transformers import TrainerCallback

    class LoadClock(TrainerCallback):
        begin = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.begin = time.perf_counter()

    clock = LoadClock()
    overrides = {**REAL_DEFAULTS, **real_task(), "micro_rollout_batch_size": 2, "save_steps": 1, "max_steps": max_steps}
    trainer = make_trainer(output_dir, callbacks=[clock], **overrides)
    saves, save = [], trainer.save_checkpoint

    def timed_save(*args, **kwargs):
        start = time.perf_counter()
        path = save(*args, **kwargs)
        saves.append(time.perf_counter() - start)
        return path

    trainer.save_checkpoint = timed_save
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=True if resume else None)
    if trainer.is_world_process_zero():
        Path(result).write_text(json.dumps({"saves": saves, "load_s": clock.begin - start if resume else None}))
    trainer.accelerator.end_training()
    sys.stdout.flush()
    os._exit(0)  # as toy_run.py: gloo may abort a finished process in interpreter teardown


def launch(engine: str, processes: int, output_dir: Path, max_steps: int, resume: bool) -> dict:
    flags = ["--max_steps", str(max_steps), *(["--resume"] if resume else [])]
    return launch_worker(__file__, engine, *flags, processes=processes, output_dir=output_dir)


def size_mb(path: Path, pattern: str = "*") -> float:
    return sum(p.stat().st_size for p in path.rglob(pattern) if p.is_file()) / 2**20


def resumed(engine: str, source: Path, out: Path, processes: int, max_steps: int) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(source, out / source.name)
    return launch(engine, processes, out, max_steps, resume=True)


def bench(engine: str, out: Path, same_only: bool) -> dict:
    fresh = out / f"{engine}-fresh"
    shutil.rmtree(fresh, ignore_errors=True)
    first = launch(engine, 2, fresh, 3, resume=False)
    checkpoint = fresh / "checkpoint-1"
    same = resumed(engine, checkpoint, out / f"{engine}-same", 2, 2)
    result = {
        "engine": engine,
        "save_s": statistics.median(first["saves"]),
        "size_mb": size_mb(checkpoint),
        "optimizer_mb": size_mb(checkpoint, "*optimizer*.pt"),
        "load_same_s": same["load_s"],
    }
    if same_only:  # a steadyrl that refuses another number of processes
        return result
    two_to_one = resumed(engine, checkpoint, out / f"{engine}-2to1", 1, 2)
    one_to_two = resumed(engine, out / f"{engine}-2to1" / "checkpoint-2", out / f"{engine}-1to2", 2, 3)
    return {
        **result,
        "one_process_size_mb": size_mb(out / f"{engine}-2to1" / "checkpoint-2"),
        "load_2to1_s": two_to_one["load_s"],
        "load_1to2_s": one_to_two["load_s"],
    }


def main() -> None:
    if "--worker" in sys.argv:
        parser = argparse.ArgumentParser()
        parser.add_argument("--worker", action="store_true")
        parser.add_argument("--output_dir")
        parser.add_argument("--max_steps", type=int)
        parser.add_argument("--result")
        parser.add_argument("--resume", action="store_true")
        opts = parser.parse_args()
        worker(opts.output_dir, opts.max_steps, opts.resume, opts.result)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="zero3,fsdp2")
    parser.add_argument("--output_dir", default="bench-output/reshard_cost")
    parser.add_argument("--same_only", action="store_true", help="only the same number of processes (older steadyrl)")
    opts = parser.parse_args()
    out = Path(opts.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for engine in opts.engines.split(","):
        results.append(bench(engine, out, opts.same_only))
        for run in out.glob(f"{engine}-*"):  # a SmolLM2 checkpoint is 1.5-2 GB: up to 18 GB per engine
            shutil.rmtree(run)
        print(json.dumps(results[-1]), flush=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))
    print(
        "\n| engine | save s | checkpoint MB (optimizer files) | 1-process checkpoint MB | load s, same 2 | "
        "load s, 2 -> 1 | load s, 1 -> 2 |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['engine']} | {r['save_s']:.2f} | {r['size_mb']:.0f} ({r['optimizer_mb']:.0f}) | "
            f"{r.get('one_process_size_mb', float('nan')):.0f} | {r['load_same_s']:.2f} | "
            f"{r.get('load_2to1_s', float('nan')):.2f} | {r.get('load_1to2_s', float('nan')):.2f} |"
        )


if __name__ == "__main__":
    main()
