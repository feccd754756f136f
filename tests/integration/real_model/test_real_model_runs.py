"""Whole runs of the real model (SmolLM2-135M-Instruct on the arithmetic task, ``tests/support/toy_run.py --real``).

One uninterrupted two-step GRPO run (HF generate), made once for this module, is checked three ways: it trains (the
reward functions see TRL's conversational prompts and completions, the weights move); ``steadyrl export`` of its last
checkpoint generates like its live actor; and a run killed after a checkpoint in the middle of a rollout resumes
byte-identical to it. Two processes also train the model under DeepSpeed ZeRO-2."""

import json

import pytest
import torch
from conftest import ZERO, read_logs, run_toy
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from integration.publish.test_export import export
from steadyrl.real import arithmetic_dataset, greedy_accuracy, smollm2_path

GRPO = ("--algorithm", "grpo", "--real")
LIVE_CHECKS = 8  # held-out problems the live actor answers greedily after training
SAMPLED_WEIGHT = "model.layers.0.self_attn.q_proj.weight"


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The output dir of the uninterrupted GRPO run (do not modify it): checkpoint-1 and -2, final-actor,
    log_history.json, and what its reward function and live actor saw and did (reward_inputs.json,
    live_actor.json)."""
    output_dir = tmp_path_factory.mktemp("real-grpo")
    run_toy(output_dir, *GRPO, "--live-checks", str(LIVE_CHECKS))
    return output_dir


def weight(path, name: str = SAMPLED_WEIGHT) -> torch.Tensor:
    with safe_open(str(path), "pt") as f:
        return f.get_tensor(name)


def test_grpo_trains_the_real_model_and_its_export_generates_like_the_live_actor(tmp_path, uninterrupted):
    """Two optimizer steps with rewards that differ within every group; the reward functions get TRL's
    conversational prompts and completions. ``steadyrl export`` of checkpoint-2 loads with ``from_pretrained`` and
    gives the live actor's greedy replies on held-out problems."""
    logs = [entry for entry in json.loads((uninterrupted / "log_history.json").read_text()) if "reward" in entry]
    assert len(logs) == 2 and [entry["step"] for entry in logs] == [1, 2], logs
    assert all(entry["grad_norm"] > 0 for entry in logs), logs
    before = weight(f"{smollm2_path()}/model.safetensors")
    assert not torch.equal(before, weight(uninterrupted / "final-actor" / "model.safetensors")), "no weight moved"
    seen = json.loads((uninterrupted / "reward_inputs.json").read_text())
    assert all(p[-1]["role"] == "user" and p[-1]["content"].startswith("What is") for p in seen["prompts"])
    assert all(c[0]["role"] == "assistant" and isinstance(c[0]["content"], str) for c in seen["completions"])

    code, output = export(uninterrupted / "checkpoint-2", tmp_path / "exported")
    assert code == 0, output
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "exported")
    held_out = arithmetic_dataset("eval", size=LIVE_CHECKS)
    live = json.loads((uninterrupted / "live_actor.json").read_text())
    _, exported_replies = greedy_accuracy(exported, tokenizer, held_out, max_new_tokens=12)
    live_replies = live["greedy_replies"]
    assert exported_replies == live_replies and len(set(live_replies)) > 1, (exported_replies, live_replies)
    # A user's own generate right after train(), with gradient checkpointing on (the default): the actor is left in
    # eval mode, so transformers' generate keeps its KV cache and the reply continues the question.
    question = tokenizer.apply_chat_template(
        held_out[0]["prompt"], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    saved = exported.generate(**question, do_sample=False, max_new_tokens=12)
    assert not live["training"], "train() left the actor in training mode"
    assert torch.equal(torch.tensor(live["generate"]), saved), tokenizer.batch_decode(
        torch.cat([torch.tensor(live["generate"]), saved])
    )


def test_a_real_model_run_killed_mid_rollout_resumes_byte_identical(tmp_path, uninterrupted):
    """Two optimizer steps per rollout: checkpoint-1 holds the rollout's unused half, sampled from the model's
    49,152-token vocabulary; the resumed run trains on it and ends with the uninterrupted run's weights."""
    run_toy(tmp_path / "killed", *GRPO, "--kill-after-save", "1", expect_kill=True)
    assert not (tmp_path / "killed" / "checkpoint-2").exists()
    buffer = json.loads((tmp_path / "killed" / "checkpoint-1" / "rollout_buffer_0.json").read_text())
    assert buffer["cursor"] < len(buffer["schedule"]), "checkpoint-1 must fall in the middle of a rollout"
    run_toy(tmp_path / "killed", *GRPO, "--resume")
    for name in ("final-actor/model.safetensors", "checkpoint-2/model.safetensors"):
        assert (tmp_path / "killed" / name).read_bytes() == (uninterrupted / name).read_bytes(), name
    whole, resumed = read_logs(uninterrupted), read_logs(tmp_path / "killed")
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
