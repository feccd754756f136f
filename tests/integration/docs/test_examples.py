"""The example scripts run with command-line flags (with python or accelerate launch), resume with
--resume_from_checkpoint true, and save the actor."""

import subprocess
import sys

import pytest
from conftest import ROOT, free_port


def run_example(script, *flags, launch=False):
    cmd = [sys.executable, str(ROOT / "examples" / script), *flags]
    if launch:
        config = ROOT / "examples" / "accelerate_configs" / "multi_cpu.yaml"
        launcher = ["-m", "accelerate.commands.launch", "--config_file", str(config)]
        cmd = [sys.executable, *launcher, "--main_process_port", str(free_port()), *cmd[1:]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout + proc.stderr


COMMON = [
    "--toy",
    "--rollout_batch_size",
    "4",
    "--n_samples_per_prompt",
    "2",
    "--train_batch_size",
    "8",
    "--micro_rollout_batch_size",
    "8",
    "--max_completion_length",
    "4",
    "--save_steps",
    "2",
    "--report_to",
    "none",
    "--disable_tqdm",
    "true",
]


# rloo.py runs under accelerate launch below, and `steadyrl rloo` (the same steadyrl.cli.train.train) in test_cli.
@pytest.mark.parametrize("script", ["ppo.py", "online_dpo.py"])
def test_example_trains_and_resumes_from_the_command_line(tmp_path, toy_path, script):
    common = ["--output_dir", str(tmp_path), *COMMON]
    run_example(script, *common, "--max_steps", "2")
    assert (tmp_path / "checkpoint-2" / "manifest.json").is_file()
    output = run_example(script, *common, "--max_steps", "4", "--resume_from_checkpoint", "true")
    assert "Resuming from" in output and "checkpoint-2" in output
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert (tmp_path / "actor" / "model.safetensors").is_file()


def test_example_runs_unchanged_under_accelerate_launch_with_two_processes(tmp_path, toy_path):
    common = ["--output_dir", str(tmp_path), *COMMON]
    run_example(
        "rloo.py",
        *common,
        "--max_steps",
        "2",
        "--micro_rollout_batch_size",
        "4",
        "--micro_train_batch_size",
        "4",
        launch=True,
    )
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]
    assert {"rng_state_0.json", "rng_state_1.json"} <= {p.name for p in (tmp_path / "checkpoint-2").iterdir()}
    assert (tmp_path / "actor" / "model.safetensors").is_file()


def readme_commands() -> list[str]:
    """The training commands of examples/README.md's table (those that run an example script or `steadyrl rloo`)."""
    import re

    text = (ROOT / "examples" / "README.md").read_text()
    commands = [m for row in text.splitlines() if row.startswith("| ") for m in re.findall(r"`([^`]+)`", row)]
    return [c for c in commands if re.search(r"examples/\w+\.py|steadyrl (rloo|grpo|ppo|online-dpo) ", c)]


def test_every_readme_command_writes_checkpoints_its_resume_line_continues():
    """A command without save_steps would checkpoint every 500 steps (Trainer's default), beyond the examples'
    max_steps: its "resume" would start over. Each sets save_steps (or its YAML does) within max_steps."""
    import yaml

    commands = readme_commands()
    assert len(commands) >= 9, commands
    for command in commands:
        words = command.split()
        flags = {words[i][2:]: words[i + 1] for i in range(len(words) - 1) if words[i].startswith("--")}
        if "--config" in words:
            flags = {**{k: str(v) for k, v in yaml.safe_load((ROOT / flags["config"]).read_text()).items()}, **flags}
        if command.startswith("python examples/ppo.py cfg.yaml"):
            continue  # the row names the YAML keys it needs (save_steps among them), checked below
        assert "save_steps" in flags, f"no save_steps: {command}"
        if "max_steps" in flags:
            assert int(flags["save_steps"]) <= int(flags["max_steps"]), command
    assert "`save_steps: 10`" in (ROOT / "examples" / "README.md").read_text()
