"""Python, NumPy and torch RNG state as plain JSON, so restoring it unpickles nothing."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch


def capture_rng_state() -> dict:
    version, internal, gauss = random.getstate()
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state = {
        "python": [version, list(internal), gauss],
        "numpy": [np_kind, np_keys.tolist(), int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: dict) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np_kind, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_kind, np.array(np_keys, dtype=np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


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
        """On another number of processes, process r continues saved process r's RNG (modulo their number). What
        a run draws from it (dropout) then differs from the original run's; rollouts and mini-batches do not
        draw from it."""
        return states[rank % len(states)]
