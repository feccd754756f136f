"""Bad input fails with a specific error before training starts, or before any checkpoint is harmed: what the
error table (tests/integration/errors/test_*_errors.py, which provoke each documented error's exact text) does not
check, such as that nothing was written, or other values of the same refusal."""

import math
import os
import shlex
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT
from support.toy_run import make_config, make_trainer

from steadyrl import RewardFunctionError
from steadyrl.checkpoint import scan_checkpoints, verify_checkpoint


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(micro_rollout_batch_size=3), r"micro_rollout_batch_size=3 does not divide the 8 samples"),
        (dict(rollout_batch_size=0), r"rollout_batch_size=0 is invalid"),
        (dict(top_p=1.5), r"top_p=1.5 is invalid"),
    ],
)
def test_batch_hierarchy_and_ranges_refused_at_construction(tmp_path, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(tmp_path, **overrides)


def raises(prompts, completions, **kwargs):
    raise KeyError("score")


def wrong_length(prompts, completions, **kwargs):
    return [0.0] * (len(completions) - 1)


def returns_nan(prompts, completions, **kwargs):
    return [math.nan] + [0.0] * (len(completions) - 1)


@pytest.mark.parametrize(
    "func, message",
    [
        (raises, r"reward function 'raises' raised KeyError"),
        (wrong_length, r"reward function 'wrong_length' returned 7 values for 8 completions"),
        (returns_nan, r"reward function 'returns_nan' returned a non-finite value \(nan\) for completion 0"),
    ],
)
def test_bad_reward_function_stops_before_the_first_step(tmp_path, func, message):
    trainer = make_trainer(tmp_path, reward_funcs=[func])
    with pytest.raises(RewardFunctionError, match=message):
        trainer.train()
    assert trainer.state.global_step == 0 and not list(tmp_path.glob("*checkpoint-*"))


def test_reward_function_failing_mid_run_leaves_checkpoints_intact(tmp_path):
    from steadyrl.toy import letters_reward

    calls = []

    def flaky(prompts, completions, letters, **kwargs):
        calls.append(1)
        if len(calls) > 2:  # third rollout: after checkpoints 3 and 6 (4 steps per rollout)
            return [float("inf")] * len(completions)
        return letters_reward(completions=completions, letters=letters)

    trainer = make_trainer(tmp_path, reward_funcs=[flaky])
    with pytest.raises(RewardFunctionError, match="'flaky' returned a non-finite value"):
        trainer.train()
    assert trainer.state.global_step == 8
    assert [step for step, _ in scan_checkpoints(tmp_path).complete] == [3, 6]
    verify_checkpoint(tmp_path / "checkpoint-6")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(max_steps=-2), r"max_steps=-2 is invalid"),
        (dict(max_steps=-1, num_train_epochs=-1.5), r"num_train_epochs=-1.5 is invalid: .* a finite number > 0"),
        (dict(max_steps=-1, num_train_epochs=math.inf), r"num_train_epochs=inf is invalid"),
    ],
)
def test_run_length_refused_at_construction(tmp_path, overrides, message):
    """TrainingArguments would take max_steps=0 as -1 and train for 3 epochs; 0 epochs would train nothing."""
    with pytest.raises(ValueError, match=message):
        make_config(tmp_path, **overrides)
    assert make_config(tmp_path, max_steps=-1, num_train_epochs=0.5).total_steps(8) == 4  # 4 of 8 prompts: 1 rollout


def test_a_missing_output_dir_is_created_and_left_empty_by_the_writability_probe(tmp_path):
    make_trainer(tmp_path / "new" / "out")  # a missing directory is created, and the probe file removed
    assert [p.name for p in (tmp_path / "new" / "out").iterdir()] == []


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare (util-linux) for a read-only mount")
def test_output_dir_on_a_read_only_filesystem_is_refused(tmp_path):
    """A real read-only filesystem (a tmpfs mounted ro in a private mount namespace)."""
    out = tmp_path / "ro"
    out.mkdir()
    check = (
        f"from steadyrl.trainers.config.input_checks import check_output_dir; check_output_dir({str(out / 'run')!r})"
    )
    script = f"mount -t tmpfs -o ro,size=1m tmpfs {out} && {sys.executable} -c {shlex.quote(check)}"
    cmd = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    if "Traceback" not in proc.stderr:
        pytest.skip(reason=f"no private read-only mount here (user namespaces disabled?): {proc.stderr.strip()[-300:]}")
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"ValueError: output_dir={str(out / 'run')!r} is not writable ([Errno 30] Read-only file system"
    ), last
