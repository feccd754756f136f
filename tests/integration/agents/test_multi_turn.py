"""Multi-turn rollouts with TRL's API (tools, environment_factory, rollout_func) on the tool fixture: the trained ids
are the sampled ids plus the tools' ids, the environment's tokens are out of the loss, and a run killed after a
mid-rollout checkpoint resumes byte-identical, with HF generate and with vLLM."""

import re

import pytest
import torch
from conftest import read_logs, run_toy
from support.toy_run import make_config, make_trainer, tool_task
from transformers import TrainerCallback

from steadyrl.toy import letters_reward
from steadyrl.toy.tools import Calculator, add, sum_dataset, tool_tokenizer

TOOL_REPLY = re.compile(r"^\n<\|im_start\|>tool\n(-?\d+)<\|im_end\|>\n<\|im_start\|>assistant\n$")
CALL = re.compile(r'<tool_call>\n\{"name": "add", "arguments": \{"a": (-?\d+), "b": (-?\d+)\}\}\n</tool_call>')


class KeepBuffer(TrainerCallback):
    """Keeps each rollout buffer the run trained on."""

    def __init__(self):
        self.trainer, self.buffers = None, []

    def on_step_end(self, args, state, control, **kwargs):
        buffer = self.trainer.training_buffer.buffer
        if buffer is not None and (not self.buffers or self.buffers[-1] is not buffer):
            self.buffers.append(buffer)


def train(tmp_path, kind, algorithm="grpo", **overrides):
    keep = KeepBuffer()
    settings = {**tool_task(kind), "max_steps": 4, "save_steps": 100, **overrides}
    trainer = make_trainer(tmp_path, algorithm=algorithm, callbacks=[keep], **settings)
    keep.trainer = trainer
    trainer.train()
    return trainer, keep.buffers


def runs(mask: list[int]) -> list[tuple[int, int, int]]:
    """(value, start, end) of each run of equal values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_tools_trajectories_are_the_sampled_ids_plus_the_tool_replies(tmp_path, algorithm):
    trainer, buffers = train(tmp_path, "tools", algorithm)
    tok = trainer.processing_class
    calls = 0
    for buffer in buffers:
        rollout = buffer.rollout
        assert rollout.env_mask is not None
        for ids, present, env in zip(rollout.completion_ids, rollout.completion_mask, rollout.env_mask):
            ids, env = ids[present.bool()].tolist(), env[present.bool()].tolist()
            segments = runs(env)
            assert segments[0][0] == 1, "a trajectory starts with the policy's turn"
            for k, (value, start, end) in enumerate(segments):
                if value == 1:
                    continue
                calls += 1
                sampled = tok.decode(ids[segments[k - 1][1] : segments[k - 1][2]])
                # the turn before a reply holds a call (the tiny model may write on after it, before its end)
                a, b = map(int, CALL.search(sampled).groups())
                reply = TOOL_REPLY.match(tok.decode(ids[start:end]))
                assert reply and int(reply.group(1)) == a + b, "the env tokens are exactly the tool's reply"
                assert k + 1 < len(segments), "a reply is followed by the policy's next turn"
    assert calls > 0, "the tool fixture made no call"
    logged = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry]
    assert logged and all(e["tools/call_frequency"] > 0 for e in logged)
    assert all(0 < e["env_token_share"] < 1 and e["turns_per_rollout"] > 1 for e in logged)
    assert "tools/failure_frequency" in logged[0]


def test_environment_factory_resets_scores_and_exposes_its_methods(tmp_path):
    trainer, buffers = train(tmp_path, "environment")
    tok = trainer.processing_class
    prompts = tok.batch_decode(buffers[0].rollout.prompt_ids, skip_special_tokens=False)
    assert all("tools: add<|im_end|>" in p and "Use the tool.<|im_end|>" in p for p in prompts), "reset() appends"
    assert any(e.get("tools/call_frequency", 0) > 0 for e in trainer.state.log_history), "no environment tool call"
    entries = [e for e in trainer.state.log_history if "rewards/Calculator/mean" in e]
    assert entries, "get_reward is a reward source named after the environment class"
    assert trainer.reward_weights.tolist() == [1.0, 1.0, 1.0]
    assert [type(e).__name__ for e in trainer.multi_turn.environments.pool[None]] == ["Calculator"] * 8
    metrics = trainer.evaluate(sum_dataset(4, seed=1))  # evaluation runs the same multi-turn rollouts
    assert {"eval_rewards/Calculator/mean", "eval_rewards/correct_sum/mean"} <= set(metrics)


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_turn(tmp_path):
    tok = tool_tokenizer()
    # like Qwen3's: an earlier assistant turn loses its <think> block once a later turn follows
    tok.chat_template = tok.chat_template.replace(
        "message.content }}", "(message.content.split('</think>')[-1] if not loop.last else message.content) }}"
    )
    with pytest.raises(ValueError, match=r"not append-only: adding turn 2 \(tool\).*think"):
        make_trainer(tmp_path, algorithm="grpo", **{**tool_task("tools"), "processing_class": tok})


def test_tools_need_conversational_prompts(tmp_path):
    with pytest.raises(ValueError, match="tools / environment_factory need conversational prompts"):
        make_trainer(tmp_path, algorithm="grpo", tools=[add])


ENV_IDS = [5, 6, 7]  # what a user's environment wrote after the policy's turn


def rollout_with_feedback(prompts, trainer):
    """A rollout_func: sample with the trainer, then append environment ids the policy did not sample."""
    prompt_ids = trainer.processing_class(prompts)["input_ids"]
    generation = trainer.generator(prompt_ids, seeds=list(range(len(prompts))), version=0)  # a seed per completion
    completion_ids = [ids + ENV_IDS for ids in generation.completion_ids]
    return {
        "prompt_ids": prompt_ids,
        "completion_ids": completion_ids,
        "logprobs": None,
        "env_mask": [[1] * len(ids) + [0] * len(ENV_IDS) for ids in generation.completion_ids],
        "feedback": ["ok"] * len(prompts),
    }


def test_rollout_func_env_tokens_get_no_gradient(tmp_path):
    seen = []

    def uses_feedback(completions, feedback, **kwargs):
        seen.append(feedback)
        return letters_reward(completions, **kwargs)

    trainer = make_trainer(
        tmp_path,
        algorithm="grpo",
        rollout_func=rollout_with_feedback,
        reward_funcs=[uses_feedback],
        max_steps=1,
        save_steps=100,
    )
    trainer.train()
    assert seen and seen[0] == ["ok"] * 8, "rollout_func's extra field reached the reward function"
    rollout = trainer.training_buffer.buffer.rollout.to(trainer.accelerator.device)
    present = rollout.completion_mask.bool()
    assert all(row[m].tolist()[-3:] == ENV_IDS for row, m in zip(rollout.completion_ids, present))
    # the LM head's output in the loss pass: each completion token's log-prob (and entropy), [1, K, k] for the K
    # completion tokens in order (a packed pass, the default) or [N, C, k] (padded)
    outputs = []
    handle = trainer.model.get_output_embeddings().register_forward_hook(lambda m, i, out: outputs.append(out))
    try:
        loss, _ = trainer.algorithm.loss(trainer.model, rollout)
    finally:
        handle.remove()
    (per_token,) = outputs
    assert per_token.shape[:2] == (1, int(present.sum()))  # packed
    grad = torch.autograd.grad(loss, per_token)[0][0, :, 0]  # d loss / d log-prob of each completion token
    grad = torch.zeros(present.shape, dtype=grad.dtype, device=grad.device).masked_scatter(present, grad)
    env = present & ~rollout.env_mask.bool()
    assert env.sum() == len(ENV_IDS) * len(rollout)
    assert grad[env].abs().max() == 0, "an environment token's log-prob got a gradient"
    assert grad[rollout.policy_mask.bool()].abs().max() > 0, "the sampled tokens' log-probs got none"


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["hf", "vllm"])
def test_multi_turn_sigkill_after_a_mid_rollout_checkpoint_resumes_byte_identical(tmp_path_factory, backend):
    flags = ["--algorithm", "grpo", "--tools", "environment"]
    overrides = ["max_steps=8", "save_steps=3"] + (["use_vllm=true", "vllm_dtype=float32"] if backend == "vllm" else [])
    reference, resumed = tmp_path_factory.mktemp("uninterrupted"), tmp_path_factory.mktemp("resumed")
    run_toy(reference, *flags, overrides=overrides)
    run_toy(resumed, *flags, "--kill-after-save", "3", expect_kill=True, overrides=overrides)
    _, output = run_toy(resumed, *flags, "--resume", overrides=overrides)
    assert "checkpoint-3" in output
    ref = (reference / "final-actor" / "model.safetensors").read_bytes()
    assert (resumed / "final-actor" / "model.safetensors").read_bytes() == ref, "final actor weights differ"
    ref_logs, new_logs = read_logs(reference), read_logs(resumed)
    assert any(ref_logs[s].get("tools/call_frequency", 0) > 0 for s in ref_logs), "no tool was called"
    for step in range(4, 9):
        for key in set(ref_logs[step]) - {"tokens_per_second", "learning_rate_ignored"}:
            if "time" not in key and "per_second" not in key:
                assert new_logs[step][key] == ref_logs[step][key], f"step {step}: {key} differs"


@pytest.mark.slow
def test_tools_with_a_vllm_server(tmp_path):
    from support.vllm_serving import serving

    from steadyrl.toy.tools import tool_model_path

    with serving(tool_model_path(), 512) as url:
        flags = dict(use_vllm=True, vllm_dtype="float32", vllm_mode="server", vllm_server_base_url=url)
        trainer, buffers = train(tmp_path, "tools", max_steps=2, **flags)
    steps = [entry for entry in trainer.state.log_history if "tools/call_frequency" in entry]
    assert any(entry["tools/call_frequency"] > 0 for entry in steps), "no tool was called"
    # the server's log-probs of the sampled tokens equal the trainer's: the env tokens are left out of the check
    assert all(entry["generation_logprob_diff"] < 1e-4 for entry in steps)
    assert any((buffer.rollout.env_mask == 0).any() for buffer in buffers)


class SecondCalculator(Calculator):
    """Another environment kind, with the same tool."""


def test_the_dict_form_picks_each_rows_environment_and_scores_it_with_its_own_reward(tmp_path):
    dataset = sum_dataset(16)
    dataset = dataset.add_column("environment", ["first", "second"] * 8)
    trainer, buffers = train(
        tmp_path,
        "environment",
        train_dataset=dataset,
        max_steps=2,
        shuffle_dataset=False,
        environment_factory={"first": Calculator, "second": SecondCalculator},
    )
    assert trainer.reward_weights.tolist() == [1.0, 1.0, 1.0, 1.0]
    names = [func.__name__ for func in trainer.reward_funcs]
    assert names[-2:] == ["Calculator", "SecondCalculator"]
    scores = buffers[0].rollout.reward_scores  # [N, R]: each environment's reward applies to its own rows only
    first = torch.tensor([True, True, False, False] * 2)  # 4 prompts x 2 samples, alternating environments
    assert not scores[first, 2].isnan().any() and scores[first, 3].isnan().all()
    assert scores[~first, 2].isnan().all() and not scores[~first, 3].isnan().any()


class PosesSums(Calculator):
    """Owns its data (TRL's environment-owned data): reset() returns the question; get_reward pays a call that adds
    its numbers."""

    def reset(self, **row) -> str:
        self.asked = getattr(self, "asked", 0) + 1
        a, b = self.asked, 2 * self.asked
        self.answer, self.results = a + b, []
        return f"What is {a} + {b}? Use the tool."


def test_an_environment_that_owns_the_data_trains_without_a_train_dataset(tmp_path):
    from steadyrl import GRPOTrainer

    task, keep = tool_task("environment"), KeepBuffer()
    settings = dict(max_steps=2, save_steps=100, max_completion_length=128, max_tool_calling_iterations=2)
    trainer = GRPOTrainer(
        task["model"],
        [],  # the environment's get_reward is the only reward
        make_config(tmp_path, "grpo", **settings),
        processing_class=task["processing_class"],
        environment_factory=PosesSums,
        callbacks=[keep],
    )
    keep.trainer = trainer
    trainer.train()
    assert trainer.reward_func_names == ["PosesSums"] and [t.__name__ for t in trainer.tools] == ["add"]
    assert len(trainer.train_dataset) == trainer.args.rollout_batch_size, "a placeholder of one rollout's rows"
    tok = trainer.processing_class
    for buffer in keep.buffers:
        prompts = tok.batch_decode(buffer.rollout.prompt_ids, skip_special_tokens=False)
        questions = [re.search(r"user\n(.*)<\|im_end\|>\n<\|im_start\|>assistant\n$", p).group(1) for p in prompts]
        assert all(re.fullmatch(r"What is (\d+) \+ (\d+)\? Use the tool\.", q) for q in questions), questions
    assert trainer.state.global_step == 2
    assert [entry["step"] for entry in trainer.state.log_history if "reward" in entry] == [1, 2], "get_reward scores"


def test_a_routing_column_alone_starts_each_row_from_an_empty_user_turn(tmp_path):
    from datasets import Dataset

    dataset = Dataset.from_dict({"environment": ["first", "second"] * 4})
    factory = {"first": PosesSums, "second": SecondCalculator}
    task = {**tool_task("environment"), "train_dataset": dataset, "reward_funcs": [], "environment_factory": factory}
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=1, **task)
    assert trainer.train_dataset["prompt"] == [[{"role": "user", "content": ""}]] * 8
    assert trainer.reward_func_names == ["PosesSums", "SecondCalculator"]
