"""A streaming train_dataset (datasets.IterableDataset): accepted with max_steps, read epoch after epoch, resumed at
the exact row after a SIGKILL (byte-identical to an uninterrupted run), and read in the same order by every process,
each taking its slice of the rollout. The sampler alone: tests/unit/data/test_stream.py."""

import json
import os
import subprocess
import sys

import pytest
from conftest import MULTI_CPU, ROOT, free_port, read_logs
from support.stream_run import NUM_PROMPTS, write_prompt_files

from steadyrl.checkpoint.fingerprint import dataset_identity
from steadyrl.toy import toy_dataset

STREAM_RUN = ROOT / "tests" / "support" / "stream_run.py"


def run_stream(output_dir, data_dir, *flags, expect_kill=False, accelerate_config=None, overrides=()) -> str:
    """Run support/stream_run.py (under ``accelerate launch`` if ``accelerate_config``); return its output."""
    cmd = [sys.executable, str(STREAM_RUN), str(output_dir), str(data_dir), *flags]
    if accelerate_config is not None:
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accelerate_config)]
        cmd = [*launcher, "--main_process_port", str(free_port()), *cmd[1:]]
    if overrides:
        cmd += ["--set", *overrides]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == (-9 if expect_kill else 0), f"status {proc.returncode}:\n{output[-3000:]}"
    return output


def recorded_prompts(output_dir, rank: int = 0) -> list[dict]:
    return [json.loads(line) for line in (output_dir / f"prompts-{rank}.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("stream-data")
    write_prompt_files(folder)
    return folder


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, data_dir):
    output_dir = tmp_path_factory.mktemp("stream-uninterrupted")
    run_stream(output_dir, data_dir)
    return output_dir


def in_order(prompts: list[str], k: int = 2) -> list[str]:
    """The prompts of a rollout, each once (next_prompts repeats each ``k`` times, once per sample)."""
    return prompts[::k]


def test_stream_wraps_into_a_second_epoch(uninterrupted):
    rows = toy_dataset(num_prompts=NUM_PROMPTS)["prompt"]
    stream_order = rows[0::2] + rows[1::2]  # prompts-0.jsonl then prompts-1.jsonl
    rollouts = [in_order(entry["prompts"]) for entry in recorded_prompts(uninterrupted)]
    assert rollouts == [stream_order[:4], stream_order[4:] + stream_order[:2], stream_order[2:]]
    logs = read_logs(uninterrupted)
    assert sorted(logs) == list(range(1, 13)) and logs[12]["epoch"] == 2.0


def test_sigkill_after_checkpoint_resumes_the_stream_identically(uninterrupted, data_dir, tmp_path):
    run_stream(tmp_path, data_dir, "--kill-after-save", "6", expect_kill=True)
    saved = json.loads((tmp_path / "checkpoint-6" / "steadyrl_state.json").read_text())["sampler"]
    assert (saved["epoch"], saved["rows_in_epoch"], saved["consumed"]) == (1, 2, 8)
    output = run_stream(tmp_path, data_dir, "--resume")
    assert "Resuming from" in output and "checkpoint-6" in output
    ref = (uninterrupted / "final-actor" / "model.safetensors").read_bytes()
    assert (tmp_path / "final-actor" / "model.safetensors").read_bytes() == ref, "final actor weights differ"
    ref_logs, new_logs = read_logs(uninterrupted), read_logs(tmp_path)
    assert sorted(new_logs) == sorted(ref_logs)
    for step in range(7, 13):
        for key in set(ref_logs[step]) - {"tokens_per_second"}:
            assert new_logs[step][key] == ref_logs[step][key], f"step {step}: {key} differs"
    assert recorded_prompts(tmp_path) == recorded_prompts(uninterrupted), "the resumed run drew other prompts"


def test_two_processes_take_disjoint_slices_of_the_one_process_order(uninterrupted, data_dir, tmp_path):
    # 2 rollouts (8 steps); each process generates 2 prompts x 2 samples and accumulates over 2 micro-batches of 1
    overrides = ["max_steps=8", "micro_rollout_batch_size=4", "micro_train_batch_size=1"]
    run_stream(tmp_path, data_dir, accelerate_config=MULTI_CPU, overrides=overrides)
    one_process = [entry["prompts"] for entry in recorded_prompts(uninterrupted)][:2]
    ranks = [recorded_prompts(tmp_path, rank) for rank in (0, 1)]
    assert [[entry["first"] for entry in rank] for rank in ranks] == [[0, 0], [2, 2]]
    for rollout, expected in enumerate(one_process):
        assert ranks[0][rollout]["prompts"] + ranks[1][rollout]["prompts"] == expected


def test_stream_without_max_steps_is_refused(tmp_path):
    from support.toy_run import make_trainer

    stream = toy_dataset(num_prompts=4).to_iterable_dataset()
    with pytest.raises(ValueError, match=r"train_dataset is a datasets.IterableDataset .* max_steps=-1: set max_steps"):
        make_trainer(tmp_path, train_dataset=stream, max_steps=-1)


def test_a_stream_sets_the_loader_settings_it_is_read_with(tmp_path, caplog):
    """As TRL: every process reads the stream itself (dispatch_batches False), in the training process (no loader
    workers); a map-style train set next to a streaming eval set keeps its workers setting."""
    from support.toy_run import make_trainer

    stream = toy_dataset(num_prompts=4).to_iterable_dataset()
    trainer = make_trainer(tmp_path / "stream", train_dataset=stream, dataloader_num_workers=4)
    assert trainer.args.accelerator_config.dispatch_batches is False
    assert trainer.args.dataloader_num_workers == 0
    assert "overriding the provided value (4)" in caplog.text
    trainer = make_trainer(tmp_path / "eval", eval_dataset=stream, dataloader_num_workers=4)
    assert (trainer.args.accelerator_config.dispatch_batches, trainer.args.dataloader_num_workers) == (False, 4)
    trainer = make_trainer(tmp_path / "map", dataloader_num_workers=4)
    assert (trainer.args.accelerator_config.dispatch_batches, trainer.args.dataloader_num_workers) == (None, 4)


def test_fingerprint_of_a_stream_names_its_first_rows_and_files(data_dir, tmp_path):
    from support.stream_run import prompt_stream

    identity = dataset_identity(prompt_stream(data_dir))
    assert identity["dataset"] == "datasets.IterableDataset" and identity["num_prompts"] is None
    assert identity["dataset.files"] == ["prompts-0.jsonl", "prompts-1.jsonl"]
    moved = tmp_path / "moved"
    write_prompt_files(moved)
    assert dataset_identity(prompt_stream(moved)) == identity, "the same files elsewhere are the same data"
    (moved / "prompts-0.jsonl").write_text('{"prompt": "other:", "letters": "other"}\n')
    assert dataset_identity(prompt_stream(moved))["dataset.first_rows"] != identity["dataset.first_rows"]
