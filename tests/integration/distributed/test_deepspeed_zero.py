"""DeepSpeed ZeRO-2, ZeRO-3 and ZeRO-3 with CPU offload under ``accelerate launch`` (two processes, gloo on CPU):
each trains like DDP, resumes exactly after a SIGKILL, and exports its sharded actor whole. A file of its own so
that pytest-xdist can run it beside tests/integration/distributed/test_distributed.py."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import TWO_PROCESSES, ZERO, read_logs, run_toy
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from integration.resume.test_resume import assert_same_result, assert_trains_as

# ZeRO-2 with PPO only: its two engines cover RLOO's one, and ZeRO-3 runs both (each pair costs a minute of CI), and
# distillation, whose frozen teacher is partitioned beside the student. Offload with RLOO: ZeRO-3 PPO covers the
# critic's engine, and offloaded PPO cost 3 minutes of CI.
ZERO_RUNS = [
    ("zero2", "ppo"),
    ("zero3", "rloo"),
    ("zero3", "ppo"),
    ("zero3", "distillation"),
    ("zero3_offload", "rloo"),
]
# ZeRO-3 RLOO runs padded (packing=false) against the packed DDP run: packed and padded passes train alike across
# engines (the other runs are packed, as by default).
PADDED = {("zero3", "rloo")}
LOGGED = {
    "ppo": ("reward", "kl", "critic_grad_norm", "value_loss"),
    "rloo": ("reward", "kl"),
    "distillation": ("divergence",),
}


@pytest.fixture(scope="module", params=ZERO_RUNS, ids=[f"{stage}-{algo}" for stage, algo in ZERO_RUNS])
def zero_run(request, tmp_path_factory, toy_path):
    """An uninterrupted 2-process run under DeepSpeed ZeRO-2, ZeRO-3 or ZeRO-3 with CPU offload of optimizer and
    parameters (its first use compiles DeepSpeedCPUAdam), with the live actor written after step 6."""
    stage, algorithm = request.param
    out = tmp_path_factory.mktemp(f"{stage}-{algorithm}")
    flags = ["--save-live-actor", "6", *run_flags(stage, algorithm)]
    run_toy(out, *flags, accelerate_config=ZERO[stage])
    return stage, algorithm, out


def run_flags(stage: str, algorithm: str) -> list[str]:
    return ["--algorithm", algorithm, *TWO_PROCESSES, *(["packing=false"] if (stage, algorithm) in PADDED else [])]


def test_zero_trains_like_ddp_and_checkpoints_each_optimizer_partition(zero_run, ddp_runs):
    stage, algorithm, out = zero_run
    ddp, zero = read_logs(ddp_runs(algorithm)), read_logs(out)
    keys = ("loss", "grad_norm", *LOGGED[algorithm])
    for step in range(1, 13):  # same data, same seeds: only the order of floating-point sums may differ
        for key in keys:
            assert zero[step][key] == pytest.approx(ddp[step][key], rel=1e-4, abs=1e-5), (step, key)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in (12, 3, 6, 9)]
    names = {p.name for p in (out / "checkpoint-6").iterdir()}
    assert {"optimizer_0.pt", "optimizer_1.pt", "rollout_buffer_0.safetensors", "rollout_buffer_1.safetensors"} <= names
    if algorithm == "ppo":
        assert {"critic_optimizer_0.pt", "critic_optimizer_1.pt", "critic"} <= names
    for rank in (0, 1):  # the loss scaler's numbers, as plain values (fp32 here: a static scale of 1)
        state = torch.load(out / "checkpoint-6" / f"optimizer_{rank}.pt", weights_only=True)
        assert state["loss_scaler"]["cur_scale"] == 1
    if stage.startswith("zero3"):  # each process holds the AdamW state of half the parameters, not of all of them
        whole = sum(t.numel() for t in load_file(out / "checkpoint-6" / "model.safetensors").values())
        for rank in (0, 1):
            state = torch.load(out / "checkpoint-6" / f"optimizer_{rank}.pt", weights_only=True)
            assert sum(p.numel() for p in state["fp32_partitions"]) <= whole // 2 + 64
            # layers are released after use: the training passes never hold the whole actor gathered at once
            # (DeepSpeed's default reuse distance of 1e9 kept all of it gathered)
            gathered = json.loads((out / f"gathered-6-{rank}.json").read_text())
            assert gathered["peak"] <= gathered["total"] // 2, gathered
            assert gathered["generation_peak"] == gathered["total"], gathered  # ds3_gather_for_generation=True


def test_zero_sigkill_after_a_checkpoint_resumes_identically(zero_run, tmp_path):
    stage, algorithm, out = zero_run
    flags = run_flags(stage, algorithm)
    run_toy(tmp_path, "--kill-after-save", "6", *flags, expect_kill=True, accelerate_config=ZERO[stage])
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    _, output = run_toy(tmp_path, "--resume", *flags, accelerate_config=ZERO[stage])
    assert output.count("Resuming from") == 2 and "checkpoint-6" in output
    assert_same_result(out, tmp_path, after_step=6)


RESHARDED = [("zero2", "ppo"), ("zero3", "rloo"), ("zero3_offload", "rloo")]


@pytest.mark.parametrize("zero_run", RESHARDED, indirect=True, ids=[f"{stage}-{algo}" for stage, algo in RESHARDED])
def test_zero_resumes_on_one_process_and_back_on_two_training_what_it_would_have(zero_run, tmp_path):
    """checkpoint-6 (mid-rollout) of the 2-process run resumed on 1 process, then that run's checkpoint-9, which
    holds 1 partition per optimizer, resumed on 2: each process's partitions are cut again from the saved ones."""
    stage, algorithm, out = zero_run
    flags, one, two = run_flags(stage, algorithm), tmp_path / "one", tmp_path / "two"
    shutil.copytree(out / "checkpoint-6", one / "checkpoint-6")
    _, output = run_toy(one, "--resume", *flags, accelerate_config=ZERO[stage], processes=1)
    assert "world_size 2 -> 1" in output, output[-3000:]
    assert_trains_as(out, one, after_step=6)
    saved = {path.name for path in (one / "checkpoint-9").glob("*optimizer*.pt")}
    assert saved == {"optimizer_0.pt", *(["critic_optimizer_0.pt"] if algorithm == "ppo" else [])}
    shutil.copytree(one / "checkpoint-9", two / "checkpoint-9")
    _, output = run_toy(two, "--resume", *flags, accelerate_config=ZERO[stage])
    assert "world_size 1 -> 2" in output, output[-3000:]
    assert_trains_as(out, two, after_step=9)


def test_export_of_a_zero3_checkpoint_equals_the_live_actor(zero_run, tmp_path):
    stage, _, out = zero_run
    if not stage.startswith("zero3"):
        pytest.skip(reason="ZeRO-3 partitions the actor's weights; under ZeRO-2 every process holds them whole")
    proc = subprocess.run(
        [sys.executable, "-m", "steadyrl", "export", out / "checkpoint-6", tmp_path / "model"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    live = load_file(out / "live-actor-6.safetensors")
    assert live.keys() <= exported.keys()
    for name, weights in live.items():
        assert torch.equal(exported[name], weights), name


def test_zero3_generates_partitioned_without_gathering(ddp_runs, tmp_path):
    """ds3_gather_for_generation=False (TRL's name): HF generate runs with the actor partitioned, each layer gathered
    by DeepSpeed for each forward pass and the processes stepping together; the completions, and so every reward
    and loss, are those of the DDP run."""
    flags = ["--algorithm", "rloo", "--save-live-actor", "6", *TWO_PROCESSES, "ds3_gather_for_generation=false"]
    run_toy(tmp_path, *flags, accelerate_config=ZERO["zero3"])
    for rank in (0, 1):  # generation held no more of the actor whole at once than training does
        gathered = json.loads((tmp_path / f"gathered-6-{rank}.json").read_text())
        assert 0 < gathered["generation_peak"] <= gathered["total"] // 2, gathered
    ddp, zero = read_logs(ddp_runs("rloo")), read_logs(tmp_path)
    for step in range(1, 13):
        assert zero[step]["reward"] == ddp[step]["reward"], step  # the same completions
        for key in ("loss", "grad_norm", "kl"):
            assert zero[step][key] == pytest.approx(ddp[step][key], rel=1e-4, abs=1e-5), (step, key)
