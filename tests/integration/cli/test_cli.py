"""The ``steadyrl`` command line: training from a YAML file plus flags, listing checkpoints, exporting.
Commands run in-process through ``steadyrl.cli.main.main`` (``python -m steadyrl`` is the same function)."""

import sys
from pathlib import Path

import pytest
from conftest import ROOT
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


def write_dataset(dataset, path: Path) -> Path:
    writers = {".jsonl": dataset.to_json, ".parquet": dataset.to_parquet, ".csv": dataset.to_csv}
    writers[path.suffix](str(path))
    return path


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
