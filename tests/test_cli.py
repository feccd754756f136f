"""The ``steadyrl`` command line: training from a YAML file plus flags, listing checkpoints, exporting.
Commands run in-process through ``steadyrl.cli.main`` (``python -m steadyrl`` is the same function)."""

import pytest
from conftest import ROOT

from steadyrl.cli import main


def steadyrl(capsys, *args):
    try:
        code = main([str(arg) for arg in args])
    except SystemExit as exit:  # argparse errors and --help
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_train_from_yaml_with_overrides_then_list_damage_and_export(tmp_path, toy_path, capsys):
    config = ROOT / "examples" / "configs" / "rloo_toy.yaml"  # max_steps: 20 there; the flags win
    run = tmp_path / "run"
    code, output = steadyrl(capsys, "rloo", "--config", config, "--output_dir", run, "--max_steps", "4",
                            "--disable_tqdm", "true")  # fmt: skip
    assert code == 0, output[-3000:]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    code, table = steadyrl(capsys, "checkpoints", run)
    assert code == 0, table
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["step", "size"]
    assert lines[1].split()[0] == "2" and "complete" in lines[1] and "<-" not in lines[1]
    assert lines[2].split()[0] == "4" and "complete" in lines[2] and "resume_from_checkpoint=True" in lines[2]

    weights = run / "checkpoint-4" / "actor" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, table = steadyrl(capsys, "checkpoints", run)
    assert code == 1
    row4 = next(line for line in table.splitlines() if line.split()[0] == "4")
    assert "damaged" in row4 and "actor/model.safetensors" in row4 and "<-" not in row4
    assert "resume_from_checkpoint=True" in next(line for line in table.splitlines() if line.split()[0] == "2")

    code, output = steadyrl(capsys, "export", run / "checkpoint-2", tmp_path / "actor")
    assert code == 0 and (tmp_path / "actor" / "model.safetensors").is_file(), output


def test_bad_yaml_field_and_bad_flag_name_the_problem(tmp_path, capsys):
    config = tmp_path / "cfg.yaml"
    config.write_text("output_dir: out\nlearning_rat: 0.1\n")
    code, output = steadyrl(capsys, "ppo", "--config", config)
    assert code == 2 and "learning_rat" in output and "unknown field" in output
    code, output = steadyrl(capsys, "rloo", "--max_stepz", "3")
    assert code == 2 and "--max_stepz" in output


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--help"], ["rloo", "ppo", "online-dpo", "export", "checkpoints"]),
        (["online-dpo", "--help"], ["--config", "--beta", "--reward_funcs"]),
        (["checkpoints", "--help"], ["resume_from_checkpoint=True"]),
    ],
)
def test_help_describes_each_command(capsys, args, expected):
    code, output = steadyrl(capsys, *args)
    assert code == 0 and all(text in output for text in expected), output
