"""The reliability suite: seeded crash fuzzing, a full disk, a long run with rotation, and stop signals.

CI runs it with 10 kills per trainer (6 for the one that starts a vLLM engine each time);
``STEADYRL_FUZZ_KILLS=100 pytest -m reliability`` runs more.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TOY_RUN, read_logs, run_entries, run_toy
from support.toy_run import make_trainer
from transformers import TrainerCallback

from steadyrl.checkpoint import CheckpointError, scan_checkpoints, verify_checkpoint

pytestmark = pytest.mark.reliability

KILLS = int(os.environ.get("STEADYRL_FUZZ_KILLS", "10"))
# fewer for the run whose every attempt starts a vLLM engine (the first 5 kills of seed 0 land in checkpoint writes)
KILLS_OF = {"rloo-vllm": int(os.environ.get("STEADYRL_FUZZ_KILLS", "6"))}
FUZZ_RUNS = {  # save every step, so kills land in checkpoint writes and rotations as often as in training
    "rloo-vllm": ("rloo", ["use_vllm=true", "vllm_dtype=float32"]),
    "ppo": ("ppo", []),
    "online-dpo": ("online-dpo", []),
    "distillation": ("distillation", []),
    "grpo": ("grpo", ["beta=0.04", "loss_type=dapo"]),
    # half the prompts get a constant reward: each rollout draws 2 or more batches of prompts, and a kill lands
    # between draws as often as anywhere else
    "grpo-dynamic-sampling": ("grpo", ["beta=0.04", "reward_funcs=half_constant", "dynamic_sampling=true"]),
    # a vision-language stand-in: the rollout buffer's image tensors in every mid-rollout checkpoint
    "grpo-vision": ("grpo", ["beta=0.04", "--vision", "qwen2_5_vl"]),
}


@pytest.mark.parametrize("name", sorted(FUZZ_RUNS))
def test_crash_fuzzing_resumes_to_the_uninterrupted_result(tmp_path, toy_path, name):
    algorithm, overrides = FUZZ_RUNS[name]
    flags = overrides[overrides.index("--vision") :] if "--vision" in overrides else []
    settings = ["save_steps=1", "save_total_limit=2", "max_steps=8", *overrides[: len(overrides) - len(flags)]]
    cmd = [sys.executable, str(ROOT / "tests" / "support" / "crash_fuzz.py"), str(tmp_path), "--algorithm", algorithm]
    kills = KILLS_OF.get(name, KILLS)
    cmd += ["--kills", str(kills), "--seed", "0", *flags, "--set", *settings]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    events = json.loads((tmp_path / "report.json").read_text())["events"]
    assert sum(event["killed"] for event in events) == kills, events
    assert any(event["mode"] == "in-save" and event["rejected"] for event in events), "no kill hit a write"


def test_full_disk_stops_with_the_path_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import torch

    trainer, real_save = make_trainer(tmp_path), torch.save

    def save_until_the_disk_fills(obj, path, *args, **kwargs):  # from the save at step 6 on
        if trainer.state.global_step >= 6:
            raise OSError(28, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_until_the_disk_fills)
    with pytest.raises(CheckpointError) as err:
        trainer.train()
    message = str(err.value)
    assert f"Could not write the checkpoint {tmp_path / 'tmp-checkpoint-6'}" in message
    assert "No space left on device" in message and f"{tmp_path / 'checkpoint-3'}, is intact" in message
    assert run_entries(tmp_path) == ["checkpoint-3"]
    monkeypatch.undo()
    resumed = make_trainer(tmp_path, max_steps=4)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 4


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for a private tmpfs")
def test_really_full_filesystem(tmp_path, uninterrupted_run):
    """A 60 MiB tmpfs holds one 37 MB toy checkpoint but not two: the second save fails on a real ENOSPC, naming the
    path, and checkpoint-3 stays loadable. Once the filesystem has room (remounted larger, as a user frees space), the
    same command with --resume ends with the uninterrupted run's weights, byte for byte, and its logged metrics."""
    out, kept = tmp_path / "out", tmp_path / "kept"
    out.mkdir(), (kept / "failed").mkdir(parents=True)
    train = f"{sys.executable} {TOY_RUN} {out}"
    script = (
        f"mount -t tmpfs -o size=60m tmpfs {out} && {{ {train} > {kept}/failed.log 2>&1; echo $? > {kept}/rc; "
        f"cp -a {out}/. {kept}/failed/; mount -o remount,size=256m {out} && {train} --resume > {kept}/resumed.log "
        f"2>&1; echo $? > {kept}/rc_resumed; ls {out} > {kept}/entries; cp -a {out}/final-actor {out}/log_history.json "
        f"{kept}/; }}"
    )
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if not (kept / "rc").exists():
        pytest.skip(reason=f"no private tmpfs here (user namespaces disabled?): {proc.stderr.strip()[-300:]}")
    failed, resumed = ((kept / name).read_text() for name in ("failed.log", "resumed.log"))
    assert (kept / "rc").read_text().strip() != "0", failed[-3000:]
    assert f"CheckpointError: Could not write the checkpoint {out / 'tmp-checkpoint-6'}" in failed, failed[-3000:]
    # torch's writer reports the full disk as "RuntimeError: [enforce fail at inline_container.cc:...] unexpected
    # pos", without an errno: less room than a checkpoint takes tells it is full all the same
    assert "free space on its filesystem: " in failed and f"{out / 'checkpoint-3'}, is intact" in failed
    assert "MiB a checkpoint takes. The partial directory was removed" in failed and "Free some space" in failed
    assert sorted(p.name for p in (kept / "failed").iterdir() if p.is_dir()) == ["checkpoint-3"]
    verify_checkpoint(kept / "failed" / "checkpoint-3")
    assert (kept / "rc_resumed").read_text().strip() == "0", resumed[-3000:]
    entries = (kept / "entries").read_text().split()
    assert [e for e in entries if e.startswith(("checkpoint-", "tmp-"))] == [f"checkpoint-{s}" for s in (12, 3, 6, 9)]
    reference = uninterrupted_run("rloo")
    assert (kept / "final-actor" / "model.safetensors").read_bytes() == (
        reference / "final-actor" / "model.safetensors"
    ).read_bytes()
    ref_logs, logs = read_logs(reference), read_logs(kept)
    timings = {"tokens_per_second"}
    assert [{k: v for k, v in logs[s].items() if k not in timings} for s in range(1, 13)] == [
        {k: v for k, v in ref_logs[s].items() if k not in timings} for s in range(1, 13)
    ]


class CheckpointWatch(TrainerCallback):
    """Record global_step at every step end and the checkpoint directories after every save."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir, self.steps, self.on_disk = output_dir, [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)

    def on_save(self, args, state, control, **kwargs):
        self.on_disk.append(sorted(p.name for p in self.output_dir.iterdir() if p.is_dir()))


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A one-layer model small enough that 300 checkpoints take seconds."""
    from steadyrl.toy import build_model, build_tokenizer

    directory = tmp_path_factory.mktemp("tiny-model")
    tokenizer = build_tokenizer()
    build_model(
        tokenizer,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
    ).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


def test_long_run_saving_every_step_keeps_the_last_three(tmp_path, tiny_model):
    watch = CheckpointWatch(tmp_path)
    steps = 300
    trainer = make_trainer(
        tmp_path,
        model=tiny_model,
        callbacks=[watch],
        max_steps=steps,
        save_steps=1,
        save_total_limit=3,
        max_completion_length=4,
        num_ppo_epochs=4,
    )
    trainer.train()
    assert watch.steps == list(range(1, steps + 1))
    for after, names in enumerate(watch.on_disk, start=1):
        expected = [f"checkpoint-{s}" for s in range(max(1, after - 2), after + 1)]
        assert sorted(names, key=lambda n: int(n.split("-")[1])) == expected, f"after save {after}: {names}"
    remaining = [step for step, _ in scan_checkpoints(tmp_path).complete]
    assert remaining == [steps - 2, steps - 1, steps] and not scan_checkpoints(tmp_path).rejected
    for step in remaining:
        run = tmp_path / f"resume-{step}"
        shutil.copytree(tmp_path / f"checkpoint-{step}", run / f"checkpoint-{step}")
        resumed = make_trainer(
            run, model=tiny_model, max_steps=step + 1, save_steps=1, max_completion_length=4, num_ppo_epochs=4
        )
        resumed.train(resume_from_checkpoint=True)
        assert resumed.state.global_step == step + 1


def test_sigterm_finishes_the_step_checkpoints_and_exits_143(uninterrupted_run, tmp_path):
    # SIGTERM arrives as step 5 begins: step 5 completes, checkpoint-5 is written (save_steps=3), and the exit status
    # is 128 + 15, which a Kubernetes Job or a SLURM requeue reads as unfinished (0 would end the job for good)
    _, output = run_toy(tmp_path, "--signal-at", "4", expect_status=143)
    assert "Received SIGTERM" in output and "Stopped by SIGTERM after step 5" in output
    assert run_entries(tmp_path) == ["checkpoint-3", "checkpoint-5"]
    assert json.loads((tmp_path / "checkpoint-5" / "trainer_state.json").read_text())["global_step"] == 5
    run_toy(tmp_path, "--resume")
    uninterrupted_rloo = uninterrupted_run("rloo")
    ref = (uninterrupted_rloo / "final-actor" / "model.safetensors").read_bytes()
    assert (tmp_path / "final-actor" / "model.safetensors").read_bytes() == ref
    ref_logs, logs = read_logs(uninterrupted_rloo), read_logs(tmp_path)
    assert [{k: v for k, v in logs[s].items() if k != "tokens_per_second"} for s in range(6, 13)] == [
        {k: v for k, v in ref_logs[s].items() if k != "tokens_per_second"} for s in range(6, 13)
    ]


def test_sigint_from_outside_stops_cleanly(tmp_path, toy_path):
    """Ctrl-C (SIGINT sent by another process while the run trains) also ends in a checkpoint, with status 130."""
    cmd = [sys.executable, str(TOY_RUN), str(tmp_path), "--set", "max_steps=200"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in proc.stdout:  # the first logged step
            if "'loss'" in line:
                break
        proc.send_signal(2)
        output, _ = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, output[-3000:]
    newest = scan_checkpoints(tmp_path).newest
    step = json.loads((newest / "trainer_state.json").read_text())["global_step"]
    assert f"Stopped by SIGINT after step {step}" in output and 1 <= step < 200


def test_a_signal_during_the_last_step_lets_the_run_complete(uninterrupted_run, tmp_path):
    # SIGTERM as step 12 of 12 begins: the run is complete after it, so it ends as one (status 0, the final actor)
    _, output = run_toy(tmp_path, "--signal-at", "11")
    assert "Received SIGTERM" in output and "Stopped by" not in output
    ref = (uninterrupted_run("rloo") / "final-actor" / "model.safetensors").read_bytes()
    assert (tmp_path / "final-actor" / "model.safetensors").read_bytes() == ref


def test_second_signal_exits_at_once(tmp_path, toy_path):
    proc = subprocess.run(
        [sys.executable, str(TOY_RUN), str(tmp_path), "--signal-at", "4", "--signal-again"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == -15, proc.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == ["checkpoint-3"]
    assert "Stopped by" not in proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "code, says, advice",
    [
        (errno.EROFS, ": its filesystem is read-only.", "Point output_dir at a writable filesystem"),
        (errno.EACCES, ": permission denied.", "Give this process write permission on output_dir"),
        (errno.EIO, "; free space on its filesystem: ", "Fix the cause of this error"),
    ],
)
def test_failed_save_names_its_cause(tmp_path, monkeypatch, code, says, advice):
    """A read-only filesystem or a denied permission (which cannot be produced as root here: the OSError is
    injected into torch.save) is named as such; only a full disk is answered with advice to free space."""
    import torch

    def failing_save(obj, path, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(path))

    trainer = make_trainer(tmp_path, max_steps=1, save_steps=1)
    monkeypatch.setattr(torch, "save", failing_save)
    with pytest.raises(CheckpointError) as raised:
        trainer.train()
    message = str(raised.value)
    kind = "PermissionError" if code == errno.EACCES else "OSError"  # OSError(EACCES, ...) makes a PermissionError
    assert message.startswith(f"Could not write the checkpoint {tmp_path / 'tmp-checkpoint-1'} ({kind}: [Errno {code}]")
    assert says in message and advice in message and "resume_from_checkpoint=True" in message, message
    assert "Free some space" not in message and "The partial directory was removed" in message


def test_failed_save_finds_the_os_error_along_the_exception_chain(tmp_path):
    from steadyrl.checkpoint.save_failure import save_failure_message

    tmp = tmp_path / "tmp-checkpoint-4"
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as disk:
            raise RuntimeError("PytorchStreamWriter failed writing file data/0") from disk
    except RuntimeError as explicit:
        assert "Free some space" in save_failure_message(tmp, explicit)
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError:
            raise RuntimeError("file write failed")  # noqa: B904 (an implicit __context__, as libraries leave it)
    except RuntimeError as implicit:
        message = save_failure_message(tmp, implicit)
        assert "(RuntimeError: file write failed): its filesystem is read-only." in message
    quota = save_failure_message(tmp, OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert "but the disk quota is used up" in quota and "Free some space" in quota
    unknown = save_failure_message(tmp, RuntimeError("file write failed"))
    assert "Free some space" not in unknown and "Fix the cause of this error" in unknown
