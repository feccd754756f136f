"""Scripts written with TRL's names (examples/rloo_chat.py, grpo_chat.py, online_dpo_chat.py): a chat model, a
conversational dataset, ``trl.rewards.think_format_reward`` plus a custom conversational reward, evaluation every
2 steps, completion logs and checkpoints; killed at a random moment after a checkpoint and resumed, they end exactly
as an uninterrupted run. The RLOO and GRPO scripts also run on TRL itself with only their import changed."""

import json
import signal
import subprocess
import sys
import time

import pytest
from conftest import ROOT

SCRIPTS = {name: ROOT / "examples" / f"{name.replace('-', '_')}_chat.py" for name in ("rloo", "grpo", "online-dpo")}
IMPORTS = {"rloo": ("RLOOConfig", "RLOOTrainer"), "grpo": ("GRPOConfig", "GRPOTrainer")}
TIMINGS = {"tokens_per_second"}


def start(script, output_dir, *flags) -> subprocess.Popen:
    cmd = [sys.executable, str(script), "--output_dir", str(output_dir), *flags]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    return output


def kill_after_checkpoint(proc: subprocess.Popen, checkpoint) -> None:
    """SIGKILL ``proc`` as soon as ``checkpoint`` is complete (its manifest is in place)."""
    while not (checkpoint / "manifest.json").is_file():
        assert proc.poll() is None, f"the run ended before {checkpoint.name}: {proc.stdout.read()[-3000:]}"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"


def history(output_dir) -> list[dict]:
    state = json.loads((output_dir / "checkpoint-6" / "trainer_state.json").read_text())
    return [{k: v for k, v in entry.items() if k not in TIMINGS} for entry in state["log_history"]]


@pytest.mark.parametrize("algorithm", ["rloo", "grpo", "online-dpo"])
def test_trl_style_script_evaluates_logs_checkpoints_and_resumes_exactly(tmp_path, algorithm):
    script = SCRIPTS[algorithm]
    full = tmp_path / "full"
    finish(start(script, full))
    assert sorted(p.name for p in full.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    logs = history(full)
    assert [e["step"] for e in logs if "eval_reward" in e] == [2, 4, 6]
    assert {"rewards/think_format_reward/mean", "rewards/letters_in_answer/mean"} <= set(logs[0])
    lines = [json.loads(line) for line in (full / "completions.jsonl").read_text().splitlines()]
    assert lines and lines[0]["prompt"].startswith("<|im_start|>")  # the chat template the model saw
    assert set(lines[0]["rewards"]) == {"think_format_reward", "letters_in_answer"}

    resumed = tmp_path / "resumed"
    kill_after_checkpoint(start(script, resumed), resumed / "checkpoint-2")
    output = finish(start(script, resumed, "--resume"))
    assert "Resuming from" in output
    actor = "actor/model.safetensors"
    assert (resumed / actor).read_bytes() == (full / actor).read_bytes(), "final actor differs"
    assert history(resumed) == logs
    assert (resumed / "completions.jsonl").read_bytes() == (full / "completions.jsonl").read_bytes()


@pytest.mark.parametrize("algorithm", ["rloo", "grpo"])
def test_the_script_runs_on_trl_with_only_its_import_changed(tmp_path, algorithm):
    text = SCRIPTS[algorithm].read_text()
    names = ", ".join(IMPORTS[algorithm])
    ours = f"from steadyrl import {names}"
    assert text.count(ours) == 1
    trl_script = tmp_path / f"{algorithm}_chat_trl.py"
    trl_script.write_text(text.replace(ours, f"from trl import {names}"))
    finish(start(trl_script, tmp_path / "trl", "--max_steps", "2"))
    assert (tmp_path / "trl" / "checkpoint-2").is_dir()
