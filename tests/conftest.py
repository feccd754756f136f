import contextlib
import ctypes
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOY_RUN = ROOT / "tests" / "support" / "toy_run.py"
CONFIGS = ROOT / "examples" / "accelerate_configs"
MULTI_CPU = CONFIGS / "multi_cpu.yaml"
ZERO = {stage: CONFIGS / f"{stage}.yaml" for stage in ("zero2", "zero3", "zero3_offload")}
# each process generates 2 prompts x 2 samples = 4 of the rollout's 8 samples, and accumulates gradients
# over 2 micro-batches of 1 per step (train_batch_size 4 = 1 x 2 processes x 2)
TWO_PROCESSES = ["--set", "micro_rollout_batch_size=4", "micro_train_batch_size=1"]
# toy_run settings of generation ahead (max_staleness) on a vLLM server, with the correction it needs
ASYNC = [
    "use_vllm=true",
    "vllm_dtype=float32",
    "vllm_mode=server",
    "vllm_importance_sampling_correction=true",
    "vllm_importance_sampling_mode=token_truncate",
]


@pytest.fixture(autouse=True, scope="module")
def release_memory():
    """Hand a test module's freed memory back to the system when the module ends. A pytest worker lives for the whole
    suite, and glibc keeps freed heap pages for reuse: at the end of a CI run the two workers held 9.1 and 4.4 GB, and
    beside a launch and a vLLM server the OOM killer stopped one."""
    yield
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


@pytest.fixture(scope="session")
def toy_path():
    from steadyrl.toy import toy_model_path

    return toy_model_path()


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory, toy_path):
    """``uninterrupted_run(algorithm)``: the output dir of an uninterrupted support/toy_run.py run with its defaults,
    run once per session and shared by the tests that compare resumed runs with it (do not modify it)."""
    runs = {}

    def get(algorithm: str) -> Path:
        if algorithm not in runs:
            runs[algorithm] = tmp_path_factory.mktemp(f"uninterrupted-{algorithm}")
            run_toy(runs[algorithm], "--algorithm", algorithm)
        return runs[algorithm]

    return get


@pytest.fixture(scope="session")
def ddp_runs(tmp_path_factory, toy_path):
    """Uninterrupted DDP runs, made on first use, one per algorithm."""
    runs = {}

    def run(algorithm):
        if algorithm not in runs:
            runs[algorithm] = tmp_path_factory.mktemp(f"ddp-{algorithm}")
            run_toy(runs[algorithm], "--algorithm", algorithm, *TWO_PROCESSES, accelerate_config=MULTI_CPU)
        return runs[algorithm]

    return run


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def toy_command(output_dir, *flags, overrides=(), accelerate_config=None, processes: int | None = None) -> list[str]:
    """The command line of support/toy_run.py (under ``accelerate launch --config_file accelerate_config`` if given,
    with ``processes`` instead of the config's number)."""
    cmd = [sys.executable, str(TOY_RUN), str(output_dir), *flags]
    if accelerate_config is not None:
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(accelerate_config)]
        if processes is not None:
            launcher += ["--num_processes", str(processes)]
        cmd = [*launcher, "--main_process_port", str(free_port()), *cmd[1:]]
    if overrides:
        cmd += ["--set", *overrides]
    return cmd


def run_toy(
    output_dir,
    *flags,
    expect_kill=False,
    overrides=(),
    accelerate_config=None,
    expect_failure=False,
    expect_status: int = 0,
    processes: int | None = None,
):
    """Run support/toy_run.py in a subprocess (under ``accelerate launch --config_file accelerate_config`` if
    given); return (returncode, combined output). It must exit with ``expect_status``, or be killed
    (``expect_kill``), or fail in any way (``expect_failure``)."""
    cmd = toy_command(output_dir, *flags, overrides=overrides, accelerate_config=accelerate_config, processes=processes)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    output = proc.stdout + proc.stderr
    if expect_failure:
        assert proc.returncode != 0, f"expected the run to fail:\n{output[-3000:]}"
    elif expect_kill and accelerate_config is not None:  # the launcher reports its killed workers as a failure
        assert proc.returncode != 0 and "Signal 9" in output, (
            f"expected SIGKILL, got {proc.returncode}:\n{output[-3000:]}"
        )
    elif expect_kill:
        assert proc.returncode == -9, f"expected SIGKILL, got {proc.returncode}:\n{output[-3000:]}"
    else:
        assert proc.returncode == expect_status, (
            f"training subprocess: status {proc.returncode}:\n{first_traceback(output)}{output[-3000:]}"
        )
    return proc.returncode, output


def first_traceback(output: str) -> str:
    """The first traceback in a run's output (a launch's failing rank's comes before the launcher's own), or ''."""
    start = output.find("Traceback (most recent call last)")
    return "" if start < 0 else output[max(0, start - 500) : start + 4000] + "\n[...]\n"


def run_entries(output_dir) -> list[str]:
    """The names in ``output_dir`` besides the metrics log every run appends to: checkpoints and any leftovers."""
    return sorted(path.name for path in Path(output_dir).iterdir() if path.name != "metrics.jsonl")


def step_entries(log_history: list[dict]) -> list[dict]:
    """``log_history`` without its last entry's end-of-training summary (``train_loss``, ``train_runtime``, ...),
    which ``Trainer`` appends after the run's last step."""
    return [entry for entry in log_history if "train_runtime" not in entry]


# a key bias (alone, or the key part of a fused qkv bias) has a gradient of 0 but for rounding noise, which Adam
# scales to learning-rate-sized steps: it differs between runs that reduce in another order (tests/integration/resume)
NOISE_ONLY = ("k_proj.bias", "qkv.bias")


def assert_close_weights(ours: Path, theirs: Path, rel: float = 1e-5) -> None:
    """The final actors of two runs agree within ``rel`` of each tensor's largest value (rounding noise aside)."""
    from safetensors.torch import load_file

    a, b = (load_file(run / "final-actor" / "model.safetensors") for run in (ours, theirs))
    assert a.keys() == b.keys()
    for name, tensor in b.items():
        if not name.endswith(NOISE_ONLY):
            assert (a[name] - tensor).abs().max() <= rel * tensor.abs().max().clamp(min=1e-12), name


def read_logs(output_dir):
    """The step entries of OUTPUT_DIR/log_history.json by step (the end-of-training summary left out)."""
    history = json.loads((Path(output_dir) / "log_history.json").read_text())
    return {entry["step"]: entry for entry in step_entries(history)}


def assert_close_to_scale(actual, expected, rel: float = 1e-5, scale: float | None = None, what: str = "") -> None:
    """``actual`` equals ``expected`` (numbers or tensors) within ``rel`` times their scale: the largest
    |expected| unless ``scale`` names it (e.g. the size of the terms a loss averages). Float32 results of two
    libraries, or of one library on two machines' kernels, differ by rounding proportional to the values' size, so
    an absolute bound that holds on one machine fails on another."""
    import torch

    expected, actual = torch.as_tensor(expected, dtype=torch.float64), torch.as_tensor(actual, dtype=torch.float64)
    scale = float(expected.abs().max()) if scale is None else scale
    error = float((actual - expected).abs().max())
    assert error <= rel * scale, f"{what}: off by {error:.3g}, more than {rel:g} x the scale {scale:.3g}"
