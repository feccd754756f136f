"""Where steadyrl's epochs end (trainers/loop/epochs.py), on the samplers alone: a rollout belongs to the pass of its
first prompt, rollouts drawn ahead count where their prompts are, and a stream's passes once its length is known.
The events themselves, against TRL: tests/integration/trl_compat/test_trainer_events.py."""

from __future__ import annotations

from types import SimpleNamespace

from datasets import Dataset

from steadyrl.data.sampling import PromptSampler
from steadyrl.data.stream import StreamSampler
from steadyrl.trainers.loop.epochs import Epochs


class Between:
    """A trainer between rollouts: the buffer needs the next one."""

    training_buffer = SimpleNamespace(needs_rollout=True)


def epoch_ends(epochs: Epochs, draw, rollouts: int) -> list[bool]:
    """For each rollout drawn with ``draw()``: whether the epoch ends after its last step."""
    ends = []
    for _ in range(rollouts):
        epochs.rollout_begins()
        draw()
        ends.append(epochs.pass_done())
    return ends


def test_a_rollout_that_runs_into_the_next_pass_ends_the_epoch_it_began_in():
    """3 prompts in rollouts of 2: prompts 0-3, 4-5, 6-7 (each pass is 3): the second rollout finishes pass 0 (and
    takes the first prompt of pass 1), the third finishes pass 1, the fourth begins pass 2 and does not finish it."""
    trainer, sampler = Between(), PromptSampler(3, seed=0)
    epochs = Epochs(trainer, sampler, source=None, rollout_batch_size=2)
    assert epoch_ends(epochs, lambda: sampler.next(2), 4) == [False, True, True, False]
    assert epochs.rollout_pass == 2


def test_rollouts_drawn_ahead_count_in_the_pass_of_their_prompts():
    """max_staleness: the sampler is two rollouts ahead of training (their draws queued in the source)."""
    trainer, sampler = Between(), PromptSampler(4, seed=0)
    source = SimpleNamespace(ahead=["rollout 1", "rollout 2"])
    epochs = Epochs(trainer, sampler, source, rollout_batch_size=2)
    sampler.next(6)  # rollouts 0, 1 and 2 drawn; rollout 0 trained
    assert epochs.pass_of() == 0  # rollout 1 (prompts 2-3) comes next
    source.ahead.pop(0)
    sampler.next(2)  # rollout 3 drawn as rollout 1 is taken
    assert epochs.pass_of() == 1  # rollout 2 (prompts 4-5) comes next


def test_a_streams_passes_once_its_length_is_known():
    """A stream of 4 rows in rollouts of 2: its length is known once a draw reads past its end (the third rollout),
    which ends the first epoch late and counts its rows in it; the second ends where pass 1 does, after one rollout,
    and the next ones after every two rollouts, as a map-style dataset's."""
    trainer = Between()
    sampler = StreamSampler(Dataset.from_dict({"prompt": list("abcd")}).to_iterable_dataset())
    epochs = Epochs(trainer, sampler, source=None, rollout_batch_size=2)
    assert epoch_ends(epochs, lambda: sampler.next(2), 7) == [False, False, True, True, False, True, False]
