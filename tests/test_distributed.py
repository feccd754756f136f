"""Two processes under ``accelerate launch`` (gloo on CPU), with DDP and with DeepSpeed ZeRO-2 and ZeRO-3:
checkpoints, exact resume, agreement between the engines, export of a sharded run, and what is refused."""

import pytest
import torch
from conftest import MULTI_CPU, TWO_PROCESSES, ZERO, read_logs, run_toy
from test_resume import assert_same_result

from steadyrl.checkpoint import CheckpointError
from steadyrl.ops import leave_one_out_advantages, whiten


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


def test_evaluation_and_completion_logs_cover_every_process(tmp_path, toy_path):
    import json

    # 5 held-out prompts over 2 processes: 3 each, the repeated one left out of the metrics. The advantages are
    # whitened (beta 0: each is the score's leave-one-out advantage) over the whole rollout, not each process's half.
    settings = [*TWO_PROCESSES[1:], "log_completions=true", "num_generations_eval=2", "normalize_advantages=true",
                "beta=0"]  # one --set for all  # fmt: skip
    run_toy(tmp_path, "--eval-prompts", "5", accelerate_config=MULTI_CPU, overrides=settings)
    logs = json.loads((tmp_path / "log_history.json").read_text())
    evals = [e for e in logs if "eval_reward" in e]
    assert [e["step"] for e in evals] == [2, 4, 6, 8, 10, 12]
    lengths = [e["eval_completions/mean_length"] for e in evals]
    assert all(0 < length <= 8 for length in lengths)
    lines = [json.loads(line) for line in (tmp_path / "completions.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [step for step in (1, 5, 9) for _ in range(8)], "8 samples a rollout"
    for first in range(0, len(lines), 8):  # what one process computes from the whole rollout (both processes' rows)
        rollout = lines[first : first + 8]
        rewards = torch.tensor([line["reward"] for line in rollout])
        expected = whiten(leave_one_out_advantages(rewards, k=2))
        advantages = torch.tensor([line["advantage"] for line in rollout])
        torch.testing.assert_close(advantages, expected, rtol=1e-5, atol=1e-5)
