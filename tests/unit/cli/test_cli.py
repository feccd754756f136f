"""The ``steadyrl`` command line before any model is loaded: each command's help, refused fields and flags, and
local data files read as prompt datasets (a missing or unreadable one, or a reward file that does not import, named
before any work). Commands run in-process through ``steadyrl.cli.main.main``. Training through the command line:
tests/integration/cli/test_cli.py."""

from pathlib import Path

import pytest
from datasets import Dataset

from steadyrl.cli.main import main
from steadyrl.cli.train import load_prompt_dataset
from steadyrl.toy import chat_dataset, toy_dataset


def steadyrl(capsys, *args):
    try:
        code = main([str(arg) for arg in args])
    except SystemExit as exit:  # argparse errors and --help
        code = exit.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_bad_yaml_field_and_bad_flag_name_the_problem(tmp_path, capsys):
    config = tmp_path / "cfg.yaml"
    config.write_text("output_dir: out\nlearning_rat: 0.1\n")
    code, output = steadyrl(capsys, "ppo", "--config", config)
    assert code == 2 and "learning_rat" in output and "unknown field" in output
    code, output = steadyrl(capsys, "rloo", "--max_stepz", "3")
    assert code == 2 and "--max_stepz" in output


@pytest.mark.parametrize(
    "flags, expected",
    [
        ([], "--model_name_or_path is required"),
        (["--dataset_name", "my/prompts"], "--model_name_or_path is required"),
        (["--model_name_or_path", "my/model"], "--dataset_name is required"),
        (["--toy", "--model_name_or_path", "my/model"], "--toy cannot be combined with --model_name_or_path"),
        (["--toy", "--dataset_name", "my/prompts"], "--toy cannot be combined with --dataset_name"),
    ],
)
def test_training_needs_toy_or_a_model_and_dataset(tmp_path, capsys, flags, expected):
    code, output = steadyrl(capsys, "rloo", "--output_dir", tmp_path, *flags)
    assert code == 2 and f"steadyrl rloo: error: {expected}" in output, output
    assert not any(tmp_path.iterdir())  # refused before any model was loaded or anything written


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--help"], ["rloo", "ppo", "online-dpo", "demo", "export", "checkpoints"]),
        (["rloo", "--help"], ["--toy", "--model_name_or_path", "--dataset_name"]),
        (["demo", "--help"], ["--algorithm", "--max_steps", "--output_dir"]),
        (["online-dpo", "--help"], ["--config", "--beta", "--reward_funcs"]),
        (["checkpoints", "--help"], ["resume_from_checkpoint=True"]),
    ],
)
def test_help_describes_each_command(capsys, args, expected):
    code, output = steadyrl(capsys, *args)
    assert code == 0 and all(text in output for text in expected), output


def write_dataset(dataset, path: Path) -> Path:
    writers = {".jsonl": dataset.to_json, ".parquet": dataset.to_parquet, ".csv": dataset.to_csv}
    writers[path.suffix](str(path))
    return path


def test_local_datasets_load_plain_or_conversational_from_a_file_or_folder(tmp_path):
    chat = write_dataset(chat_dataset("eval"), tmp_path / "chat.jsonl")
    dataset = load_prompt_dataset(str(chat))
    assert isinstance(dataset, Dataset) and len(dataset) == 16
    assert dataset[0]["prompt"][-1]["role"] == "user" and isinstance(dataset[0]["prompt"][-1]["content"], str)
    folder = tmp_path / "folder"
    write_dataset(toy_dataset(num_prompts=8), folder / "train.jsonl")
    write_dataset(toy_dataset(num_prompts=4, seed=1), folder / "test.jsonl")
    assert len(load_prompt_dataset(str(folder), "test")) == 4
    assert load_prompt_dataset(str(folder))["prompt"] == toy_dataset(num_prompts=8)["prompt"]


def test_bad_local_dataset_or_reward_file_names_it_before_loading_a_model(tmp_path, toy_path, capsys):
    (tmp_path / "notes.txt").write_text("abc:\n")
    run = ["rloo", "--model_name_or_path", toy_path, "--output_dir", tmp_path / "out"]
    for dataset, problem in [
        (tmp_path / "missing.jsonl", "no such file or folder"),
        (tmp_path / "notes.txt", "cannot read .txt files"),
    ]:
        code, output = steadyrl(capsys, *run, "--dataset_name", dataset)
        assert code == 2 and f"--dataset_name {dataset}: {problem}. Give a .json, .jsonl, .parquet" in output, output
    data = write_dataset(toy_dataset(num_prompts=8), tmp_path / "prompts.csv")
    for spec in [f"{tmp_path / 'missing.py'}:score", "steadyrl.toy:no_such_reward"]:
        code, output = steadyrl(capsys, *run, "--dataset_name", data, "--reward_funcs", spec)
        assert isinstance(code, str) and code.startswith(f"--reward_funcs {spec!r}: cannot import it ("), code
    assert not (tmp_path / "out").exists()
