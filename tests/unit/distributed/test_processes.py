"""Work every process does (a rollout's generation on a vLLM server): a failure on one process raises on every one,
so that none is left waiting for it at the next collective. Two real processes over gloo."""

import multiprocessing
import os
import socket


def generate_on(rank: int, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
    os.environ.update(WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    from accelerate import Accelerator

    from steadyrl.distributed.processes import on_every_process

    accelerator = Accelerator(cpu=True)

    def generate():
        if rank == 1:
            raise ConnectionError("the vLLM server did not answer")
        return "completions"

    try:
        outcome = on_every_process(accelerator, "Generating a rollout", generate)
    except Exception as err:  # noqa: BLE001 - reported to the test
        outcome = f"{type(err).__name__}: {err}"
    # the next collective: every process reaches it (none is still waiting for another)
    accelerator.wait_for_everyone()
    results.put((rank, outcome))


def test_a_generation_failure_on_one_process_raises_on_every_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=generate_on, args=(rank, port, results)) for rank in range(2)]
    for process in processes:
        process.start()
    outcomes = dict(results.get(timeout=120) for _ in processes)
    for process in processes:
        process.join(30)
    assert outcomes == {
        0: "OtherProcessFailed: Generating a rollout failed on process 1; that process's error says why.",
        1: "ConnectionError: the vLLM server did not answer",
    }
