"""examples/rloo.py runs with command-line flags, resumes with --resume_from_checkpoint true, and saves the actor."""

import subprocess
import sys

from conftest import ROOT


def run_example(*flags):
    cmd = [sys.executable, str(ROOT / "examples" / "rloo.py"), *flags]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    return proc.stdout + proc.stderr


def test_example_trains_and_resumes_from_the_command_line(tmp_path, toy_path):
    common = [
        "--output_dir",
        str(tmp_path),
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
    run_example(*common, "--max_steps", "2")
    assert (tmp_path / "checkpoint-2" / "manifest.json").is_file()
    output = run_example(*common, "--max_steps", "4", "--resume_from_checkpoint", "true")
    assert "Resuming from" in output and "checkpoint-2" in output
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]
    assert (tmp_path / "actor" / "model.safetensors").is_file()
