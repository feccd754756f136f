"""A NaN gradient on one of two processes, under DDP, DeepSpeed ZeRO-2 and FSDP2: every process skips the same steps,
no checkpoint holds a non-finite number, and the run finishes max_steps."""

import pytest
import torch
from conftest import CONFIGS, MULTI_CPU, TWO_PROCESSES, ZERO, read_logs, run_toy
from safetensors.torch import load_file
from support.poison import nonfinite_tensors

ENGINES = {"ddp": MULTI_CPU, "zero2": ZERO["zero2"], "fsdp2": CONFIGS / "fsdp2.yaml"}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_nan_gradient_on_one_process_skips_the_step_on_every_process(tmp_path, toy_path, engine):
    """Process 0's gradients hold a NaN in steps 3 and 4, which the all-reduce (DDP) or reduce-scatter (ZeRO-2,
    FSDP2) spreads: neither step changes a weight or an optimizer moment on any process, so checkpoint-4 holds
    checkpoint-2's weights and optimizer state, and the run trains on to step 6."""
    config = ENGINES[engine]
    flags = ["--poison-grad", "3,4", *TWO_PROCESSES, "max_steps=6", "save_steps=2"]
    _, output = run_toy(tmp_path, *flags, accelerate_config=config)
    for step in (3, 4):
        assert output.count(f"Step {step}: skipped the update of the actor (") == 1, output[-3000:]
    logs = read_logs(tmp_path)
    assert sorted(logs) == list(range(1, 7))
    assert [logs[step].get("nonfinite_skipped_steps") for step in range(1, 7)] == [None, None, 1, 2, 2, 2]
    assert logs[4]["learning_rate"] == logs[3]["learning_rate"] == logs[5]["learning_rate"]  # not stepped
    checkpoints = {step: tmp_path / f"checkpoint-{step}" for step in (2, 4, 6)}
    assert sorted(tmp_path.glob("checkpoint-*")) == sorted(checkpoints.values())
    for directory in checkpoints.values():
        assert nonfinite_tensors(directory) == [], directory.name
    before, after = (load_file(checkpoints[step] / "model.safetensors") for step in (2, 4))
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    optimizer_files = sorted(p.name for p in checkpoints[2].glob("optimizer*.pt"))
    assert optimizer_files == (["optimizer.pt"] if engine == "ddp" else ["optimizer_0.pt", "optimizer_1.pt"])
    for name in optimizer_files:
        assert_same_state(*(torch.load(checkpoints[step] / name, weights_only=True) for step in (2, 4)))
    after_6 = load_file(checkpoints[6] / "model.safetensors")
    assert not all(torch.equal(after[k], after_6[k]) for k in after)  # steps 5 and 6 trained


def assert_same_state(a, b, name: str = "") -> None:
    if torch.is_tensor(a):
        assert torch.equal(a, b), name
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), name
        for key in a:
            assert_same_state(a[key], b[key], f"{name}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), name
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{name}.{i}")
    else:
        assert a == b, name
