"""GKDTrainer on the toy chat task (the untrained toy chat model learns from the trained one): its loss is TRL 1.16's
``GKDTrainer.generalized_jsd_loss`` on the same batch, an off-policy rollout trains on the dataset's completions (TRL's
``messages`` format) where an on-policy one samples, the on-policy coin survives a SIGKILL and resume, and the trainer
takes TRL's arguments in TRL's order."""

from __future__ import annotations

import inspect
import os
import warnings

import pytest
import torch
from conftest import read_logs, run_toy
from support.tolerances import assert_within, decoder_bound
from support.toy_run import make_trainer

from steadyrl import GKDConfig, GKDTrainer
from steadyrl.toy import chat_dataset

# one rollout of 4 prompts, one completion each, trained in one micro-batch: TRL's batch
ONE_BATCH = dict(n_samples_per_prompt=1, train_batch_size=4, micro_train_batch_size=4, micro_rollout_batch_size=4)


@pytest.fixture(scope="module")
def trl_gkd():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from trl.experimental import gkd
    return gkd


def gkd_dataset():
    """The toy chat prompts in TRL's GKD format: a ``messages`` conversation whose last message, the completion, is
    the assistant's answer (the word's letters)."""

    def with_answer(row):
        return {"messages": row["prompt"] + [{"role": "assistant", "content": row["letters"]}]}

    return chat_dataset("train").map(with_answer, remove_columns=["prompt", "letters"])


def gkd_trainer(tmp_path, **settings):
    return make_trainer(tmp_path, algorithm="gkd", train_dataset=gkd_dataset(), **settings)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_loss_equals_trls_generalized_jsd_loss(tmp_path, trl_gkd, beta):
    """The loss of a batch of the dataset's completions is TRL's ``generalized_jsd_loss`` of the two models' logits,
    labels -100 outside the completions, as TRL's ``compute_loss`` calls it (``temperature`` samples only: the loss is
    at temperature 1), up to float32 rounding."""
    trainer = gkd_trainer(tmp_path, beta=beta, lmbda=0.0, temperature=0.7, **ONE_BATCH)
    batch = trainer.make_rollout_buffer().next_minibatch()
    assert len(batch) == 4
    loss, _ = trainer.algorithm.loss(trainer.model, batch)

    prompt_ids, prompt_mask, completion_ids, completion_mask = batch.token_tensors
    input_ids = torch.cat([prompt_ids, completion_ids], 1)
    attention_mask = torch.cat([prompt_mask, completion_mask], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)  # left-padded prompts, as steadyrl's passes place them
    labels = input_ids.masked_fill(torch.cat([torch.zeros_like(prompt_mask), completion_mask], 1) == 0, -100)
    with torch.no_grad():
        student, teacher = (
            model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
            for model in (trainer.model, trainer.teacher_model)
        )
    trl = trl_gkd.GKDTrainer.generalized_jsd_loss(student[:, :-1], teacher[:, :-1], labels[:, 1:], beta=beta)
    scale = max(1.0, float(student.abs().max()), float(teacher.abs().max()))
    assert_within(loss, trl, decoder_bound(trainer.model.config, input_ids.shape[1]) * scale, what="loss")
    assert float(trl) > 0


def test_off_policy_rollouts_are_the_datasets_completions_and_on_policy_ones_the_students(tmp_path):
    """lmbda=0: every rollout is the dataset's completions (the assistant's message, ending with EOS as the student's
    samples do) and trains; lmbda=1: the same prompts, completions the student sampled."""
    off = gkd_trainer(tmp_path / "off", lmbda=0.0, max_steps=4, save_steps=100, **ONE_BATCH)
    sampled = off.rollout_source.next(off.state)
    tok = off.processing_class
    answers = {
        tok.apply_chat_template(row["messages"][:-1], add_generation_prompt=True, tokenize=False): row["messages"][-1]
        for row in gkd_dataset()
    }
    prompts = [tok.apply_chat_template(p, add_generation_prompt=True, tokenize=False) for p in sampled.prompts]
    texts = tok.batch_decode(sampled.generation.completion_ids)
    assert texts == [answers[p]["content"] + "<|im_end|>" for p in prompts]
    assert sampled.metrics["on_policy"] == 0.0 and sampled.generation.logprobs is None

    on = gkd_trainer(tmp_path / "on", lmbda=1.0, **ONE_BATCH)
    sampled_on = on.rollout_source.next(on.state)
    assert sampled_on.prompts == sampled.prompts and sampled_on.metrics["on_policy"] == 1.0
    assert tok.batch_decode(sampled_on.generation.completion_ids) != texts

    off.train()  # from the first draw again: a new trainer's
    steps = [entry for entry in off.state.log_history if "divergence" in entry]
    assert [entry["on_policy"] for entry in steps] == [0.0] * 4
    assert all(0 < entry["divergence"] < float("inf") for entry in steps)
    assert steps[-1]["divergence"] < steps[0]["divergence"], steps


def test_sigkill_resume_makes_the_same_on_policy_choices(tmp_path):
    """With seed 0 and lmbda=0.5 the three rollouts of the 12-step toy run are on-, off- (the teacher's samples:
    seq_kd) and on-policy; a run SIGKILLed after the mid-rollout checkpoint 6 resumes to the uninterrupted run's
    weights and logs, the coin of the rollout after the kill included."""
    settings = ("--set", "lmbda=0.5", "seq_kd=true")
    reference, killed = tmp_path / "uninterrupted", tmp_path / "killed"
    run_toy(reference, "--algorithm", "gkd", *settings)
    run_toy(killed, "--algorithm", "gkd", "--kill-after-save", "6", *settings, expect_kill=True)
    _, output = run_toy(killed, "--algorithm", "gkd", "--resume", *settings)
    assert "Resuming from" in output and "checkpoint-6" in output
    ref_logs, new_logs = read_logs(reference), read_logs(killed)
    assert [ref_logs[step]["on_policy"] for step in range(1, 13)] == [1.0] * 4 + [0.0] * 4 + [1.0] * 4
    for step in range(7, 13):
        assert {k: v for k, v in new_logs[step].items() if k != "tokens_per_second"} == {
            k: v for k, v in ref_logs[step].items() if k != "tokens_per_second"
        }, step
    weights = "final-actor/model.safetensors"
    assert (killed / weights).read_bytes() == (reference / weights).read_bytes()


def test_trls_arguments_in_trls_order_and_config_defaults(tmp_path, trl_gkd):
    ours = list(inspect.signature(GKDTrainer.__init__).parameters)
    theirs = list(inspect.signature(trl_gkd.GKDTrainer.__init__).parameters)
    assert ours == theirs
    config = GKDConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True)
    trl_config = trl_gkd.GKDConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, bf16=False)
    for name in ("lmbda", "beta", "temperature", "max_new_tokens", "seq_kd", "disable_dropout", "learning_rate"):
        assert getattr(config, name) == getattr(trl_config, name), name
    assert config.max_completion_length == trl_config.max_new_tokens
