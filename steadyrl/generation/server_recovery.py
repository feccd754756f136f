"""What the vLLM server backend (``vllm_server``) does when its server goes away or restarts during a run.

A completion request names the weights it expects (their label, ``server_auth``): a server that restarted holds its
startup weights and no claim, and refuses it (412) instead of answering with weights the trainer never pushed; a
server that was killed refuses nothing, it is unreachable. Either way the backend waits up to
``vllm_server_timeout`` for the server to answer again, checks it as at the start (the same model and settings, no
other run), claims it again, pushes the run's current weights again when the server lost them (the file transfer's
copy of them, still on disk, and a LoRA adapter from memory: no gathering of the actor, so any process can), and
sends the interrupted requests again with their own seeds, so the completions are those an uninterrupted run gets.
Several processes of a run that find the server restarted push once: the server lets the first push and the others
wait for it. A server that does not come back in time, or that comes back changed or claimed by another run, stops
the run with an error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from .lora_sync import adapter_bytes
from .server_client import ServerClient, VLLMServerError
from .server_weights import WeightTransfer

MAX_RECOVERIES = 3  # times in a row the server may go away before a request or push gets through
Row = TypeVar("Row")


@dataclass
class OnServer:
    """The run's weights the server holds, and how to push them again without the actor.

    Attributes:
        label: their label (each push has a new one), which completion requests name.
        version: the global step they are of.
        weights_version: the version whose copy the weight transfer keeps (the merged weights, or a LoRA actor's
            base weights, pushed once).
        adapter: ``(name, tensors, config)`` of a LoRA adapter served on top (adapter-only sync), else None.
    """

    label: str
    version: int
    weights_version: int
    adapter: tuple[str, dict, dict] | None = None


def recoverable(err: VLLMServerError) -> bool:
    """Whether waiting for the server and pushing the weights again may cure ``err``: no answer at all, or a server
    without the run's weights (412). Not a refusal of the key, another run's claim, or a bad request."""
    return err.unreachable or err.status == 412


def gave_up(cause: VLLMServerError, timeout: float) -> VLLMServerError:
    return VLLMServerError(
        f"{cause}; waited vllm_server_timeout={timeout:g} s for it to answer again",
        unreachable=True,
        status=cause.status,
    )


def await_weights(client: ServerClient, label: str, deadline: float, poll: float = 0.5) -> None:
    """Wait until the server holds the run's weights ``label``, which another process of the run is pushing."""
    while client.claim_state().get("weights") != label:
        if time.monotonic() + poll > deadline:
            raise VLLMServerError(
                f"the vLLM server at {client.base_url} did not get the run's weights {label} from the process of the "
                "run that pushes them again in time",
                status=412,
            )
        time.sleep(poll)


def put_back(client: ServerClient, transfer: WeightTransfer, on: OnServer, pusher: str, deadline: float) -> bool:
    """Make the server hold the run's weights ``on`` again: push them (True) where the server lets this process
    (``pusher``), else wait for the process of the run that does (False; nothing to do where they are there)."""
    if not client.claim(push=on.label, pusher=pusher).get("push"):
        await_weights(client, on.label, deadline)
        return False
    transfer.reload(on.weights_version)
    if on.adapter is not None:
        name, tensors, config = on.adapter
        client.load_adapter(name, adapter_bytes(tensors, config))
        client.reset_prefix_cache()
    client.pushed(on.label)
    return True


def complete_rows(
    one: Callable[[Row, int], object],
    rows: Sequence[Row],
    seeds: Sequence[int],
    workers: int,
    recover: Callable[[VLLMServerError, int], None],
) -> list:
    """``one(row, seed)`` for every row, ``workers`` at a time; the requests a recoverable failure interrupted are
    sent again, with their seeds, after ``recover(first failure, how many failed)`` (at most ``MAX_RECOVERIES`` times
    in a row without a request getting through). Any other failure is raised."""
    results: list = [None] * len(rows)
    pending, in_a_row = list(range(len(rows))), 0

    def attempt(index: int):
        try:
            return one(rows[index], seeds[index])
        except VLLMServerError as err:
            return err

    while pending:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, len(pending)))) as pool:
            outcomes = list(pool.map(attempt, pending))
        failed = [(i, out) for i, out in zip(pending, outcomes) if isinstance(out, VLLMServerError)]
        for i, out in zip(pending, outcomes):
            if not isinstance(out, VLLMServerError):
                results[i] = out
        if not failed:
            break
        fatal = [err for _, err in failed if not recoverable(err)]
        if fatal:
            raise fatal[0]
        in_a_row = in_a_row + 1 if len(failed) == len(pending) else 1
        if in_a_row > MAX_RECOVERIES:
            raise failed[0][1]
        recover(failed[0][1], len(failed))
        pending = [i for i, _ in failed]
    return results
