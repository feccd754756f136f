"""Processes the benchmarks start: a script of their own as a worker under ``accelerate launch``, and a local
``steadyrl vllm-serve``."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE_CONFIGS = {name: ROOT / "examples" / "accelerate_configs" / f"{name}.yaml" for name in ("fsdp2", "zero3")}


class WorkerFailed(RuntimeError):
    """A launched worker exited with an error; ``killed`` when it was killed (out of memory, on this machine)."""

    def __init__(self, message: str, killed: bool) -> None:
        super().__init__(message)
        self.killed = killed


def launch_worker(script: str, engine: str, *worker_args: str, processes: int | None = None, output_dir=None):
    """Run ``script --worker *worker_args --output_dir D --result R`` under ``accelerate launch`` with the engine's
    config (examples/accelerate_configs/<engine>.yaml; ``processes`` instead of its number), one torch thread per
    process; return the JSON it wrote to R. D is ``output_dir``, else a temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        launcher = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ACCELERATE_CONFIGS[engine]),
        ]
        if processes is not None:
            launcher += ["--num_processes", str(processes)]
        cmd = [
            *launcher,
            str(Path(script).resolve()),
            "--worker",
            *worker_args,
            "--output_dir",
            str(output_dir or Path(tmp) / "out"),
            "--result",
            str(result),
        ]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            killed = "Signal 9" in tail or "SIGKILL" in tail
            raise WorkerFailed(f"{engine} {' '.join(worker_args)} failed:\n{tail}", killed)
        return json.loads(result.read_text())


def start_vllm_server(
    model: str, log: Path, *server_args: str, cores: str | None = None, env: dict | None = None
) -> tuple[subprocess.Popen, str]:
    """``steadyrl vllm-serve --model model *server_args`` on a free local port (on the CPU ``cores`` only, e.g. "1",
    if given), once it answers ``/health``: the process (its own session, to be killed as a group) and its URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "steadyrl",
        "vllm-serve",
        "--model",
        model,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        *server_args,
    ]
    if cores is not None:
        cmd = ["taskset", "-c", cores, *cmd]
    proc = subprocess.Popen(
        cmd,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )
    url = f"http://127.0.0.1:{port}"
    return proc, answering(proc, url, log)


def answering(proc: subprocess.Popen, url: str, log: Path) -> str:
    """``url`` once the server ``proc`` answers ``/health`` (within 5 minutes; its output is in ``log``)."""
    for _ in range(600):
        try:
            urllib.request.urlopen(url + "/health", timeout=2).close()
            return url
        except OSError:
            assert proc.poll() is None, f"the server exited; see {log}"
            time.sleep(0.5)
    raise RuntimeError(f"the server did not start; see {log}")
