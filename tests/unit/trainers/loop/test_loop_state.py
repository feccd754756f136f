"""The loop's checkpoint parts and the prompt sampler on their own: what a checkpoint saves of the loop (through the
checkpointer's registry of parts, as files) and what a resume restores."""

from __future__ import annotations

import pytest
import torch

from steadyrl.checkpoint import CheckpointError
from steadyrl.checkpoint.state_registry import StateRegistry
from steadyrl.data.sampling import PromptSampler
from steadyrl.rollout import Rollout, RolloutBuffer, minibatch_schedule
from steadyrl.trainers.loop.loop_state import PendingMetrics, TrainingBuffer


class KLCoef:
    """An algorithm state (as PPO's adaptive KL coefficient) that changes between rollouts."""

    def __init__(self, value: float = 0.1) -> None:
        self.value = value

    def state_dict(self) -> dict:
        return {"value": self.value}

    def load_state_dict(self, state: dict) -> None:
        self.value = state["value"]


def rollout(samples: int = 4) -> Rollout:
    generator = torch.Generator().manual_seed(0)
    return Rollout(
        prompt_ids=torch.randint(3, 50, (samples, 3), generator=generator),
        prompt_mask=torch.ones(samples, 3, dtype=torch.long),
        completion_ids=torch.randint(3, 50, (samples, 2), generator=generator),
        completion_mask=torch.tensor([[1, 1], [1, 0]] * (samples // 2)),
        scores=torch.arange(samples, dtype=torch.float32),
        advantages=torch.randn(samples, generator=generator),
    )


class Loop:
    """The parts the trainer registers for the loop (the draw's counter stands in as a KLCoef-like value)."""

    def __init__(self, sampler_seed: int) -> None:
        self.sampler, self.algorithm = PromptSampler(5, seed=sampler_seed), KLCoef()
        self.current, self.pending = TrainingBuffer(), PendingMetrics()
        self.registry = StateRegistry()
        self.registry.register("sampler", self.sampler)
        self.registry.register("algorithm", self.algorithm)
        self.registry.register("rollout_buffer", self.current, per_process=True)
        self.registry.register("pending_metrics", self.pending, per_process=True)

    def save(self, directory) -> dict:
        self.registry.write_process_states(directory, rank=0)
        return self.registry.shared_states()


def test_a_fresh_buffer_needs_a_rollout_until_one_is_set_and_again_once_it_is_used_up():
    current = TrainingBuffer()
    assert current.needs_rollout
    current.buffer = RolloutBuffer(rollout(), [[0, 1], [2, 3]])
    assert not current.needs_rollout
    first, second = current.buffer.next_minibatch(), current.buffer.next_minibatch()
    assert first.scores.tolist() == [0.0, 1.0] and second.scores.tolist() == [2.0, 3.0]
    assert current.needs_rollout
    assert current.state_dict() == {}, "a used-up buffer is not saved"


def test_pending_metrics_are_averaged_once_and_cleared():
    pending = PendingMetrics()
    pending.record({"loss": 1.0, "kl": torch.tensor(0.5)})
    pending.record({"loss": 3.0})
    assert pending.take_means() == {"kl": 0.5, "loss": 2.0}
    assert pending.take_means() == {}


def test_registered_parts_restore_from_their_files_exactly_where_the_saved_loop_was(tmp_path):
    saved = Loop(sampler_seed=3)
    saved.sampler.next(7)  # into the second epoch
    saved.algorithm.value = 0.25
    saved.pending.record({"loss": 1.5})
    saved.current.buffer = RolloutBuffer(rollout(), [[3, 0], [1, 2]], metrics={"reward": 1.0})
    saved.current.buffer.next_minibatch()
    shared = saved.save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "pending_metrics_0.json",
        "rollout_buffer_0.json",
        "rollout_buffer_0.safetensors",  # the buffer's tensors, not pickled
    ]

    restored = Loop(sampler_seed=3)
    restored.registry.load(tmp_path, shared, rank=0)
    assert (restored.algorithm.value, restored.sampler.consumed) == (0.25, 7)
    assert restored.pending.values == {"loss": [1.5]} and restored.current.buffer.metrics == {"reward": 1.0}
    assert restored.sampler.next(6) == saved.sampler.next(6)
    again, before = restored.current.buffer.next_minibatch(), saved.current.buffer.next_minibatch()
    assert torch.equal(again.prompt_ids, before.prompt_ids) and torch.equal(again.advantages, before.advantages)
    assert restored.current.needs_rollout and saved.current.needs_rollout


def test_a_part_is_registered_once_under_a_plain_name_and_a_checkpoint_without_it_is_refused(tmp_path):
    loop = Loop(sampler_seed=0)
    with pytest.raises(ValueError, match="'sampler' is already registered"):
        loop.registry.register("sampler", PromptSampler(5, seed=0))
    with pytest.raises(ValueError, match="'fingerprint' is already registered \\(or reserved\\)"):
        loop.registry.register("fingerprint", KLCoef())
    with pytest.raises(ValueError, match="use lowercase letters"):
        loop.registry.register("Bad Name", KLCoef())
    shared = loop.save(tmp_path)
    del shared["algorithm"]
    with pytest.raises(CheckpointError, match="holds no state for 'algorithm', which this run keeps"):
        Loop(sampler_seed=0).registry.load(tmp_path, shared, rank=0)
    (tmp_path / "pending_metrics_0.json").unlink()
    with pytest.raises(CheckpointError, match=r"no 'pending_metrics' state for process 0 \(pending_metrics_0.json\)"):
        Loop(sampler_seed=0).registry.load(tmp_path, loop.registry.shared_states(), rank=0)


def test_the_sampler_walks_a_seeded_permutation_per_epoch():
    sampler = PromptSampler(4, seed=1)
    epochs = [sampler.next(4) for _ in range(3)]
    assert all(sorted(epoch) == [0, 1, 2, 3] for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) > 1, "each epoch its own order"
    assert epochs == [PromptSampler(4, seed=1).next(12)[i : i + 4] for i in (0, 4, 8)]
    assert sampler.epoch == 3.0
    in_order = PromptSampler(3, seed=1, shuffle=False)
    assert in_order.next(5) == [0, 1, 2, 0, 1] and in_order.epoch == pytest.approx(5 / 3)


def test_the_sampler_refuses_a_checkpoint_of_another_dataset_size():
    state = PromptSampler(4, seed=0).state_dict()
    with pytest.raises(ValueError, match="covered 4 prompts, but train_dataset has 6"):
        PromptSampler(6, seed=0).load_state_dict(state)


def test_the_minibatch_schedule_covers_every_sample_once_per_epoch():
    torch.manual_seed(0)
    schedule = minibatch_schedule(num_samples=6, minibatch_size=2, num_epochs=2)
    assert len(schedule) == 6
    for epoch in (schedule[:3], schedule[3:]):
        assert sorted(i for batch in epoch for i in batch) == list(range(6))


def test_each_process_trains_its_slice_of_the_same_global_minibatches():
    """The whole rollout and its global schedule on every process: process p of 2 trains the p-th half of each
    mini-batch, and one process the whole mini-batch; the halves make up the whole."""
    schedule = minibatch_schedule(8, 4, 1, generator=torch.Generator().manual_seed(3))
    whole = RolloutBuffer(rollout(8), schedule)
    halves = [RolloutBuffer(rollout(8), schedule).next_minibatch(part, 2) for part in (0, 1)]
    one = whole.next_minibatch()
    assert torch.equal(torch.cat([h.scores for h in halves]), one.scores)
    assert sorted(one.scores.tolist()) == sorted(float(i) for i in schedule[0])


def test_a_format_4_buffer_of_two_processes_trains_the_same_minibatches_on_any_number():
    """An older steadyrl saved each process's share of a rollout, with its own schedule. Put together, the whole
    buffer's p-th part of each mini-batch on 2 processes is old process p's mini-batch, and on 1 process both."""
    narrow = rollout(6)  # process 1's share: another size, and completions one column narrower
    columns = {"completion_ids": narrow.completion_ids[:, :1], "completion_mask": narrow.completion_mask[:, :1]}
    narrow = Rollout(**{**narrow.tensors(), **columns, "scores": narrow.scores + 10})
    shares = [rollout(4), narrow]
    old = [RolloutBuffer(shares[0], [[1, 0], [3, 2]], {"reward": 1.0}), RolloutBuffer(shares[1], [[4, 5], [0, 2]])]
    old[1].metrics = {"reward": 3.0}
    states = []
    for buffer in old:
        buffer.next_minibatch()  # one mini-batch trained before the save
        state = buffer.state_dict()
        state.pop("whole")
        states.append(state)
    for processes in (1, 2):
        restored = [TrainingBuffer(part, processes) for part in range(processes)]
        for current in restored:
            current.load_state_dict(TrainingBuffer.reshard(states, current.part, processes))
        parts = [current.next_minibatch() for current in restored]
        assert all(current.buffer.metrics == {"reward": 2.0} for current in restored)
        got = torch.cat([part.scores for part in parts]).tolist()
        assert got == old[0].rollout.scores[[3, 2]].tolist() + old[1].rollout.scores[[0, 2]].tolist()
        ids = torch.cat([part.trimmed().completion_ids for part in parts]) if processes == 1 else None
        if ids is not None:  # padded on the right where share 1 was narrower
            assert ids.shape[1] == 2 and ids[2:, 1].tolist() == [0, 0]


def test_pending_metrics_and_the_meter_on_another_number_of_processes():
    from steadyrl.reporting.run_summary import RunMeter
    from steadyrl.rng import RNGState

    saved = [{"loss": [1.0, 3.0]}, {"loss": [3.0, 5.0], "kl": [1.0, 1.0]}]
    assert PendingMetrics.reshard(saved, 1, 2) == saved[1]  # the same number: each its own
    assert PendingMetrics.reshard(saved, 0, 1) == {"kl": [1.0, 1.0], "loss": [2.0, 4.0]}
    meters = [{"elapsed": 5.0, "tokens": 7}, {"elapsed": 6.0, "tokens": 0}]
    assert [RunMeter.reshard(meters, r, 3)["tokens"] for r in range(3)] == [7, 0, 0]
    assert RunMeter.reshard(meters, 0, 1) == {"elapsed": 6.0, "tokens": 7}
    assert [RNGState.reshard(["a", "b"], r, 3) for r in range(3)] == ["a", "b", "a"]
