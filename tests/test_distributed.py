"""Two processes under ``accelerate launch`` (gloo on CPU): checkpoints, exact resume and the process count."""

import pytest
from conftest import ROOT, read_logs, run_toy
from test_resume import assert_same_result

from steadyrl.checkpoint import CheckpointError

MULTI_CPU = ROOT / "examples" / "accelerate_configs" / "multi_cpu.yaml"
# each process generates 2 prompts x 2 samples = 4 of the rollout's 8 samples
TWO_PROCESSES = ["--set", "micro_rollout_batch_size=4"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, toy_path):
    out = tmp_path_factory.mktemp("ddp-uninterrupted")
    run_toy(out, *TWO_PROCESSES, accelerate_config=MULTI_CPU)
    return out


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


def test_resuming_with_another_number_of_processes_is_refused_before_any_step(uninterrupted, tmp_path):
    import shutil

    from toy_run import make_trainer

    shutil.copytree(uninterrupted / "checkpoint-6", tmp_path / "checkpoint-6")
    trainer = make_trainer(tmp_path)
    with pytest.raises(CheckpointError, match="world_size: checkpoint 2, now 1"):
        trainer.train(resume_from_checkpoint=True)
    assert trainer.state.global_step == 0


def test_deepspeed_launch_is_refused_before_any_work(tmp_path):
    config = tmp_path / "zero2.yaml"
    config.write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n"
        "num_machines: 1\nnum_processes: 2\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: true\n"
    )
    import subprocess
    import sys

    from conftest import TOY_RUN, free_port

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config), "--main_process_port",
           str(free_port()), str(TOY_RUN), str(tmp_path / "out"), *TWO_PROCESSES]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0
    assert "DeepSpeed integration (distributed_type: DEEPSPEED) is not supported yet" in proc.stderr + proc.stdout
    assert not list((tmp_path / "out").glob("checkpoint-*"))
