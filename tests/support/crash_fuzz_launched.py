"""Crash fuzzing of a run launched on several processes (``accelerate launch``): SIGKILL the whole launch (the
launcher and every training process) at seeded random moments, resume after each kill, and check that the final
actor is byte-identical to an uninterrupted launch and that every step logged the same values.

    python tests/support/crash_fuzz_launched.py WORK_DIR --config ACCELERATE_YAML [--kills 3] [--seed 0]
                                                [-- toy_run.py flags, e.g. --algorithm grpo --set ...]

Each launch is killed once a seeded random checkpoint after the last one is written, a random part of a step later
(the uninterrupted launch's time per step): during generation on a vLLM server, a weight push, training or a
checkpoint write. Every kill therefore lands after progress; a launch that finishes first ends the fuzzing. Writes
``WORK_DIR/report.json``; exits 1 with the reason on the first difference.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for conftest's helpers

from conftest import read_logs, toy_command  # noqa: E402


def launch(output_dir: Path, config: Path, flags: list[str], resume: bool) -> subprocess.Popen:
    """Start a launch; its output goes to ``output_dir``'s parent, ``<name>.log`` (the last launch's; ``failure``
    prints its end)."""
    command = toy_command(output_dir, *flags, *(["--resume"] if resume else []), accelerate_config=config)
    with open(log_of(output_dir), "w") as log:
        return subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the kill reaches the launcher and every worker
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def log_of(output_dir: Path) -> Path:
    return output_dir.parent / f"{output_dir.name}.log"


def failure(message: str, output_dir: Path) -> int:
    """Say why the fuzzing stops, with the first traceback and the end of the failed launch's output; return 1."""
    output = log_of(output_dir).read_text(errors="replace")
    start = output.find("Traceback (most recent call last)")
    first = "" if start < 0 else output[max(0, start - 500) : start + 4000] + "\n[...]\n"
    print(f"{message}\n{first}{output[-3000:]}", file=sys.stderr)
    return 1


def kill_launch(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every training process it started: torch's launcher starts each in a session of its
    own, which a kill of the launcher's process group leaves running (and holding its memory)."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    os.killpg(proc.pid, signal.SIGKILL)
    for child in family:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(family, timeout=30)


def has_checkpoint(output_dir: Path) -> bool:
    return last_checkpoint(output_dir) > 0


def last_checkpoint(output_dir: Path) -> int:
    """The step of the newest complete-looking ``checkpoint-N`` (0: none)."""
    steps = [int(path.name.split("-")[1]) for path in output_dir.glob("checkpoint-*") if path.name[11:].isdigit()]
    return max(steps, default=0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--config", type=Path, required=True)
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    opts, flags = parser.parse_args(argv[:split]), argv[split + 1 :]
    reference, fuzzed = opts.work_dir / "reference", opts.work_dir / "fuzzed"
    reference.mkdir(parents=True, exist_ok=True)
    fuzzed.mkdir(parents=True, exist_ok=True)
    start, proc = time.monotonic(), launch(reference, opts.config, flags, resume=False)
    while proc.poll() is None and not has_checkpoint(reference):
        time.sleep(0.05)
    startup = time.monotonic() - start  # to the first checkpoint: start-up and the first step
    if proc.wait() != 0:
        return failure("the uninterrupted launch failed", reference)
    duration, steps = time.monotonic() - start, max(read_logs(reference))
    rng, events = random.Random(opts.seed), []
    per_step = (duration - startup) / max(steps - 1, 1)
    for kill in range(opts.kills):
        last = last_checkpoint(fuzzed)
        if last >= steps - 1:
            break
        reach = max(1, (steps - 1 - last) // (opts.kills - kill))  # the kills spread over the run
        target = last + rng.randint(1, reach)  # killed at a random moment of the step after checkpoint-target
        delay = rng.uniform(0.0, per_step)
        proc = launch(fuzzed, opts.config, flags, resume=True)  # without a checkpoint: from the start
        while proc.poll() is None and last_checkpoint(fuzzed) < target:
            time.sleep(0.02)
        time.sleep(delay)
        status = proc.poll()
        if status is None:
            kill_launch(proc)
        events.append({"resumed_from": last, "after_checkpoint": target, "delay_s": round(delay, 3)})
        events[-1]["finished_first"] = status is not None
        if status not in (None, 0):
            return failure(f"a launch failed with status {status} before its kill: {events[-1]}", fuzzed)
        if status == 0:
            break
    if not events or not events[-1]["finished_first"]:
        status = launch(fuzzed, opts.config, flags, resume=True).wait()
        if status != 0:
            return failure(f"the final resumed launch failed with status {status}: {events}", fuzzed)
    same = (fuzzed / "final-actor" / "model.safetensors").read_bytes() == (
        reference / "final-actor" / "model.safetensors"
    ).read_bytes()
    ours, theirs = read_logs(fuzzed), read_logs(reference)
    differing = [
        (step, key)
        for step, entry in theirs.items()
        for key, value in entry.items()
        if not key.startswith("async/") and "per_second" not in key and ours.get(step, {}).get(key) != value
    ]
    report = {"events": events, "identical_actor": same, "differing_logs": differing[:10], "duration_s": duration}
    (opts.work_dir / "report.json").write_text(json.dumps(report, indent=1))
    if not same or differing:
        print(f"the fuzzed run differs from the uninterrupted one: {report}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
