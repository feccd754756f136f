"""Resharding an optimizer state without the engines: the span reader ZeRO's layouts use, and whole/FSDP2-style
shards of a real AdamW state put together into a plain optimizer. The engines themselves are in
tests/integration/distributed (ZeRO-2, ZeRO-3 and FSDP2 resumed 2 -> 1 -> 2)."""

import pytest
import torch

from steadyrl.distributed.optimizer_reshard import ReshardError, read_span, resharded_state


@pytest.mark.parametrize("saved, live", [(2, 1), (1, 2), (2, 3), (3, 2), (4, 4)])
def test_partitions_read_across_the_saved_ones_cut_the_same_buffer(saved, live):
    """ZeRO-1/2: a flat buffer of 11 elements, padded to a multiple of each number of processes and cut into equal
    partitions; each live partition read across the saved ones is that slice of the buffer, zeros in the padding."""
    flat = torch.arange(1, 12, dtype=torch.float32)

    def partitions(processes):
        size = -(-flat.numel() // processes)
        padded = torch.cat([flat, torch.zeros(size * processes - flat.numel())])
        return list(padded.split(size))

    chunks, expected = partitions(saved), partitions(live)
    size = expected[0].numel()
    for rank in range(live):
        assert torch.equal(read_span(chunks, rank * size, size), expected[rank])


def adamw_state(model: torch.nn.Module) -> torch.optim.AdamW:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(3):
        model(torch.randn(4, 5)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    return optimizer


def test_dim0_shards_of_a_real_adamw_state_put_together_equal_the_whole():
    """What an FSDP2 run of 2 processes saves (each state tensor's torch.chunk along dim 0, ``step`` alike), read
    into a plain optimizer of one process: the whole state, each entry its own tensor."""
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3)  # weight [3, 5] and bias [3]: 2 + 1 rows, uneven
    whole = adamw_state(model).state_dict()

    def shard(rank):
        state = {
            key: {name: value.chunk(2)[rank].clone() if value.dim() else value.clone() for name, value in entry.items()}
            for key, entry in whole["state"].items()
        }
        return {"state": state, "param_groups": whole["param_groups"]}

    fresh = torch.optim.AdamW(torch.nn.Linear(5, 3).parameters(), lr=1e-2)
    restored = resharded_state(fresh, [shard(0), shard(1)], rank=0)
    for key, entry in whole["state"].items():
        for name, value in entry.items():
            assert torch.equal(restored["state"][key][name], value), (key, name)
    steps = [entry["step"] for entry in restored["state"].values()]
    assert steps[0] is not steps[1], "an optimizer steps each entry's step in place: none may be shared"
    fresh.load_state_dict(restored)  # the form a plain optimizer loads


def test_state_of_another_model_is_refused_naming_the_parameter():
    torch.manual_seed(0)
    saved = adamw_state(torch.nn.Linear(5, 3)).state_dict()
    other = torch.optim.AdamW(torch.nn.Linear(5, 4).parameters())
    with pytest.raises(ReshardError, match=r"'exp_avg' of parameter 0 has shape \[3, 5\].*parameter \[4, 5\]"):
        resharded_state(other, [saved], rank=0)


def test_a_zero_state_into_an_optimizer_without_zero_is_refused():
    saved = {"base_optimizer": {}, "fp32_partitions": [], "loss_scaler": {}}
    with pytest.raises(ReshardError, match="written under DeepSpeed ZeRO and this run does not run under it"):
        resharded_state(torch.optim.AdamW(torch.nn.Linear(2, 2).parameters()), [saved], rank=0)


def reshard_from_two_processes(optimizer) -> dict[str, str]:
    """This real ZeRO-2 optimizer's state (one flat param group of 18 elements) as 2 processes save it (two
    partitions of 9), resharded into this 1-process optimizer: as it is, and with state that is not per element
    added to each partition, 8-bit Adam's (absmax1: one value per block of 4 elements; qmap1: 256 shared values)."""
    from support.zero_stage2 import saved_by_two_processes

    from steadyrl.distributed.zero import zero_state

    whole = zero_state(optimizer)
    extras = {"adam": {}, "per-block": {"absmax1": torch.ones(3)}, "shared": {"qmap1": torch.linspace(-1, 1, 256)}}
    outcomes = {}
    for name, extra in extras.items():
        try:
            restored = resharded_state(optimizer, saved_by_two_processes(optimizer, extra), rank=0)
        except ReshardError as err:
            outcomes[name] = str(err)
            continue
        moments = whole["base_optimizer"]["state"][0].items()
        same = all(torch.equal(restored["base_optimizer"]["state"][0][key], value) for key, value in moments)
        same = same and torch.equal(restored["fp32_partitions"][0], whole["fp32_partitions"][0])
        outcomes[name] = "the whole state" if same else "another state"
    return outcomes


def test_zero_state_that_is_not_per_element_is_refused_naming_the_key():
    """An optimizer whose state holds per-block or shared tensors cannot be cut along the partitions: refused,
    naming the key, rather than cut into wrong shapes; Adam's moments are put together."""
    from support.zero_stage2 import in_zero2_process

    outcomes = in_zero2_process(reshard_from_two_processes)
    assert isinstance(outcomes, dict), outcomes
    assert outcomes["adam"] == "the whole state"
    assert outcomes["per-block"].startswith(
        "the checkpoint's optimizer state 'absmax1' of process 0's fp32 partition 0 has shape [3], and the partition 9 "
        "elements: only state with one value per parameter element"
    )
    assert "'qmap1' of process 0's fp32 partition 0 has shape [256]" in outcomes["shared"]
    assert outcomes["shared"].endswith("Resume on the 2 processes that wrote the checkpoint.")
