"""What a person sees of a plain run: a printed dict per logging step and a summary at the end, no warning lines
(with vLLM too: none of vLLM's logs), and every logged entry in output_dir/metrics.jsonl, which a resumed run
continues as an uninterrupted one."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import TOY_RUN
from support.toy_run import make_trainer

from steadyrl.reporting.quiet import VLLM_LOG_SETTINGS, quiet_vllm_logs

TIMINGS = {
    "tokens_per_second",
    "train_runtime",
    "train_steps_per_second",
    "train_samples_per_second",
    "train_tokens_per_second",
}


def run(output_dir, *flags, overrides=()) -> str:
    cmd = [
        sys.executable,
        str(TOY_RUN),
        str(output_dir),
        *flags,
        "--set",
        "max_steps=4",
        "save_steps=2",
        "disable_tqdm=false",
        *overrides,
    ]
    env = {name: value for name, value in os.environ.items() if name not in VLLM_LOG_SETTINGS}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def entries(output_dir) -> list[dict]:
    lines = (output_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS} for line in lines]


def test_a_plain_run_prints_its_metrics_and_summary_quietly_and_keeps_them(tmp_path):
    full = tmp_path / "full"
    output = run(full)
    warnings = [line for line in output.splitlines() if "warn" in line.lower()]
    assert not warnings, warnings
    printed = [line for line in output.replace("\r", "\n").splitlines() if line.startswith("{'")]
    assert sum("'reward':" in line for line in printed) == 4, printed  # one dict per logging step
    assert "'train_runtime':" in printed[-1] and "'final_reward':" in printed[-1]
    # checkpoints 2 and 4 draw no "Writing model shards" bar inside the training bar: only save_model's final-actor does
    assert output.count("Writing model shards:   0%") == 1, output
    logged = entries(full)
    assert [e["step"] for e in logged] == [1, 2, 3, 4, 4]
    assert all("reward" in e and "loss" in e for e in logged[:4])
    assert {"final_reward", "train_loss"} <= set(logged[-1]) and logged[-1]["final_reward"] == logged[3]["reward"]
    # as Trainer's: the summary is log_history[-1] (TRL's tests read its train_loss), after the last checkpoint
    history = json.loads((full / "log_history.json").read_text())
    assert {"train_loss", "train_runtime", "train_samples_per_second"} <= set(history[-1]), history[-1]
    assert history[-1]["train_loss"] == sum(e["loss"] for e in history[:4]) / 4
    saved = json.loads((full / "checkpoint-4" / "trainer_state.json").read_text())["log_history"]
    assert [e["step"] for e in saved] == [1, 2, 3, 4] and "train_runtime" not in saved[-1]

    resumed = tmp_path / "resumed"  # killed after step 4 was logged but before its checkpoint was written
    shutil.copytree(full, resumed, ignore=shutil.ignore_patterns("checkpoint-4", "final-actor"))
    output = run(resumed, "--resume")
    assert "Resuming from" in output
    bars = [line for line in output.replace("\r", "\n").splitlines() if line.startswith("steadyrl:")]
    assert "| 2/4 [" in bars[0] and "?it/s" in bars[0], bars  # from the resumed step, no rate before a step is done
    again = entries(resumed)
    assert again[:4] == logged[:4], "steps 3 and 4 are logged once, as in the uninterrupted run"
    assert again[4]["step"] == 4 and again[4]["final_reward"] == logged[4]["final_reward"]  # this call's summary


# vLLM's CPU worker binds memory with C++ code that prints this through torch's C++ logging, outside Python's logging
# and warnings (TORCH_CPP_LOG_LEVEL=ERROR, set before Python starts, hides it)
NUMA_LINE = re.compile(r"\[W\d+ [\d:.]+ utils\.cpp:\d+\] Warning: NUMA binding: .*?\(function init_cpu_memory_env\)")
VLLM_RECORD = re.compile(r"\b(DEBUG|INFO|WARNING)\b|warn|vllm|triton", re.IGNORECASE)


def test_a_vllm_run_prints_none_of_vllms_logs(tmp_path):
    output = run(tmp_path / "vllm", overrides=["use_vllm=true", "vllm_dtype=float32"])
    lines = NUMA_LINE.sub("", output).replace("\r", "\n").splitlines()
    assert not [line for line in lines if VLLM_RECORD.search(line)], output[-3000:]
    printed = [line for line in lines if line.startswith("{'")]
    assert sum("'generation_logprob_diff':" in line for line in printed) == 4, printed


def test_vllms_own_logging_settings_are_left_to_the_user(monkeypatch):
    vllm_logger, level = logging.getLogger("vllm"), logging.getLogger("vllm").level
    try:
        vllm_logger.setLevel(logging.NOTSET)
        monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
        assert quiet_vllm_logs() == {} and vllm_logger.level == logging.NOTSET
        for name in VLLM_LOG_SETTINGS:
            monkeypatch.delenv(name, raising=False)
        assert quiet_vllm_logs() == {"VLLM_LOGGING_LEVEL": "ERROR"} and vllm_logger.level == logging.ERROR
    finally:
        vllm_logger.setLevel(level)


def test_the_steps_after_the_last_logging_step_are_logged_with_the_summary(tmp_path):
    """As TRL: with max_steps=3 and logging_steps=2, step 3's metrics come with the end-of-training summary
    (log_history[-1]) instead of being dropped; they are those a run logging every step logs at step 3."""
    every = make_trainer(tmp_path / "every", max_steps=3, logging_steps=1)
    every.train()
    sparse = make_trainer(tmp_path / "sparse", max_steps=3, logging_steps=2)
    sparse.train()
    step3 = next(e for e in every.state.log_history if e.get("step") == 3 and "reward" in e)
    summary = sparse.state.log_history[-1]
    assert "train_loss" in summary and summary["reward"] == step3["reward"] and summary["loss"] == step3["loss"]
    assert [e["step"] for e in sparse.state.log_history if "reward" in e] == [2, 3]
    losses = [e["loss"] for e in every.state.log_history if "loss" in e]
    assert len(losses) == 3, "train_loss is the mean over every step, as Trainer's, however often the run logs"
    for trainer in (every, sparse):
        assert trainer.state.log_history[-1]["train_loss"] == pytest.approx(sum(losses) / 3, rel=1e-9, abs=1e-12)


def test_a_run_shorter_than_logging_steps_reports_its_train_loss_and_metrics(tmp_path):
    """TRL's default logging_steps=10 on a 4-step run: nothing is logged before the summary, which holds the mean
    train_loss and the 4 steps' metrics (each reward's mean and std by TRL's names)."""
    trainer = make_trainer(tmp_path, max_steps=4, logging_steps=10)
    trainer.train()
    (summary,) = trainer.state.log_history
    assert {"train_loss", "loss", "reward", "rewards/letters_reward/mean", "rewards/letters_reward/std"} <= set(summary)
