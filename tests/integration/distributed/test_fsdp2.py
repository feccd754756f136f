"""FSDP2 (torch's ``fully_shard``) through accelerate, ``examples/accelerate_configs/fsdp2.yaml``, two processes on
gloo: RLOO trains like DDP, checkpoints each process's optimizer shard as plain tensors and the actor whole, exports
it equal to the live actor, and resumes byte-identically after a SIGKILL; PPO (two sharded models) trains like DDP;
online DPO runs; GRPO with vLLM gets the gathered actor pushed to its engines and mixes the reference with the sharded
actor (``sync_ref_model``) exactly as TRL's operations do; FSDP set through ``TrainingArguments.fsdp`` trains and
evaluates like DDP. A file of its own, so pytest-xdist runs it beside the other multi-process tests."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import CONFIGS, MULTI_CPU, TWO_PROCESSES, read_logs, run_toy
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from integration.algorithms.test_ref_sync import assert_trls_mix_at_each_sync_step
from integration.resume.test_resume import assert_same_result, assert_trains_as
from steadyrl.publish.export import export_actor

FSDP2 = CONFIGS / "fsdp2.yaml"
COMPARED = ("loss", "grad_norm", "reward", "kl", "entropy")


def assert_trains_like_ddp(fsdp_dir, ddp_dir, keys, steps=range(1, 13)) -> None:
    """Same data, same seeds, whole weights gathered exactly: only the order of floating-point sums differs
    (reduce-scatter of gradients instead of all-reduce)."""
    fsdp, ddp = read_logs(fsdp_dir), read_logs(ddp_dir)
    for step in steps:
        for key in keys:
            assert fsdp[step][key] == pytest.approx(ddp[step][key], rel=1e-4, abs=1e-5), (step, key)


def shard_sizes(optimizer_file) -> int:
    state = torch.load(optimizer_file, weights_only=True)  # plain tensors: no unpickling of DTensor or mesh
    assert all(not type(v).__name__ == "DTensor" for entry in state["state"].values() for v in entry.values())
    return sum(entry["exp_avg"].numel() for entry in state["state"].values())


@pytest.fixture(scope="module")
def rloo_run(tmp_path_factory, toy_path):
    """One uninterrupted 2-process FSDP2 RLOO run, with the live actor (gathered with ``DTensor.full_tensor``)
    written after step 6."""
    out = tmp_path_factory.mktemp("fsdp2-rloo")
    run_toy(out, "--save-live-actor", "6", *TWO_PROCESSES, accelerate_config=FSDP2)
    return out


def test_fsdp2_rloo_trains_like_ddp_and_checkpoints_each_optimizer_shard(rloo_run, ddp_runs):
    assert_trains_like_ddp(rloo_run, ddp_runs("rloo"), COMPARED)
    assert sorted(p.name for p in rloo_run.glob("checkpoint-*")) == [f"checkpoint-{s}" for s in (12, 3, 6, 9)]
    checkpoint = rloo_run / "checkpoint-6"
    names = {p.name for p in checkpoint.iterdir()}
    assert {"optimizer_0.pt", "optimizer_1.pt", "rollout_buffer_0.safetensors", "rollout_buffer_1.safetensors"} <= names
    assert "optimizer.pt" not in names
    # the whole actor at the top level, gathered from the shards (the checkpoint loads as the model)
    assert {"config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json"} <= names
    whole = sum(t.numel() for t in load_file(checkpoint / "model.safetensors").values())
    sizes = [shard_sizes(checkpoint / f"optimizer_{rank}.pt") for rank in (0, 1)]
    assert 0.9 * whole < sum(sizes) <= whole and max(sizes) <= whole // 2 + 1024, (sizes, whole)  # each about half
    settings = json.loads((checkpoint / "settings.json").read_text())  # a resume may change them (logged)
    assert settings["fsdp_version"] == 2 and settings["world_size"] == 2


def test_fsdp_through_training_arguments_trains_and_evaluates_like_ddp(rloo_run, tmp_path):
    # TRL / transformers' way: TrainingArguments.fsdp (fsdp_config's version 2 by default) under a plain 2-process
    # launch; on CPU accelerate drops the plugin transformers gives it, and the run would silently train as DDP.
    # evaluate(): 5 held-out prompts over 2 processes (3 each, one repeated and left out of the metrics)
    fsdp, ddp = tmp_path / "fsdp", tmp_path / "ddp"
    for out, settings in ((fsdp, ["fsdp=full_shard"]), (ddp, [])):
        run_toy(out, "--eval-prompts", "5", *TWO_PROCESSES, "max_steps=4", *settings, accelerate_config=MULTI_CPU)
    histories = [json.loads((out / "log_history.json").read_text()) for out in (fsdp, ddp)]
    train = [[e[key] for e in history if "loss" in e for key in COMPARED] for history in histories]
    evals = [{e["step"]: e["eval_reward"] for e in history if "eval_reward" in e} for history in histories]
    assert len(train[0]) == 4 * len(COMPARED) and train[0] == pytest.approx(train[1], rel=1e-4, abs=1e-5)
    assert list(evals[0]) == [2, 4] and evals[0] == pytest.approx(evals[1], rel=1e-5)
    sizes = [shard_sizes(fsdp / "checkpoint-3" / f"optimizer_{rank}.pt") for rank in (0, 1)]
    assert sizes == [shard_sizes(rloo_run / "checkpoint-3" / f"optimizer_{rank}.pt") for rank in (0, 1)]
    assert json.loads((fsdp / "checkpoint-3" / "settings.json").read_text())["fsdp_version"] == 2


def test_export_of_an_fsdp2_checkpoint_equals_the_live_actor(rloo_run, tmp_path):
    export_actor(rloo_run / "checkpoint-6", tmp_path / "model")  # what `steadyrl export` runs
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    live = load_file(rloo_run / "live-actor-6.safetensors")
    assert live.keys() <= exported.keys() and len(live) > 10
    for name, weights in live.items():
        assert torch.equal(exported[name], weights), name


def test_fsdp2_sigkill_after_a_checkpoint_resumes_identically(rloo_run, tmp_path):
    run_toy(tmp_path, "--kill-after-save", "6", *TWO_PROCESSES, expect_kill=True, accelerate_config=FSDP2)
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-3", "checkpoint-6"]
    _, output = run_toy(tmp_path, "--resume", *TWO_PROCESSES, accelerate_config=FSDP2)
    assert output.count("Resuming from") == 2 and "checkpoint-6" in output
    assert_same_result(rloo_run, tmp_path, after_step=6)


def test_fsdp2_resumes_on_one_process_and_back_on_two_training_what_it_would_have(rloo_run, tmp_path):
    """checkpoint-6 (mid-rollout) of the 2-process run resumed on 1 process, then that run's checkpoint-9 resumed on
    2. One CPU process runs without FSDP (nothing to shard over; on a GPU it is a mesh of one): the saved shards are
    put together whole, and the whole state cut into each process's shards again."""
    one, two = tmp_path / "one", tmp_path / "two"
    shutil.copytree(rloo_run / "checkpoint-6", one / "checkpoint-6")
    _, output = run_toy(one, "--resume", *TWO_PROCESSES, accelerate_config=FSDP2, processes=1)
    assert "world_size 2 -> 1" in output and "fsdp_version 2 -> None" in output, output[-3000:]
    assert_trains_as(rloo_run, one, after_step=6)
    assert {path.name for path in (one / "checkpoint-9").glob("optimizer*.pt")} == {"optimizer.pt"}
    shutil.copytree(one / "checkpoint-9", two / "checkpoint-9")
    _, output = run_toy(two, "--resume", *TWO_PROCESSES, accelerate_config=FSDP2)
    assert "world_size 1 -> 2" in output, output[-3000:]
    assert_trains_as(rloo_run, two, after_step=9)


def test_fsdp2_ppo_shards_actor_and_critic_and_trains_like_ddp(tmp_path, ddp_runs):
    """Padded (packing=false) against the packed DDP run: the passes train alike across engines."""
    run_toy(tmp_path, "--algorithm", "ppo", *TWO_PROCESSES, "packing=false", accelerate_config=FSDP2)
    assert_trains_like_ddp(tmp_path, ddp_runs("ppo"), (*COMPARED, "critic_grad_norm", "value_loss"))
    names = {p.name for p in (tmp_path / "checkpoint-6").iterdir()}
    assert {"critic", "critic_optimizer_0.pt", "critic_optimizer_1.pt", "optimizer_0.pt", "optimizer_1.pt"} <= names
    checkpoint = tmp_path / "checkpoint-6"
    critic = sum(t.numel() for t in load_file(checkpoint / "critic" / "model.safetensors").values())
    assert max(shard_sizes(checkpoint / f"critic_optimizer_{rank}.pt") for rank in (0, 1)) <= critic // 2 + 1024


def test_fsdp2_gkd_shards_the_student_and_trains_like_ddp(tmp_path, ddp_runs):
    """GKD (distillation's loss; lmbda 0.5: rollouts 1 and 3 the student's samples, 2 the dataset's completions): the
    frozen teacher, sharded as it is read, beside the sharded student: its LM head is put together whole for the
    chunked divergence, and the student trains as under DDP (ZeRO-3 runs distillation: test_deepspeed_zero.py)."""
    run_toy(tmp_path, "--algorithm", "gkd", *TWO_PROCESSES, accelerate_config=FSDP2)
    ddp = ddp_runs("gkd")
    assert [read_logs(ddp)[step]["on_policy"] for step in (1, 5, 9)] == [1.0, 0.0, 1.0]
    assert_trains_like_ddp(tmp_path, ddp, ("loss", "grad_norm", "divergence"))
    student = sum(t.numel() for t in load_file(tmp_path / "checkpoint-6" / "model.safetensors").values())
    assert (
        max(shard_sizes(tmp_path / "checkpoint-6" / f"optimizer_{rank}.pt") for rank in (0, 1)) <= student // 2 + 1024
    )


def test_fsdp2_online_dpo_runs_on_pairs(tmp_path):
    # micro-batches of whole (chosen, rejected) pairs: 2 samples per process per micro-batch
    flags = [
        "--algorithm",
        "online-dpo",
        "--set",
        "micro_rollout_batch_size=4",
        "micro_train_batch_size=2",
        "max_steps=4",
    ]
    run_toy(tmp_path, *flags, accelerate_config=FSDP2)
    logs = read_logs(tmp_path)
    assert sorted(logs) == list(range(1, 5))
    assert all(torch.isfinite(torch.tensor(logs[s]["loss"])) for s in logs)
    assert {"optimizer_0.pt", "optimizer_1.pt"} <= {p.name for p in (tmp_path / "checkpoint-3").iterdir()}
    AutoModelForCausalLM.from_pretrained(tmp_path / "final-actor")


def test_fsdp2_grpo_pushes_the_gathered_actor_to_vllm_and_mixes_the_reference_exactly(tmp_path):
    sync = [
        "sync_ref_model=true",
        "ref_model_sync_steps=2",
        "ref_model_mixup_alpha=0.5",
        "save_steps=2",
        "ref_reward_offload=true",
    ]
    flags = ["--algorithm", "grpo", *TWO_PROCESSES, "use_vllm=true", "vllm_dtype=float32", "max_steps=4", *sync]
    run_toy(tmp_path, *flags, accelerate_config=FSDP2)
    logs = read_logs(tmp_path)
    # each process's engine samples with the whole actor it was sent: its log-probs are the trainer's
    assert all(logs[step]["generation_logprob_diff"] < 1e-4 for step in range(1, 5)), logs
    assert_trls_mix_at_each_sync_step(tmp_path, last_step=4)
