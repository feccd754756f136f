"""Two processes under ``accelerate launch`` (gloo on CPU), with DDP and with DeepSpeed ZeRO-2 and ZeRO-3:
checkpoints, exact resume, agreement between the engines, export of a sharded run, and what is refused."""

import subprocess
import sys

import pytest
import torch
from conftest import ROOT, read_logs, run_toy
from safetensors.torch import load_file
from test_resume import assert_same_result
from transformers import AutoModelForCausalLM

from steadyrl.checkpoint import CheckpointError

CONFIGS = ROOT / "examples" / "accelerate_configs"
MULTI_CPU = CONFIGS / "multi_cpu.yaml"
ZERO = {stage: CONFIGS / f"{stage}.yaml" for stage in ("zero2", "zero3", "zero3_offload")}
# each process generates 2 prompts x 2 samples = 4 of the rollout's 8 samples, and accumulates gradients
# over 2 micro-batches of 1 per step (train_batch_size 4 = 1 x 2 processes x 2)
TWO_PROCESSES = ["--set", "micro_rollout_batch_size=4", "micro_train_batch_size=1"]


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory, toy_path):
    """Uninterrupted DDP runs, made on first use, one per algorithm."""
    runs = {}

    def run(algorithm):
        if algorithm not in runs:
            runs[algorithm] = tmp_path_factory.mktemp(f"ddp-{algorithm}")
            run_toy(runs[algorithm], "--algorithm", algorithm, *TWO_PROCESSES, accelerate_config=MULTI_CPU)
        return runs[algorithm]

    return run


@pytest.fixture(scope="module")
def uninterrupted(ddp_runs):
    return ddp_runs("rloo")


def test_checkpoints_land_at_multiples_of_save_steps_with_every_process_state(uninterrupted):
    assert sorted(p.name for p in uninterrupted.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in (12, 3, 6, 9)]
    names = {p.name for p in (uninterrupted / "checkpoint-6").iterdir()}
    for rank in (0, 1):  # checkpoint 6 falls mid-rollout: each process saved its own share of it
        assert {f"rng_state_{rank}.json", f"rank_state_{rank}.json", f"rollout_buffer_{rank}.safetensors"} <= names
    assert sorted(read_logs(uninterrupted)) == list(range(1, 13))


def test_sigkill_of_the_launch_after_a_checkpoint_resumes_identically(uninterrupted, tmp_path):
    run_toy(tmp_path, "--kill-after-save", "6", *TWO_PROCESSES, expect_kill=True, accelerate_config=MULTI_CPU)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    _, output = run_toy(tmp_path, "--resume", *TWO_PROCESSES, accelerate_config=MULTI_CPU)
    assert output.count("Resuming from") == 2 and "checkpoint-6" in output, "both processes resume from step 6"
    assert_same_result(uninterrupted, tmp_path, after_step=6)


def test_a_signal_to_one_process_stops_all_at_the_same_step_with_a_checkpoint(tmp_path, toy_path):
    # only the main process gets SIGTERM, as step 5 begins; both finish step 5, save checkpoint-5 and exit 0
    _, output = run_toy(tmp_path, "--signal-at", "4", *TWO_PROCESSES, accelerate_config=MULTI_CPU)
    assert "Stopped by SIGTERM after step 5" in output and "Stopped by a signal on another process" in output
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-5"]
    names = {p.name for p in (tmp_path / "checkpoint-5").iterdir()}
    assert {"rank_state_0.json", "rank_state_1.json", "rng_state_0.json", "rng_state_1.json"} <= names


def test_resuming_with_another_number_of_processes_is_refused_before_any_step(uninterrupted, tmp_path):
    import shutil

    from toy_run import make_trainer

    shutil.copytree(uninterrupted / "checkpoint-6", tmp_path / "checkpoint-6")
    trainer = make_trainer(tmp_path)
    with pytest.raises(CheckpointError, match="world_size: checkpoint 2, now 1"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 0


# ZeRO-2 with PPO only: its two engines cover RLOO's one, and ZeRO-3 runs both (each pair costs a minute of CI).
ZERO_RUNS = [("zero2", "ppo"), ("zero3", "rloo"), ("zero3", "ppo"), ("zero3_offload", "ppo")]


@pytest.fixture(scope="module", params=ZERO_RUNS, ids=[f"{stage}-{algo}" for stage, algo in ZERO_RUNS])
def zero_run(request, tmp_path_factory, toy_path):
    """An uninterrupted 2-process run under DeepSpeed ZeRO-2, ZeRO-3 or ZeRO-3 with CPU offload of optimizer and
    parameters (its first use compiles DeepSpeedCPUAdam), with the live actor written after step 6."""
    stage, algorithm = request.param
    out = tmp_path_factory.mktemp(f"{stage}-{algorithm}")
    flags = ["--algorithm", algorithm, "--save-live-actor", "6", *TWO_PROCESSES]
    run_toy(out, *flags, accelerate_config=ZERO[stage])
    return stage, algorithm, out


def test_zero_trains_like_ddp_and_checkpoints_each_optimizer_partition(zero_run, ddp_runs):
    stage, algorithm, out = zero_run
    ddp, zero = read_logs(ddp_runs(algorithm)), read_logs(out)
    keys = ("loss", "grad_norm", "reward", "kl") + (("critic_grad_norm", "value_loss") if algorithm == "ppo" else ())
    for step in range(1, 13):  # same data, same seeds: only the order of floating-point sums may differ
        for key in keys:
            assert zero[step][key] == pytest.approx(ddp[step][key], rel=1e-4, abs=1e-5), (step, key)
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in (12, 3, 6, 9)]
    names = {p.name for p in (out / "checkpoint-6").iterdir()}
    assert {"optimizer_0.pt", "optimizer_1.pt", "rollout_buffer_0.safetensors", "rollout_buffer_1.safetensors"} <= names
    if algorithm == "ppo":
        assert {"critic_optimizer_0.pt", "critic_optimizer_1.pt", "critic"} <= names
    if stage.startswith("zero3"):  # each process holds the AdamW state of half the parameters, not of all of them
        whole = sum(t.numel() for t in load_file(out / "checkpoint-6" / "actor" / "model.safetensors").values())
        for rank in (0, 1):
            state = torch.load(out / "checkpoint-6" / f"optimizer_{rank}.pt", weights_only=True)
            assert sum(p.numel() for p in state["fp32_partitions"]) <= whole // 2 + 64


def test_zero_sigkill_after_a_checkpoint_resumes_identically(zero_run, tmp_path):
    stage, algorithm, out = zero_run
    flags = ["--algorithm", algorithm, *TWO_PROCESSES]
    run_toy(tmp_path, "--kill-after-save", "6", *flags, expect_kill=True, accelerate_config=ZERO[stage])
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    _, output = run_toy(tmp_path, "--resume", *flags, accelerate_config=ZERO[stage])
    assert output.count("Resuming from") == 2 and "checkpoint-6" in output
    assert_same_result(out, tmp_path, after_step=6)


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


def test_vllm_under_zero3_generates_with_the_gathered_actor_and_keeps_the_process_group(tmp_path):
    vllm = ["use_vllm=true", "vllm_dtype=float32", "max_steps=6"]
    run_toy(tmp_path, *TWO_PROCESSES, *vllm, accelerate_config=ZERO["zero3"])
    logs = read_logs(tmp_path)
    assert sorted(logs) == list(range(1, 7))
    for step, entry in logs.items():  # vLLM's log-probs of its samples are the trainer's: the push was whole
        assert entry["generation_logprob_diff"] < 1e-4, step
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    assert (tmp_path / "final-actor" / "model.safetensors").is_file()  # saved after train(), with the engine up


@pytest.mark.parametrize(
    "zero_config, flags, message",
    [
        ("zero_stage: 2\n  offload_optimizer_device: cpu", [], "ZeRO stage 2 with offload is not supported"),
        ("zero_stage: 3", ["--lora"], "peft_config under DeepSpeed ZeRO-3 is not supported"),
    ],
    ids=["offload-under-zero2", "lora-under-zero3"],
)
def test_unsupported_deepspeed_settings_are_refused_before_any_work(tmp_path, zero_config, flags, message):
    config = tmp_path / "deepspeed.yaml"
    config.write_text(
        f"compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  {zero_config}\n"
        "num_machines: 1\nnum_processes: 2\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\n"
    )
    _, output = run_toy(tmp_path / "out", *flags, *TWO_PROCESSES, accelerate_config=config, expect_failure=True)
    assert message in output
    assert not list((tmp_path / "out").glob("checkpoint-*"))
