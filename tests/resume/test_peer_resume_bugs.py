"""Resume bugs reported against peer projects (TRL, OpenRLHF, NeMo-RL, verl), replayed on steadyrl: each test builds
steadyrl's version of the reported situation and shows the resumed run trains exactly what an uninterrupted one does
(the same prompts with the same completions at every step, the same weights), or checkpoints where it should.

Each record of what was trained is (global step, the mini-batch's prompt token ids, its completion token ids) per
optimizer update, taken where the learner receives the mini-batch."""

from __future__ import annotations

import pytest
import torch
from conftest import run_entries
from support.toy_run import make_trainer
from transformers import TrainerCallback

from steadyrl.toy import toy_dataset

Trained = list[tuple[int, list, list]]  # (global step, prompt ids, completion ids) per optimizer update


def record_trained(trainer) -> Trained:
    """What each optimizer update of ``trainer`` trains on, appended as it trains."""
    trained, train_on_minibatch = [], trainer.train_on_minibatch

    def recorded(minibatch):
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(minibatch.prompt_ids, minibatch.prompt_mask)]
        completions = [ids[m.bool()].tolist() for ids, m in zip(minibatch.completion_ids, minibatch.completion_mask)]
        trained.append((trainer.state.global_step + 1, prompts, completions))
        return train_on_minibatch(minibatch)

    trainer.train_on_minibatch = recorded
    return trained


class StopAfterSave(TrainerCallback):
    """Ends training (as a kill right after it would) once checkpoint-<step> is written."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def actor_weights(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters()}


def assert_same_weights(ours: dict, theirs: dict) -> None:
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs), "the resumed run's weights differ"


def assert_trains_the_rest(reference: Trained, before: Trained, after: Trained, resumed_at: int) -> None:
    """``after`` (the resumed run) trains, step by step, what ``reference`` trained after ``resumed_at``: no prompt
    trained twice, none skipped, each with the same completions; ``before`` (up to the stop) matches too."""
    assert [step for step, *_ in before] == list(range(1, resumed_at + 1))
    assert [step for step, *_ in after] == [step for step, *_ in reference if step > resumed_at]
    assert before + after == reference, "the interrupted and resumed runs trained other prompts or completions"


# ---- synchronous runs on the toy task: 8 prompts, 4 a rollout, 4 steps a rollout (2 epochs x 2 mini-batches) -------

# one pass over the prompts is 2 rollouts = 8 steps; num_train_epochs=1.5 sizes the run at 3 rollouts (12 steps)
EPOCH_STEPS = 8
SYNC = dict(max_steps=-1, num_train_epochs=1.5, save_steps=4)


def sync_trainer(output_dir, **changes):
    return make_trainer(output_dir, train_dataset=toy_dataset(num_prompts=8), **{**SYNC, **changes})


@pytest.fixture(scope="module")
def sync_reference(tmp_path_factory):
    trainer = sync_trainer(tmp_path_factory.mktemp("sync-reference"))
    trained = record_trained(trainer)
    trainer.train()
    assert trainer.state.global_step == 12
    return trained, actor_weights(trainer), trainer.state.log_history


class GenerationCrash(RuntimeError):
    pass


def test_a_checkpoint_at_the_end_of_an_epoch_resumes_into_the_next_epoch(sync_reference, tmp_path):
    """verl#7401: a checkpoint written exactly at the end of a pass over the dataset resumed into zero steps and
    exited 0. Here checkpoint-8 ends epoch 0 (and its rollout); the run is sized by num_train_epochs, and the resume
    trains the 4 remaining steps of epoch 1, on the prompts the uninterrupted run trained."""
    reference, weights, _ = sync_reference
    first = sync_trainer(tmp_path, callbacks=[StopAfterSave(EPOCH_STEPS)])
    before = record_trained(first)
    first.train()
    assert first.state.global_step == EPOCH_STEPS and first.sampler.consumed == 8  # the whole first epoch
    resumed = sync_trainer(tmp_path)
    after = record_trained(resumed)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 12, "the resumed run stopped before the steps of the next epoch"
    assert_trains_the_rest(reference, before, after, EPOCH_STEPS)
    assert_same_weights(actor_weights(resumed), weights)


def test_a_crash_during_generation_regenerates_the_same_completions_and_skips_no_prompt(sync_reference, tmp_path):
    """NeMo-RL#3594: a run killed in the middle of a rollout regenerated it differently and skipped prompts on resume.
    Here the run crashes inside the second rollout's generation, after its completions were sampled (the sampler and
    the random streams have moved on); the resume from checkpoint-4 samples that rollout again, identically, and
    trains the same prompts with the same completions at every step."""
    reference, weights, _ = sync_reference
    first = sync_trainer(tmp_path)
    before = record_trained(first)
    generate = first.backend.generate

    def crashing(model, prompt_ids, seeds):
        generation = generate(model, prompt_ids, seeds)
        if first.state.global_step == 4:  # the rollout of steps 5-8, after checkpoint-4
            raise GenerationCrash("killed during generation")
        return generation

    first.backend.generate = crashing
    with pytest.raises(GenerationCrash):
        first.train()
    assert run_entries(tmp_path) == ["checkpoint-4"]
    resumed = sync_trainer(tmp_path)
    after = record_trained(resumed)
    resumed.train(resume_from_checkpoint=True)
    assert_trains_the_rest(reference, before, after, 4)
    assert_same_weights(actor_weights(resumed), weights)
