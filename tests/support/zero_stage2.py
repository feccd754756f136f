"""A real DeepSpeed ZeRO-2 optimizer, in a process of its own (one process over gloo, on the CPU: a process group
left in the test process would change what later tests see), for checks of what a resume does with its state."""

from __future__ import annotations

import multiprocessing
import os
import socket
from collections.abc import Callable
from types import SimpleNamespace


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(work: Callable, args: tuple, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0")
    os.environ.update(WORLD_SIZE="1", LOCAL_WORLD_SIZE="1")
    try:
        import deepspeed
        import torch

        deepspeed.init_distributed(dist_backend="gloo")
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 3)  # one param group of 18 elements
        config = {"train_micro_batch_size_per_gpu": 1, "train_batch_size": 1, "zero_optimization": {"stage": 2}}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        engine, zero, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        engine.backward(engine(torch.randn(2, 5)).square().sum())
        engine.step()
        results.put(work(SimpleNamespace(optimizer=zero), *args))  # the ZeRO optimizer as accelerate's wrapper holds it
    except Exception as err:  # noqa: BLE001 - reported to the test
        results.put(f"{type(err).__name__}: {err}")


def in_zero2_process(work: Callable, *args, timeout: float = 300):
    """``work(optimizer, *args)`` (a module-level function) in a new process whose ``optimizer`` holds a real ZeRO-2
    optimizer of ``torch.nn.Linear(5, 3)`` after one AdamW step: what it returns, or its error as ``Type: message``."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    process = context.Process(target=_run, args=(work, args, free_port(), results))
    process.start()
    try:
        return results.get(timeout=timeout)
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()


def saved_by_two_processes(optimizer, extra: dict) -> list[dict]:
    """``optimizer``'s ZeRO-2 state (one flat param group) as 2 processes save it, each with half of the flat buffer,
    and ``extra`` (name -> tensor) added to each half's optimizer state."""
    from steadyrl.distributed.zero import zero_state

    whole = zero_state(optimizer)
    saved = []
    for rank in (0, 1):
        entry = {
            k: v.chunk(2)[rank].clone() if v.dim() else v.clone()
            for k, v in whole["base_optimizer"]["state"][0].items()
        }
        base = {"state": {0: {**entry, **extra}}, "param_groups": whole["base_optimizer"]["param_groups"]}
        partition = [whole["fp32_partitions"][0].chunk(2)[rank].clone()]
        saved.append({**whole, "base_optimizer": base, "fp32_partitions": partition})
    return saved


def resume_per_block_state(optimizer, directory: str) -> None:
    """Resume on this process the optimizer files of a ZeRO-2 checkpoint of 2 processes whose optimizer keeps 8-bit
    Adam's per-block ``absmax1`` (one value per block of 4 elements)."""
    import json
    from pathlib import Path

    import torch

    from steadyrl.checkpoint.checkpointer import read_optimizer_state

    checkpoint = Path(directory)
    checkpoint.mkdir(parents=True)
    for rank, state in enumerate(saved_by_two_processes(optimizer, {"absmax1": torch.ones(3)})):
        torch.save(state, checkpoint / f"optimizer_{rank}.pt")
        (checkpoint / f"rng_state_{rank}.json").write_text(json.dumps({}))  # how a checkpoint counts its processes
    read_optimizer_state(checkpoint, "optimizer.pt", optimizer, rank=0, processes=1)
