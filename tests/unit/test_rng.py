"""A checkpoint's CUDA RNG is this process's device's only, so a resume on a node with fewer devices (another number
of processes) restores it. No GPU here: torch.cuda's RNG functions are replaced by a node of fake devices that records
what is set (the real ``*_all`` functions call one device's function per device, as these do)."""

from __future__ import annotations

import json
import logging

import pytest
import torch

from steadyrl.rng import RNGState, capture_rng_state, restore_rng_state


class FakeNode:
    """``devices`` CUDA devices, this process on ``current``; device i's RNG state is bytes [i] * 4 until set."""

    def __init__(self, monkeypatch, devices: int, current: int) -> None:
        self.devices, self.current, self.sets = devices, current, []
        self.states = {i: [i] * 4 for i in range(devices)}
        names = ("is_available", "device_count", "current_device", "get_rng_state", "set_rng_state")
        for name in (*names, "get_rng_state_all", "set_rng_state_all"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.devices

    def current_device(self) -> int:
        return self.current

    def index(self, device) -> int:
        index = self.current if device == "cuda" else int(device)
        if index >= self.devices:  # as torch.cuda.default_generators[index]
            raise IndexError("tuple index out of range")
        return index

    def get_rng_state(self, device="cuda") -> torch.Tensor:
        return torch.tensor(self.states[self.index(device)], dtype=torch.uint8)

    def set_rng_state(self, state: torch.Tensor, device="cuda") -> None:
        index = self.index(device)
        self.states[index] = state.tolist()
        self.sets.append((index, state.tolist()))

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [self.get_rng_state(i) for i in range(self.devices)]

    def set_rng_state_all(self, states) -> None:
        for i, state in enumerate(states):
            self.set_rng_state(state, i)


def saved_on(monkeypatch, devices: int, current: int) -> dict:
    """The RNG state a process on device ``current`` of a node of ``devices`` saves, through JSON as a checkpoint."""
    FakeNode(monkeypatch, devices, current)
    return json.loads(json.dumps(RNGState().state_dict()))


def test_the_state_holds_this_process_device_rng_and_restores_it_there_only(monkeypatch):
    state = saved_on(monkeypatch, devices=8, current=5)
    node = FakeNode(monkeypatch, devices=8, current=5)
    node.states[5] = [9] * 4  # drawn from since the save
    RNGState().load_state_dict(state)
    assert node.sets == [(5, [5] * 4)], "this device's RNG, set once; no other device's"


def test_a_resume_on_a_node_with_fewer_devices_restores_this_device_rng(monkeypatch):
    """Saved on device 5 of 8; the checkpoint resumed by 2 processes of a node of 2 devices: each restores the saved
    process's RNG (``reshard``: rank modulo the saved processes) on its own device."""
    saved = [saved_on(monkeypatch, devices=8, current=d) for d in range(8)]
    for rank in (0, 1):
        node = FakeNode(monkeypatch, devices=2, current=rank)
        RNGState().load_state_dict(RNGState.reshard(saved, rank, 2))
        assert node.sets == [(rank, [rank] * 4)]


def test_an_older_state_of_every_device_of_a_bigger_node_restores_this_device_entry(monkeypatch):
    """An older steadyrl saved every device's RNG of the node (8 entries); on a node of 2 devices, process 1 takes
    entry 1, where setting all 8 raised IndexError."""
    old = {**capture_rng_state(), "cuda": [[10 + i] * 4 for i in range(8)]}  # the CPU RNGs, and every device's
    node = FakeNode(monkeypatch, devices=2, current=1)
    restore_rng_state(old)
    assert node.sets == [(1, [11] * 4)]


def test_an_older_state_of_one_device_is_the_saving_process_own(monkeypatch):
    """A process that saw one device (CUDA_VISIBLE_DEVICES per process) saved its own device's RNG only."""
    old = {**capture_rng_state(), "cuda": [[7] * 4]}  # the CPU RNGs, and the one device's
    node = FakeNode(monkeypatch, devices=4, current=3)
    restore_rng_state(old)
    assert node.sets == [(3, [7] * 4)]


def test_an_older_state_without_this_device_entry_leaves_its_rng_and_says_so(monkeypatch, caplog):
    old = {**capture_rng_state(), "cuda": [[7] * 4, [8] * 4]}
    node = FakeNode(monkeypatch, devices=4, current=3)
    with caplog.at_level(logging.WARNING, logger="steadyrl.rng"):
        restore_rng_state(old)
    assert node.sets == []
    assert "CUDA RNG states are of 2 devices and this process runs on device 3" in caplog.text


@pytest.mark.parametrize("cuda", [False, True])
def test_python_numpy_and_torch_rngs_round_trip(monkeypatch, cuda):
    if cuda:
        FakeNode(monkeypatch, devices=2, current=0)
    state = capture_rng_state()
    expected = torch.rand(3)
    restore_rng_state(json.loads(json.dumps(state)))
    assert torch.equal(torch.rand(3), expected)
    assert ("cuda_device" in state) == cuda
