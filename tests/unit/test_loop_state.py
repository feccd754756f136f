"""LoopState and the prompt sampler on their own: what a checkpoint saves of the loop and what a resume restores."""

from __future__ import annotations

import pytest
import torch

from steadyrl.data.sampling import PromptSampler
from steadyrl.rollout import Rollout, RolloutBuffer, minibatch_schedule
from steadyrl.trainers.loop.loop_state import LoopState, NoAlgorithmState


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


def test_a_fresh_state_needs_a_rollout_until_a_buffer_is_set_and_again_once_it_is_used_up():
    state = LoopState(PromptSampler(8, seed=0), NoAlgorithmState())
    assert state.needs_rollout
    state.buffer = RolloutBuffer(rollout(), [[0, 1], [2, 3]])
    assert not state.needs_rollout
    first, second = state.buffer.next_minibatch(), state.buffer.next_minibatch()
    assert first.scores.tolist() == [0.0, 1.0] and second.scores.tolist() == [2.0, 3.0]
    assert state.needs_rollout
    assert state.state_dict()["buffer"] is None, "a used-up buffer is not saved"


def test_pending_metrics_are_averaged_once_and_cleared():
    state = LoopState(PromptSampler(8, seed=0), NoAlgorithmState())
    state.record({"loss": 1.0, "kl": torch.tensor(0.5)})
    state.record({"loss": 3.0})
    assert state.take_means() == {"kl": 0.5, "loss": 2.0}
    assert state.take_means() == {}


def test_a_restored_state_continues_exactly_where_the_saved_one_was():
    saved = LoopState(PromptSampler(5, seed=3), KLCoef())
    saved.sampler.next(7)  # into the second epoch
    saved.rollouts, saved.algorithm.value = 2, 0.25
    saved.record({"loss": 1.5})
    saved.buffer = RolloutBuffer(rollout(), [[3, 0], [1, 2]], metrics={"reward": 1.0})
    saved.buffer.next_minibatch()
    state = saved.state_dict()

    restored = LoopState(PromptSampler(5, seed=0), KLCoef())
    restored.load_state_dict(state)
    assert (restored.rollouts, restored.algorithm.value, restored.sampler.consumed) == (2, 0.25, 7)
    assert restored.pending_metrics == {"loss": [1.5]} and restored.buffer.metrics == {"reward": 1.0}
    assert restored.sampler.next(6) == saved.sampler.next(6)
    assert torch.equal(restored.buffer.next_minibatch().prompt_ids, saved.buffer.next_minibatch().prompt_ids)
    assert restored.needs_rollout and saved.needs_rollout


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
