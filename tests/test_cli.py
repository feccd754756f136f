"""The ``steadyrl`` command line: training from a YAML file plus flags, listing checkpoints, exporting."""

import subprocess
import sys

from conftest import ROOT


def steadyrl(*args):
    proc = subprocess.run([sys.executable, "-m", "steadyrl", *map(str, args)], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


def test_train_from_yaml_with_overrides_then_list_damage_and_export(tmp_path, toy_path):
    config = ROOT / "examples" / "configs" / "rloo_toy.yaml"  # max_steps: 20 there; the flags win
    code, output = steadyrl("rloo", "--config", config, "--output_dir", tmp_path / "run", "--max_steps", "4",
                            "--disable_tqdm", "true")  # fmt: skip
    assert code == 0, output[-3000:]
    assert sorted(p.name for p in (tmp_path / "run").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    code, table = steadyrl("checkpoints", tmp_path / "run")
    assert code == 0, table
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["step", "size"]
    assert lines[1].split()[0] == "2" and "complete" in lines[1] and "<-" not in lines[1]
    assert lines[2].split()[0] == "4" and "complete" in lines[2] and "resume_from_checkpoint=True" in lines[2]

    weights = tmp_path / "run" / "checkpoint-4" / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, table = steadyrl("checkpoints", tmp_path / "run")
    assert code == 1
    row4 = next(line for line in table.splitlines() if line.split()[0] == "4")
    assert "damaged" in row4 and "actor/model.safetensors" in row4 and "<-" not in row4
    assert "resume_from_checkpoint=True" in next(line for line in table.splitlines() if line.split()[0] == "2")

    code, output = steadyrl("export", tmp_path / "run" / "checkpoint-2", tmp_path / "actor")
    assert code == 0 and (tmp_path / "actor" / "model.safetensors").is_file(), output


def test_bad_yaml_field_and_bad_flag_name_the_problem(tmp_path):
    config = tmp_path / "cfg.yaml"
    config.write_text("output_dir: out\nlearning_rat: 0.1\n")
    code, output = steadyrl("ppo", "--config", config)
    assert code == 2 and "learning_rat" in output and "unknown field" in output
    code, output = steadyrl("rloo", "--max_stepz", "3")
    assert code == 2 and "--max_stepz" in output


def test_help_describes_each_command():
    code, output = steadyrl("--help")
    assert code == 0 and all(name in output for name in ("rloo", "ppo", "online-dpo", "export", "checkpoints"))
    code, output = steadyrl("online-dpo", "--help")
    assert code == 0 and "--config" in output and "--beta" in output and "--judge" not in output
    code, output = steadyrl("checkpoints", "--help")
    assert code == 0 and "resume_from_checkpoint=True" in output
