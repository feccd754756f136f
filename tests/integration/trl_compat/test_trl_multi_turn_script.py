"""A multi-turn GRPO script written for TRL (tools, environment_factory) runs with only its trainer import changed:
the same file runs under TRL itself, and under steadyrl it calls the tools and trains."""

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from steadyrl.toy.tools import tool_model_path

SCRIPT = ROOT / "tests" / "support" / "trl_tool_script.py"
TRL_IMPORT = "from trl import GRPOTrainer  # the line a user changes\n"


def run_script(path, kind, output_dir) -> list[dict]:
    env = {**os.environ, "TRL_EXPERIMENTAL_SILENCE": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(path), kind, tool_model_path(), str(output_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def as_steadyrl_script(tmp_path):
    text = SCRIPT.read_text()
    assert text.count(TRL_IMPORT) == 1
    path = tmp_path / "script.py"
    path.write_text(text.replace(TRL_IMPORT, "from steadyrl import GRPOTrainer\n"))
    return path


def test_the_script_runs_under_trl(tmp_path):
    history = run_script(SCRIPT, "tools", tmp_path / "out")
    assert any(entry.get("tools/call_frequency", 0) > 0 for entry in history)


@pytest.mark.parametrize("kind", ["tools", "environment"])
def test_the_trl_script_runs_with_only_the_import_changed(tmp_path, kind):
    history = run_script(as_steadyrl_script(tmp_path), kind, tmp_path / "out")
    steps = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in steps] == [1, 2]
    assert any(entry["tools/call_frequency"] > 0 for entry in steps), "no tool was called"
    assert all(0 < entry["env_token_share"] < 1 for entry in steps if entry["tools/call_frequency"] > 0)
    if kind == "environment":
        assert all("rewards/CalculatorEnv/mean" in entry for entry in steps), "get_reward is a reward source"
