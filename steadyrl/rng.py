"""Python, NumPy and torch RNG state as plain JSON, so restoring it unpickles nothing. Of CUDA, the RNG of this
process's own device only: a resume may run on a node with another number of devices."""

from __future__ import annotations

import contextlib
import logging
import random

import numpy as np
import torch

logger = logging.getLogger(__name__)


def capture_rng_state() -> dict:
    version, internal, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [np_kind, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda_device"] = torch.cuda.get_rng_state(torch.cuda.current_device()).tolist()
    return state


def restore_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_kind, np.array(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if torch.cuda.is_available():
        restore_cuda_rng_state(state)


def restore_cuda_rng_state(state: dict) -> None:
    """This process's device's CUDA RNG from ``state``: its ``cuda_device``, or in a state of an older steadyrl
    (``cuda``: one per device the saving process saw) the saving process's own: the only one, else this device's."""
    device = torch.cuda.current_device()
    saved, seen = state.get("cuda_device"), state.get("cuda")
    if saved is None and seen is not None:
        if len(seen) > 1 and device >= len(seen):
            logger.warning(
                f"The checkpoint's CUDA RNG states are of {len(seen)} devices and this process runs on device "
                f"{device}: its CUDA RNG keeps its seed, so what it draws (dropout) differs from the original run."
            )
            return
        saved = seen[0] if len(seen) == 1 else seen[device]
    if saved is not None:
        torch.cuda.set_rng_state(torch.tensor(saved, dtype=torch.uint8), device)


@contextlib.contextmanager
def rng_untouched():
    """Run code that seeds or draws from the global RNGs (e.g. vLLM's engine start) without changing them."""
    state = capture_rng_state()
    try:
        yield
    finally:
        restore_rng_state(state)


class RNGState:
    """The process's global RNGs as a checkpoint part (``Checkpointer`` registers it, restored last)."""

    def state_dict(self) -> dict:
        return capture_rng_state()

    def load_state_dict(self, state: dict) -> None:
        restore_rng_state(state)

    @staticmethod
    def reshard(states, rank: int, processes: int) -> dict:
        """On another number of processes, process r continues saved process r's RNG (modulo their number), its CUDA
        RNG on process r's own device. What a run draws from it (dropout) then differs from the original run's;
        rollouts and mini-batches do not draw from it."""
        return states[rank % len(states)]
