"""Models given by path are split over the processes as the trainer is built (two processes on gloo): under
DeepSpeed ZeRO-3 every one is partitioned; under FSDP2 the frozen ones are sharded and the trained ones held by the
main process only until accelerate's prepare shards them. The run's fingerprint (weight digests, the reference
recorded as the policy's copy) is the one of whole models."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import CONFIGS, ROOT
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

from steadyrl.checkpoint.fingerprint import weights_digest
from steadyrl.toy import toy_model_path, toy_reward_model_path

BUILD_CHECK = ROOT / "tests" / "support" / "build_check.py"


def build_report(tmp_path, config: str, algorithm: str, *options: str) -> dict:
    out = tmp_path / "report.json"
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / f"{config}.yaml"),
        str(BUILD_CHECK),
        str(out),
        algorithm,
        *options,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("config", ["zero3", "fsdp2"])
def test_ppo_builds_every_model_split_over_the_processes(tmp_path, config):
    report = build_report(tmp_path, config, "ppo", "reward_model")
    for name in ("actor", "reference", "reward_model", "critic"):
        model = report[name]
        if config == "fsdp2" and name in ("actor", "critic"):  # accelerate's prepare shards them from the main's
            assert model["held"] == "on main only", (name, model)
            continue
        assert model["held"] == ("partitioned" if config == "zero3" else "sharded"), (name, model)
        assert model["local_elements"] <= model["whole_elements"] // 2 + 1024, (name, model)
    # transformers.Trainer moved the actor to args.device, cpu:0 under a launch, another device than cpu to torch:
    # every weight was copied, and FSDP2's unwritten actor on the other process written in full
    assert report["actor_copied_after_load"] is False
    identity = report["identity"]
    policy = AutoModelForCausalLM.from_pretrained(toy_model_path(), dtype=torch.float32)
    reward_model = AutoModelForSequenceClassification.from_pretrained(toy_reward_model_path(), num_labels=1)
    assert identity["model.weights"] == weights_digest(policy)
    assert identity["ref_model"] == "model"  # a copy of the policy as it starts
    assert identity["reward_model.weights"] == identity["critic.weights"] == weights_digest(reward_model)


def test_zero3_resume_loads_the_weights_into_the_partitions_a_module_at_a_time(tmp_path):
    report = build_report(tmp_path, "zero3", "rloo", "reload")
    policy = AutoModelForCausalLM.from_pretrained(toy_model_path(), dtype=torch.float32)
    largest_layer = max(p.numel() for p in policy.parameters())
    assert report["reload"]["weights"] == weights_digest(policy)
    assert report["reload"]["largest_gathered"] <= largest_layer, "more than a module was gathered whole at once"
