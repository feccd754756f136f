"""Adding a generation backend is one class and one registry line: a backend registered here, which answers without
any model, is picked by the config's generation_backend alone and drives a real GRPO run on the toy task."""

from __future__ import annotations

import math

from support.toy_run import ALGORITHM_DEFAULTS, DEFAULTS

from steadyrl import GRPOConfig, GRPOTrainer
from steadyrl.generation import BACKENDS, Capabilities, Generation, GenerationBackend
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path


class EchoBackend(GenerationBackend):
    """Answers each prompt row with its first ``seed % 3 + 1`` tokens, then EOS: no model, no weights to push."""

    capabilities = Capabilities()  # an engine of its own: the actor is not gathered for it, no log-probs
    calls: list[int] = []  # rows per generate call

    def generate(self, model, prompt_ids, seeds):
        type(self).calls.append(len(prompt_ids))
        eos = self.tokenizer.eos_token_id
        return Generation([prompt[: seed % 3 + 1] + [eos] for prompt, seed in zip(prompt_ids, seeds)])


def test_a_backend_registered_by_name_drives_a_grpo_run(tmp_path, monkeypatch):
    monkeypatch.setitem(BACKENDS, "echo", EchoBackend)
    monkeypatch.setattr(EchoBackend, "calls", [])
    settings = {**DEFAULTS, **ALGORITHM_DEFAULTS["grpo"], "max_steps": 8, "save_strategy": "no"}
    trainer = GRPOTrainer(
        model=toy_model_path(),
        args=GRPOConfig(output_dir=str(tmp_path), generation_backend="echo", **settings),
        train_dataset=toy_dataset(),
        reward_funcs=[letters_reward],
    )
    assert isinstance(trainer.backend, EchoBackend) and trainer.backend.max_model_len is None
    assert (trainer.args.use_vllm, trainer.use_vllm) == (False, False), "TRL's use_vllm reads False: not vLLM"
    before = {name: param.detach().clone() for name, param in trainer.model.named_parameters()}
    trainer.train()
    assert EchoBackend.calls == [8, 8], "two rollouts of 4 prompts x 2 samples, each in one call (own engine)"
    rollout = trainer.training_buffer.buffer.rollout
    eos = trainer.processing_class.eos_token_id
    rows = zip(rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids, rollout.completion_mask)
    for prompt, prompt_mask, completion, completion_mask in rows:
        prompt, sampled = prompt[prompt_mask.bool()].tolist(), completion[completion_mask.bool()].tolist()
        assert sampled[-1] == eos and 1 < len(sampled) <= 4 and sampled[:-1] == prompt[: len(sampled) - 1]
    logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(logs) == 8 and all(math.isfinite(entry["loss"]) for entry in logs)
    assert "generation_logprob_diff" not in logs[0], "no log-probs reported, no engine check"
    assert any(not param.detach().equal(before[name]) for name, param in trainer.model.named_parameters())
