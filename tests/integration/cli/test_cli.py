"""The ``steadyrl`` command line: training from a YAML file plus flags, listing checkpoints, exporting, the demos,
and training on local data files. Commands run in-process through ``steadyrl.cli.main.main`` (``python -m steadyrl``
is the same function). The commands' help and the refusals before any model is loaded: tests/unit/cli/test_cli.py."""

import sys

import pytest
from conftest import ROOT
from unit.cli.test_cli import steadyrl, write_dataset

from steadyrl.toy import chat_dataset, toy_dataset


def test_train_from_yaml_with_overrides_then_list_damage_and_export(tmp_path, toy_path, capsys):
    config = ROOT / "examples" / "configs" / "rloo_toy.yaml"  # max_steps: 20 there; the flags win
    run = tmp_path / "run"
    code, output = steadyrl(
        capsys, "rloo", "--config", config, "--output_dir", run, "--max_steps", "4", "--disable_tqdm", "true"
    )
    assert code == 0, output[-3000:]
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]

    code, table = steadyrl(capsys, "checkpoints", run)
    assert code == 0, table
    lines = table.splitlines()
    assert lines[0].split()[:2] == ["step", "size"]
    assert lines[1].split()[0] == "2" and "complete" in lines[1] and "<-" not in lines[1]
    assert lines[2].split()[0] == "4" and "complete" in lines[2] and "resume_from_checkpoint=True" in lines[2]

    weights = run / "checkpoint-4" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    code, table = steadyrl(capsys, "checkpoints", run)
    assert code == 1
    row4 = next(line for line in table.splitlines() if line.split()[0] == "4")
    assert "damaged" in row4 and "file model.safetensors has 100 bytes" in row4 and "<-" not in row4
    assert "resume_from_checkpoint=True" in next(line for line in table.splitlines() if line.split()[0] == "2")

    code, output = steadyrl(capsys, "export", run / "checkpoint-2", tmp_path / "actor")
    assert code == 0 and (tmp_path / "actor" / "model.safetensors").is_file(), output


def test_demo_trains_the_toy_task(tmp_path, toy_path, capsys):
    code, output = steadyrl(capsys, "demo", "--max_steps", "2", "--output_dir", tmp_path)
    assert code == 0, output[-3000:]
    assert "before ->" in output and "-m steadyrl demo --algorithm rloo" in output
    assert (tmp_path / "actor" / "model.safetensors").is_file() and (tmp_path / "reward_curve.png").is_file()


def test_demo_trains_the_real_model(tmp_path, capsys):
    """``make demo``'s command, one step of one prompt x 8 completions: accuracy before and after on held-out
    problems, the actor and the resume command."""
    flags = ["--max_steps", "1", "--prompts_per_step", "1", "--eval_size", "4"]
    code, output = steadyrl(capsys, "demo", "--model", "smollm2", *flags, "--output_dir", tmp_path)
    assert code == 0, output[-3000:]
    assert "held-out additions: " in output and "% before -> " in output
    assert "-m steadyrl demo --model smollm2" in output and "--resume_from_checkpoint true" in output
    assert (tmp_path / "actor" / "model.safetensors").is_file() and (tmp_path / "reward_curve.png").is_file()


REWARD_FILE = """
from pathlib import Path


def {name}(completions, letters, **kwargs):
    Path(__file__).with_suffix(".called").touch()
    return [sum(ch in word for ch in completion) / 4 for completion, word in zip(completions, letters)]
"""
SMALL_RUN = [
    "--max_steps",
    2,
    "--save_steps",
    2,
    "--rollout_batch_size",
    4,
    "--n_samples_per_prompt",
    2,
    "--train_batch_size",
    4,
    "--micro_train_batch_size",
    4,
    "--micro_rollout_batch_size",
    8,
    "--max_completion_length",
    4,
    "--report_to",
    "none",
    "--disable_tqdm",
    "true",
]


@pytest.mark.parametrize(
    "data_file, reward_from",
    [("prompts.jsonl", "file"), ("prompts.parquet", "module in the cwd"), ("prompts.csv", "file")],
)
def test_trains_on_a_local_data_file_with_a_reward_function_from_a_file_or_the_cwd(
    tmp_path, toy_path, capsys, monkeypatch, data_file, reward_from
):
    data = write_dataset(toy_dataset(num_prompts=16), tmp_path / "data" / data_file)
    work = tmp_path / "work"
    work.mkdir()
    (work / "cwd_rewards.py").write_text(REWARD_FILE.format(name="letters_seen"))
    if reward_from == "file":
        spec = f"{work / 'cwd_rewards.py'}:letters_seen"
    else:  # importable only because the command puts the current directory on sys.path
        monkeypatch.chdir(work)
        monkeypatch.setattr(sys, "path", list(sys.path))  # undo the command's change after the test
        monkeypatch.delitem(sys.modules, "cwd_rewards", raising=False)
        spec = "cwd_rewards:letters_seen"
    out = tmp_path / "out"
    code, output = steadyrl(
        capsys,
        "rloo",
        "--model_name_or_path",
        toy_path,
        "--dataset_name",
        data,
        "--reward_funcs",
        spec,
        "--output_dir",
        out,
        *SMALL_RUN,
    )
    assert code == 0, output[-3000:]
    assert (out / "checkpoint-2").is_dir() and (out / "actor" / "model.safetensors").is_file()
    assert (work / "cwd_rewards.called").is_file()


def test_trains_a_chat_model_on_a_conversational_data_file(tmp_path, capsys):
    from steadyrl.toy import chat_model_path

    data = write_dataset(chat_dataset("train"), tmp_path / "chat.jsonl")
    out = tmp_path / "out"
    code, output = steadyrl(
        capsys,
        "online-dpo",
        "--model_name_or_path",
        chat_model_path(),
        "--dataset_name",
        data,
        "--reward_funcs",
        "steadyrl.toy:letters_in_answer",
        "--output_dir",
        out,
        "--chat_template_kwargs",
        '{"enable_thinking": false}',
        *SMALL_RUN,
    )
    assert code == 0, output[-3000:]
    assert (out / "checkpoint-2").is_dir()
