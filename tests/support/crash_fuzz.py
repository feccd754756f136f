"""Crash fuzzing: SIGKILL a toy training run at seeded random moments, resume it after each kill, and check that
nothing a resume would accept was ever wrong and that the final actor is byte-identical to an uninterrupted run.

    python tests/support/crash_fuzz.py WORK_DIR [--algorithm rloo|ppo|online-dpo|grpo] [--kills 10] [--seed 0]
                                [--vision qwen2_5_vl|llava_next] [--set key=value ...]

A driver process imports everything once and forks each training attempt, so an attempt costs its own work, not
Python's start-up. Half the kills (chosen by the seeded RNG) land at a random moment of the run; the other half
wait for the next checkpoint write to start and land a random few milliseconds into it. After each kill every
``checkpoint-N`` that passes verification must hold the reference run's exact actor and optimizer for step N.
Writes ``WORK_DIR/report.json``; exits 1 with the reason on the first violation.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for support.* when run as a script

from steadyrl.checkpoint import scan_checkpoints  # noqa: E402
from steadyrl.generation.server_auth import RUN_ID_NAME  # noqa: E402
from support.toy_run import make_trainer, parse_overrides, vision_task  # noqa: E402

COMPARED = ("model.safetensors", "optimizer.pt", "scheduler.pt", "steadyrl_state.json", "rng_state_0.json")


def train_in_child(output_dir: Path, algorithm: str, overrides: dict, resume: bool) -> int:
    """Fork a process that trains (resuming if asked) and writes ``final-actor``; return its pid."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            trainer = make_trainer(output_dir, algorithm=algorithm, **overrides)
            trainer.train(resume_from_checkpoint=True if resume else None)
            trainer.save_model(str(output_dir / "final-actor"))
            (output_dir / "log_history.json").write_text(json.dumps(trainer.state.log_history))
            code = 0
        except BaseException:
            traceback.print_exc()  # os._exit below would end the child before the error is printed
        finally:
            os._exit(code)
    return pid


def alive(pid: int) -> bool:
    """Whether the child still runs (a finished child stays a zombie, unreaped, until ``os.waitpid``)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def watch_saves(output_dir: Path, pid: int) -> list[float]:
    """Wait for the child to end, timing each checkpoint write (how long a ``tmp-checkpoint-*`` existed)."""
    started: dict[str, float] = {}
    durations = []
    while alive(pid):
        now, present = time.monotonic(), {p.name for p in output_dir.glob("tmp-checkpoint-*")}
        for name in present - set(started):
            started[name] = now
        for name in [name for name in started if name not in present]:
            durations.append(now - started.pop(name))
        time.sleep(0.002)
    return durations


def wait_for_new_save(output_dir: Path, seen: set[str], pid: int, deadline: float) -> bool:
    """Poll until a checkpoint write not in ``seen`` starts; False if the child ended or time ran out first."""
    while time.monotonic() < deadline:
        started = {p.name for p in output_dir.glob("tmp-checkpoint-*")} - seen
        if started:
            seen.update(started)
            return True
        if not alive(pid):
            return False
        time.sleep(0.002)
    return False


def manifest_hashes(checkpoint: Path) -> dict[str, str]:
    files = json.loads((checkpoint / "manifest.json").read_text())["files"]
    return {name: files[name]["sha256"] for name in COMPARED if name in files}


def check_checkpoints(output_dir: Path, reference: Path) -> tuple[list[int], list[str]]:
    """Steps of the checkpoints a resume would accept, after checking each against the reference run."""
    scan = scan_checkpoints(output_dir)
    for step, path in scan.complete:
        expected = manifest_hashes(reference / f"checkpoint-{step}")
        got = manifest_hashes(path)
        if got != expected:
            differing = sorted(name for name in expected if got.get(name) != expected[name])
            raise AssertionError(f"{path} passes verification but differs from the reference in {differing}")
    return [step for step, _ in scan.complete], [f"{path.name}: {reason}" for path, reason in scan.rejected]


def run_to_end(output_dir: Path, algorithm: str, overrides: dict, resume: bool) -> tuple[float, list[float]]:
    """Train to the end in a child; return the wall time and the duration of each checkpoint write."""
    start = time.monotonic()
    pid = train_in_child(output_dir, algorithm, overrides, resume)
    save_durations = watch_saves(output_dir, pid)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise AssertionError(f"training in {output_dir} failed with status {os.waitstatus_to_exitcode(status)}")
    return time.monotonic() - start, save_durations


def fuzz(work: Path, algorithm: str, kills: int, seed: int, overrides: dict) -> dict:
    rng = random.Random(seed)
    if overrides.get("use_vllm"):  # imported once here, not in every forked attempt
        from steadyrl.generation.vllm import import_vllm

        import_vllm()
    reference, run = work / "reference", work / "run"
    duration, saves = run_to_end(reference, algorithm, {**overrides, "save_total_limit": None}, resume=False)
    save_time = statistics.median(saves) if saves else 0.05
    events, saves_seen = [], set()
    while sum(event["killed"] for event in events) < kills:
        pid = train_in_child(run, algorithm, overrides, resume=True)
        started = time.monotonic()
        mode = rng.choice(["anytime", "in-save"])
        if mode == "anytime":
            time.sleep(rng.uniform(0, duration / 2))
        elif not wait_for_new_save(run, saves_seen, pid, deadline=started + 2 * duration):
            mode = "no save started"
        else:
            time.sleep(rng.uniform(0, save_time))
        os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, -signal.SIGKILL):
            raise AssertionError(f"a training attempt in {run} failed with status {code}")
        killed = code == -signal.SIGKILL
        complete, rejected = check_checkpoints(run, reference)
        events.append(
            dict(
                mode=mode,
                killed=killed,
                after_s=round(time.monotonic() - started, 3),
                complete=complete,
                rejected=rejected,
            )
        )
        print(f"attempt {len(events)}: {events[-1]}", flush=True)
        if not killed:  # the run finished before the kill: start another one, keeping the checks so far
            final_check(run, reference)
            finished = work / f"finished-{len(events)}"
            os.rename(run, finished)
            # the next run is the same run to the vLLM server (its claim's id): a fresh run at the same path would be
            # another run, refused while a killed attempt's claim stands (generation/server_auth.py run_id)
            run.mkdir()
            if (finished / RUN_ID_NAME).is_file():
                shutil.copy(finished / RUN_ID_NAME, run / RUN_ID_NAME)
    run_to_end(run, algorithm, overrides, resume=True)
    final_check(run, reference)
    return {"reference_seconds": round(duration, 2), "median_save_seconds": round(save_time, 3), "events": events}


def final_check(run: Path, reference: Path) -> None:
    if (run / "final-actor" / "model.safetensors").read_bytes() != (
        reference / "final-actor" / "model.safetensors"
    ).read_bytes():
        raise AssertionError(f"{run}/final-actor differs from the uninterrupted run's")

    def timing(key: str) -> bool:  # wall-clock measures (a step's, the summary's): a resumed run's differ
        return (
            key.endswith("_per_second") or key == "train_runtime" or (key.startswith("async/") and key.endswith("_s"))
        )

    ref_logs = json.loads((reference / "log_history.json").read_text())
    logs = json.loads((run / "log_history.json").read_text())
    strip = [{k: v for k, v in entry.items() if not timing(k)} for entry in logs]
    if strip != [{k: v for k, v in entry.items() if not timing(k)} for entry in ref_logs]:
        raise AssertionError(f"{run}: the logged metrics differ from the uninterrupted run's")
    check_checkpoints(run, reference)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("work_dir", type=Path)
    parser.add_argument("--algorithm", default="rloo")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vision", help="a vision-language stand-in on coloured squares (toy_run.py's --vision)")
    parser.add_argument("--set", nargs="*", default=[], help="config overrides key=value (JSON values)")
    opts = parser.parse_args()
    overrides = parse_overrides(opts.set)
    if opts.vision:
        overrides = {**vision_task(opts.vision, opts.algorithm), **overrides}
    try:
        report = fuzz(opts.work_dir, opts.algorithm, opts.kills, opts.seed, overrides)
    except AssertionError as err:
        print(f"FAILED: {err}", flush=True)
        sys.exit(1)
    (opts.work_dir / "report.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
