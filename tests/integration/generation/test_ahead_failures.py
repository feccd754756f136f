"""max_staleness when things go wrong: a preemption that also stops the vLLM server, a reward function that fails or
blocks in a rollout generated ahead. Checkpoints of the steps already trained are still written, a resume from them
equals the uninterrupted run byte for byte, and the end of a run does not wait forever for a stuck worker."""

import functools
import json
import logging
import signal
import threading
import time

import pytest
import torch
from support.toy_run import make_trainer
from support.vllm_serving import async_settings, serving
from transformers import TrainerCallback

from steadyrl.generation.server_client import VLLMServerError
from steadyrl.rewards import RewardFunctionError
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path
from steadyrl.trainers.loop import ahead

MAX_MODEL_LEN = 256
LORA_RANK = 4
# GRPO, one rollout ahead: 4 steps a rollout, so rollout 2 is requested at global step 4 with step 4's weights
RUN = dict(algorithm="grpo", max_steps=12)


@pytest.fixture(scope="module")
def server():
    with serving(toy_model_path(), MAX_MODEL_LEN, "--max-lora-rank", str(LORA_RANK)) as url:
        yield url


@pytest.fixture(scope="module")
def reference(server, tmp_path_factory):
    """The uninterrupted run: its final weights and its log entries by step."""
    trainer = make_trainer(
        tmp_path_factory.mktemp("ahead-reference"), save_steps=100, **RUN, **async_settings(server, 1)
    )
    trainer.train()
    return weights_of(trainer), logs_of(trainer)


def weights_of(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.state_dict().items()}


def logs_of(trainer) -> dict:
    """The training and evaluation log entries, by (step, which)."""
    logs = {}
    for entry in trainer.state.log_history:
        if "loss" in entry or any(key.startswith("eval_") for key in entry):
            logs[entry["step"], "eval" if any(key.startswith("eval_") for key in entry) else "train"] = entry
    return logs


def assert_same_run(trainer, reference, first_step: int) -> None:
    """Weights byte for byte, and every logged metric but timings from ``first_step`` on."""
    weights, logs = reference
    for name, tensor in weights_of(trainer).items():
        assert torch.equal(tensor, weights[name]), f"{name} differs from the uninterrupted run"
    resumed = logs_of(trainer)
    assert {k for k in logs if k[0] >= first_step} <= set(resumed)
    for step in (s for s in logs if s[0] >= first_step):
        for key, value in logs[step].items():
            if not key.startswith("async/") and "per_second" not in key and "runtime" not in key:
                assert resumed[step][key] == value, f"step {step}: {key} {resumed[step][key]} != {value}"


def resume(output_dir, server, **settings):
    trainer = make_trainer(output_dir, **{**RUN, **async_settings(server, 1), **settings})
    trainer.train(resume_from_checkpoint=True)
    return trainer


class Preemption(TrainerCallback):
    """As global step ``step + 1`` begins: SIGTERM, and the vLLM server stops answering the trainer's worker (its
    weight push for the rollouts requested from then on never returns while ``server_down`` is set)."""

    def __init__(self, trainer, step: int) -> None:
        self.step, self.server_down, self.signalled_at = step, threading.Event(), None
        push_copy = trainer.backend.push_copy

        def push_to_a_stopped_server(weights, version):
            if version >= step:
                self.server_down.wait(60)
                raise VLLMServerError("the server stopped")
            return push_copy(weights, version)

        trainer.backend.push_copy = push_to_a_stopped_server

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            self.signalled_at = time.monotonic()
            signal.raise_signal(signal.SIGTERM)


def test_a_preemption_that_stops_the_server_still_checkpoints_and_the_resume_regenerates_exactly(
    server, reference, tmp_path, monkeypatch
):
    monkeypatch.setattr(ahead, "CLOSE_TIMEOUT_S", 0.5, raising=False)
    trainer = make_trainer(tmp_path, save_steps=100, **RUN, **async_settings(server, 1))
    preemption = Preemption(trainer, step=4)
    trainer.add_callback(preemption)
    try:
        with pytest.raises(SystemExit) as stopped:
            trainer.train()
        stopping = time.monotonic() - preemption.signalled_at  # a step, the checkpoint, the bounded wait
    finally:
        preemption.server_down.set()
    assert stopped.value.code == 143 and stopping < 30, stopping
    saved = json.loads((tmp_path / "checkpoint-5" / "rollouts_ahead_0.json").read_text())
    (request,) = saved["queue"]
    assert request["request"]["version"] == 4 and list(saved["weights"]) == ["4"], "stored as its request"
    assert_same_run(resume(tmp_path, server, save_steps=100), reference, first_step=6)


def failing_once(failures: list):
    """letters_reward (under its name), failing the first time it scores the rollout requested at global step 4."""

    @functools.wraps(letters_reward)
    def reward(completions, letters, trainer_state=None, **kwargs):
        if trainer_state.global_step == 4 and not failures:
            failures.append(trainer_state.global_step)
            raise RuntimeError("the reward service is down")
        return letters_reward(completions, letters, **kwargs)

    return reward


def test_a_reward_failure_ahead_fails_when_trained_on_not_the_checkpoint_before_it(server, reference, tmp_path):
    failures = []
    reward = failing_once(failures)
    trainer = make_trainer(tmp_path, save_steps=5, reward_funcs=[reward], **RUN, **async_settings(server, 1))
    with pytest.raises(RewardFunctionError, match="the reward service is down"):
        trainer.train()
    assert failures == [4] and trainer.state.global_step == 8, "it fails where rollout 2 is trained on"
    assert (tmp_path / "checkpoint-5").is_dir(), "the checkpoint of the steps trained before is written"
    assert_same_run(resume(tmp_path, server, save_steps=5, reward_funcs=[reward]), reference, first_step=6)


def test_the_end_of_a_run_does_not_wait_forever_for_a_blocked_reward(server, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(ahead, "CLOSE_TIMEOUT_S", 1.0, raising=False)
    blocked, release = threading.Event(), threading.Event()

    @functools.wraps(letters_reward)
    def blocking_reward(completions, letters, trainer_state=None, **kwargs):
        if trainer_state.global_step == 4:
            blocked.set()
            release.wait(60)
        return letters_reward(completions, letters, **kwargs)

    class FailAt(TrainerCallback):
        """The trainer's own error at step 7, once the reward function of the rollout requested at 4 is blocked."""

        raised_at = None

        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == 6:
                assert blocked.wait(60)
                FailAt.raised_at = time.monotonic()
                raise RuntimeError("the trainer's own error")

    trainer = make_trainer(
        tmp_path,
        save_steps=100,
        reward_funcs=[blocking_reward],
        callbacks=[FailAt()],
        **RUN,
        **async_settings(server, 1),
    )
    try:
        with caplog.at_level(logging.WARNING, logger=ahead.__name__), pytest.raises(RuntimeError, match="own error"):
            trainer.train()
        waited = time.monotonic() - FailAt.raised_at
    finally:
        release.set()
    assert waited < 15, f"the trainer's error came {waited:.0f} s after it was raised"
    assert "global step 4" in caplog.text and "blocking_reward" in caplog.text, caplog.text


class Killed(Exception):
    pass


class StopAfterSave(TrainerCallback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise Killed(f"killed after checkpoint-{self.step}")


def sampled_with(trainer) -> list:
    """Records the model the server is asked for (the base model's name: the merged copy pushed; an adapter's:
    base weights + adapter) at each generation of a rollout ahead, on the worker thread."""
    served, generate = [], trainer.backend.generate

    def recording(model, prompt_ids, seeds):
        if threading.current_thread().name.startswith("steadyrl-ahead"):  # the worker thread
            served.append(trainer.backend.served_name)
        return generate(model, prompt_ids, seeds)

    trainer.backend.generate = recording
    return served


def test_a_lora_adapter_run_evaluated_at_its_checkpoint_step_resumes_byte_identical(server, tmp_path):
    """The evaluation at step 4 leaves the server with the step's weights as base + adapter; the rollout requested
    next, at the same step, is still sampled with the merged copy, as after a resume from checkpoint-4 (base + adapter
    sample otherwise in float rounding: equal here on CPU, not in bf16 on a GPU)."""
    from peft import LoraConfig

    def lora_run(output_dir, **kwargs):
        lora = LoraConfig(r=LORA_RANK, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
        settings = dict(eval_strategy="steps", eval_steps=4, save_steps=4, max_steps=8, learning_rate=1e-2)
        return make_trainer(
            output_dir,
            algorithm="grpo",
            peft_config=lora,
            eval_dataset=toy_dataset(4, seed=1),
            vllm_lora_sync="adapter",
            **settings,
            **async_settings(server, 1),
            **kwargs,
        )

    uninterrupted = lora_run(tmp_path / "reference")
    served = sampled_with(uninterrupted)
    uninterrupted.train()
    interrupted = lora_run(tmp_path / "resumed", callbacks=[StopAfterSave(4)])
    with pytest.raises(Killed):
        interrupted.train()
    resumed = lora_run(tmp_path / "resumed")
    served_after_resume = sampled_with(resumed)
    resumed.train(resume_from_checkpoint=True)
    base = uninterrupted.backend.base_name
    assert served == [base] * 3 and served_after_resume == [base], (served, served_after_resume)
    assert_same_run(resumed, (weights_of(uninterrupted), logs_of(uninterrupted)), first_step=5)
