"""Resume bugs reported against peer projects (TRL, OpenRLHF, NeMo-RL, verl), replayed on steadyrl: each test builds
steadyrl's version of the reported situation and shows the resumed run trains exactly what an uninterrupted one does
(the same prompts with the same completions at every step, the same weights), or checkpoints where it should.

Each record of what was trained is (global step, the mini-batch's prompt token ids, its completion token ids) per
optimizer update, taken where the learner receives the mini-batch."""

from __future__ import annotations

import shutil

import pytest
import torch
from conftest import run_entries
from support.toy_run import make_trainer

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
    """(its output dir, what it trained, its final weights); do not modify."""
    output_dir = tmp_path_factory.mktemp("sync-reference")
    trainer = sync_trainer(output_dir)
    trained = record_trained(trainer)
    trainer.train()
    assert trainer.state.global_step == 12
    return output_dir, trained, actor_weights(trainer)


class GenerationCrash(RuntimeError):
    pass


def test_a_checkpoint_at_the_end_of_an_epoch_resumes_into_the_next_epoch(sync_reference, tmp_path):
    """verl#7401: a checkpoint written exactly at the end of a pass over the dataset resumed into zero steps and
    exited 0. Here checkpoint-8 ends epoch 0 (and its rollout); the run is sized by num_train_epochs, and the resume
    trains the 4 remaining steps of epoch 1, on the prompts the uninterrupted run trained."""
    output_dir, reference, weights = sync_reference
    checkpoint = output_dir / f"checkpoint-{EPOCH_STEPS}"
    assert not (checkpoint / "rollout_buffer_0.safetensors").exists(), "the checkpoint ends a rollout"
    shutil.copytree(checkpoint, tmp_path / checkpoint.name)
    resumed = sync_trainer(tmp_path)
    after = record_trained(resumed)
    resumed.train(resume_from_checkpoint=True)
    assert resumed.state.global_step == 12, "the resumed run stopped before the steps of the next epoch"
    assert resumed.sampler.consumed == 12  # both passes over the 8 prompts, the second half-way
    assert_trains_the_rest(reference, reference[:EPOCH_STEPS], after, EPOCH_STEPS)
    assert_same_weights(actor_weights(resumed), weights)


def test_a_crash_during_generation_regenerates_the_same_completions_and_skips_no_prompt(sync_reference, tmp_path):
    """NeMo-RL#3594: a run killed in the middle of a rollout regenerated it differently and skipped prompts on resume.
    Here the run crashes inside the second rollout's generation, after its completions were sampled (the sampler and
    the random streams have moved on); the resume from checkpoint-4 samples that rollout again, identically, and
    trains the same prompts with the same completions at every step."""
    _, reference, weights = sync_reference
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


# ---- checkpoint cadence ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ["rloo", "ppo"])
def test_several_updates_a_rollout_checkpoint_at_multiples_of_save_steps_only(uninterrupted_run, algorithm):
    """TRL#2124, TRL#1889: RLOO and PPO with several mini-batches and PPO epochs saved every 2 steps instead of every
    ``save_steps``. The shared toy run updates 4 times a rollout (2 epochs x 2 mini-batches) with save_steps=3:
    checkpoints land at 3, 6, 9 and 12 (two of them inside a rollout) and nowhere else, each holding its own step.
    (tests/integration/resume/test_checkpoint_cadence.py covers RLOO under gradient accumulation.)"""
    import json

    run = uninterrupted_run(algorithm)
    checkpoints = [name for name in run_entries(run) if name.startswith("checkpoint")]
    assert checkpoints == ["checkpoint-12", "checkpoint-3", "checkpoint-6", "checkpoint-9"]
    for name in checkpoints:
        state = json.loads((run / name / "trainer_state.json").read_text())
        assert state["global_step"] == int(name.split("-")[1]), f"{name} holds step {state['global_step']}"


# ---- LoRA with vLLM: merged weights pushed, never merged into the actor ---------------------------------------------

LORA_VLLM = dict(
    use_vllm=True,
    vllm_dtype="bfloat16",
    vllm_lora_sync="merged",
    model_init_kwargs={"dtype": "bfloat16"},
    allow_low_precision_weights=True,
    max_steps=3,
    save_steps=2,
    train_batch_size=8,  # one update a rollout: a sync before every rollout after the first
    micro_train_batch_size=4,
    num_ppo_epochs=1,
)


def lora_trainer(output_dir, **changes):
    from peft import LoraConfig

    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"])
    return make_trainer(output_dir, peft_config=lora, **{**LORA_VLLM, **changes})


def base_weights(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_" not in name}


def watch_base_weights(trainer) -> list[bool]:
    """Wraps the trainer's weight sync to vLLM: after each, whether every base weight is bit-identical to before
    training."""
    before, unchanged, sync = base_weights(trainer), [], trainer.backend.sync_weights

    def watched(model, version):
        sync(model, version)
        now = base_weights(trainer)
        unchanged.append(all(torch.equal(now[name], before[name]) for name in before))

    trainer.backend.sync_weights = watched
    return unchanged


def test_lora_weight_syncs_to_vllm_leave_the_bf16_base_bit_identical_and_resume_exactly(tmp_path):
    """TRL#6688: merging the LoRA adapter into the base weights for the vLLM sync, then unmerging it, drifted the bf16
    base by rounding at every sync, so a resumed run (which reloads the base) diverged. steadyrl pushes
    W + scale x BA computed out of place: after every sync the bf16 base is bit-identical to the loaded model, and a
    run resumed from checkpoint-2 trains what the uninterrupted one does and ends with the same adapter."""
    reference = lora_trainer(tmp_path / "reference")
    layer = next(m for name, m in reference.model.named_modules() if name.endswith("q_proj"))
    assert layer.base_layer.weight.dtype == torch.bfloat16
    unchanged, trained = watch_base_weights(reference), record_trained(reference)
    reference.train()
    assert unchanged == [True] * 3, "a sync to vLLM changed the base weights"
    lora_b = [p for name, p in actor_weights(reference).items() if "lora_B" in name]  # zeros before training
    assert lora_b and any(bool(p.any()) for p in lora_b), "the adapter did not train"

    shutil.copytree(tmp_path / "reference" / "checkpoint-2", tmp_path / "run" / "checkpoint-2")
    resumed = lora_trainer(tmp_path / "run")
    unchanged_after, after = watch_base_weights(resumed), record_trained(resumed)
    resumed.train(resume_from_checkpoint=True)
    assert unchanged_after == [True]
    assert_trains_the_rest(trained, trained[:2], after, 2)
    assert_same_weights(actor_weights(resumed), actor_weights(reference))


# ---- rollouts generated ahead on a vLLM server (max_staleness) -------------------------------------------------------


@pytest.fixture(scope="module")
def server():
    from support.vllm_serving import serving

    from steadyrl.toy import toy_model_path

    with serving(toy_model_path(), 256) as url:
        yield url


def ahead_trainer(output_dir, url: str, staleness: int, **changes):
    from support.vllm_serving import async_settings

    return make_trainer(output_dir, **{"algorithm": "grpo", **async_settings(url, staleness), **changes})


def test_draws_generated_ahead_and_their_dropped_groups_are_trained_once_each_after_a_resume(server, tmp_path):
    """TRL#7274: with asynchronous generation, a group dropped as too stale pinned the saved data position, and the
    resumed run replayed prompts. OpenRLHF#1322: with asynchronous oversampling, the buffered rollouts were dropped on
    resume. Here GRPO with dynamic sampling draws batches of prompts ahead of training (max_staleness=2); half the
    prompts get a constant reward, so their groups are dropped and a rollout takes 2 or more draws. checkpoint-3
    falls inside the first rollout, with draws generated ahead and queued; a run resumed from it (a copy: what a run
    killed right after that save leaves) trains, step by step, the prompts and completions the uninterrupted run
    trains (none twice, none skipped) and ends with its weights.
    (tests/integration/generation/test_async_rollouts.py resumes a run without dynamic sampling, comparing weights and
    logs.)"""
    import json

    changes = dict(reward_funcs="half_constant", dynamic_sampling=True, max_steps=8, save_steps=3)
    reference = ahead_trainer(tmp_path / "reference", server, 2, **changes)
    trained = record_trained(reference)
    reference.train()
    first_rollout = reference.state.log_history[0]
    assert first_rollout["dynamic_sampling/groups_dropped"] > 0 and first_rollout["dynamic_sampling/draws"] >= 2
    checkpoint = tmp_path / "reference" / "checkpoint-3"
    assert json.loads((checkpoint / "rollouts_ahead_0.json").read_text())["queue"], "nothing was queued ahead"
    assert (checkpoint / "rollout_buffer_0.safetensors").is_file(), "checkpoint-3 falls inside a rollout"
    shutil.copytree(checkpoint, tmp_path / "run" / checkpoint.name)
    resumed = ahead_trainer(tmp_path / "run", server, 2, **changes)
    after = record_trained(resumed)
    resumed.train(resume_from_checkpoint=True)
    assert_trains_the_rest(trained, trained[:3], after, 3)
    assert_same_weights(actor_weights(resumed), actor_weights(reference))
