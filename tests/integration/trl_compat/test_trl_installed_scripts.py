"""TRL's own example scripts, as installed (trl/scripts/grpo.py and rloo.py), run on steadyrl with only the trainer
import changed: the script builds TRL's config from its command line and gives it to steadyrl's trainer as ``args``.

The runs use the toy model, a local JSON-lines dataset (``load_dataset`` of a directory with ``train.jsonl`` gives
its "train" split) and the toy reward by the dotted import path the scripts accept in ``--reward_funcs``.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trl

from steadyrl.toy import toy_dataset

SCRIPTS = Path(trl.__file__).parent / "scripts"
TRAINERS = {"grpo": "GRPOTrainer", "rloo": "RLOOTrainer"}
# GRPO turns bf16 off, as a CPU-only machine needs; RLOO runs on the CPU with bf16 as TRL resolves it (True)
PRECISION = {"grpo": ["--bf16", "false"], "rloo": ["--use_cpu", "true"]}


def with_steadyrl_trainer(algorithm: str, directory: Path) -> Path:
    """The installed script with its one ``from trl import <Trainer>, ...`` line split, the trainer from steadyrl."""
    text = (SCRIPTS / f"{algorithm}.py").read_text()
    trl_import = f"from trl import {TRAINERS[algorithm]}, "
    assert text.count(trl_import) == 1, f"trl/scripts/{algorithm}.py no longer imports its trainer as expected"
    script = directory / f"{algorithm}.py"
    script.write_text(text.replace(trl_import, f"from steadyrl import {TRAINERS[algorithm]}\n    from trl import "))
    return script


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_trls_installed_script_runs_with_only_the_trainer_import_changed(tmp_path, toy_path, algorithm):
    data = tmp_path / "data"
    data.mkdir()
    toy_dataset(16).to_json(str(data / "train.jsonl"))
    output_dir = tmp_path / "out"
    cmd = [
        sys.executable,
        str(with_steadyrl_trainer(algorithm, tmp_path)),
        "--model_name_or_path",
        toy_path,
        "--dataset_name",
        str(data),
        "--output_dir",
        str(output_dir),
        "--reward_funcs",
        "steadyrl.toy.letters_reward",
        "--max_steps",
        "2",
        "--save_steps",
        "2",
        "--per_device_train_batch_size",
        "4",
        "--num_generations",
        "4",
        "--max_completion_length",
        "8",
        "--report_to",
        "none",
        *PRECISION[algorithm],
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "Training completed" in run.stdout
    assert (output_dir / "checkpoint-2" / "manifest.json").is_file()
    assert json.loads((output_dir / "checkpoint-2" / "trainer_state.json").read_text())["global_step"] == 2
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in output_dir.iterdir()}
