"""Whole runs of the real model (SmolLM2-135M-Instruct on the arithmetic task, ``tests/support/toy_run.py --real``): a
GRPO run killed after a checkpoint in the middle of a rollout resumes byte-identical to an uninterrupted one, and
two processes train it under DeepSpeed ZeRO-2."""

import json

from conftest import ZERO, read_logs, run_toy
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

GRPO = ("--algorithm", "grpo", "--real")


def test_a_real_model_run_killed_mid_rollout_resumes_byte_identical(tmp_path):
    """Two optimizer steps per rollout: checkpoint-1 holds the rollout's unused half, sampled from the model's
    49,152-token vocabulary; the resumed run trains on it and ends with the uninterrupted run's weights."""
    run_toy(tmp_path / "whole", *GRPO)
    run_toy(tmp_path / "killed", *GRPO, "--kill-after-save", "1", expect_kill=True)
    assert not (tmp_path / "killed" / "checkpoint-2").exists()
    buffer = json.loads((tmp_path / "killed" / "checkpoint-1" / "rollout_buffer_0.json").read_text())
    assert buffer["cursor"] < len(buffer["schedule"]), "checkpoint-1 must fall in the middle of a rollout"
    run_toy(tmp_path / "killed", *GRPO, "--resume")
    for name in ("final-actor/model.safetensors", "checkpoint-2/actor/model.safetensors"):
        assert (tmp_path / "killed" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    whole, resumed = read_logs(tmp_path / "whole"), read_logs(tmp_path / "killed")
    assert whole.keys() == resumed.keys() == {1, 2}
    for step in whole:
        assert {k: v for k, v in resumed[step].items() if k != "tokens_per_second"} == {
            k: v for k, v in whole[step].items() if k != "tokens_per_second"
        }, step
        assert whole[step]["grad_norm"] > 0


def test_two_processes_train_the_real_model_under_zero2(tmp_path):
    """Each process generates one prompt's 2 completions; the step all-reduces their gradients, ZeRO-2 shards
    the optimizer state, and the checkpoint and the final actor hold the whole model."""
    run_toy(
        tmp_path,
        *GRPO,
        accelerate_config=ZERO["zero2"],
        overrides=["micro_rollout_batch_size=2", "micro_train_batch_size=1", "save_steps=2"],
    )
    logs = read_logs(tmp_path)
    assert set(logs) == {1, 2} and all(logs[step]["grad_norm"] > 0 for step in logs), logs
    assert (tmp_path / "checkpoint-2").is_dir() and not (tmp_path / "checkpoint-1").exists()
    actor = load_file(tmp_path / "final-actor" / "model.safetensors")
    assert actor["model.embed_tokens.weight"].shape == (49152, 576)
    AutoModelForCausalLM.from_pretrained(tmp_path / "final-actor")
