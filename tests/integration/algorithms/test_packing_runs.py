"""``packing=True`` (the default) trains what ``packing=False`` trains: every trainer's per-step loss and gradient norm
within 1e-5 of the padded run's (float32, CPU), the same completions and rewards, with fewer positions computed;
multi-turn trajectories keep their environment tokens out of the loss; and a micro-batch holds a prompt's
completions together, so its prompt is computed once."""

import pytest
import torch
from support.toy_run import make_trainer, tool_task

from steadyrl.ops import packing as packing_module


class PackedCalls:
    """Counts the packed passes and the positions they computed, against the padded tensors' positions."""

    def __init__(self, monkeypatch):
        self.calls, self.packed, self.padded = 0, 0, 0
        pack = packing_module.pack_shared_prompts

        def counting(*tokens, **kwargs):
            packed = pack(*tokens, **kwargs)
            self.calls += 1
            self.packed += packed.positions
            self.padded += tokens[0].numel() + tokens[2].numel()
            return packed

        for module in ("steadyrl.ops.logprobs", "steadyrl.models.scalar_head"):
            monkeypatch.setattr(f"{module}.pack_shared_prompts", counting)


def train(tmp_path, algorithm: str, packing: bool, **overrides):
    settings = {**overrides, "max_steps": 2, "save_steps": 100, "logging_steps": 1, "packing": packing}
    trainer = make_trainer(tmp_path / f"{algorithm}-{packing}", algorithm=algorithm, **settings)
    trainer.train()
    logs = [log for log in trainer.state.log_history if "loss" in log]
    keys = [key for key in ("loss", "grad_norm", "critic_grad_norm", "reward", "completion_length") if key in logs[0]]
    return trainer, torch.tensor([[log[key] for key in keys] for log in logs], dtype=torch.float64)


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "ppo", "online-dpo"])
def test_packed_run_trains_as_the_padded_run(tmp_path, monkeypatch, algorithm):
    _, padded = train(tmp_path, algorithm, packing=False)
    counted = PackedCalls(monkeypatch)
    trainer, packed = train(tmp_path, algorithm, packing=True)
    assert counted.calls > 0 and counted.packed < counted.padded, vars(counted)
    assert packing_module._packing_checked[trainer.model] == ""
    assert packed.shape == padded.shape == (2, packed.shape[1])
    torch.testing.assert_close(packed, padded, atol=0, rtol=1e-5)


def test_multi_turn_packed_run_keeps_tool_tokens_out_of_the_loss(tmp_path, monkeypatch):
    _, padded = train(tmp_path / "padded", "grpo", packing=False, **tool_task("tools"))
    counted = PackedCalls(monkeypatch)
    _, packed = train(tmp_path / "packed", "grpo", packing=True, **tool_task("tools"))
    assert counted.calls > 0 and counted.packed < counted.padded
    torch.testing.assert_close(packed, padded, atol=0, rtol=1e-5)


def test_a_micro_batch_holds_a_prompts_completions_together():
    from steadyrl.rollout import minibatch_schedule

    torch.manual_seed(0)
    schedule = minibatch_schedule(num_samples=24, minibatch_size=12, num_epochs=2, prompt_size=4)
    for minibatch in schedule:
        prompts = [sample // 4 for sample in minibatch]
        assert prompts == sorted(prompts)  # each prompt's samples adjacent
    assert sorted(schedule[0] + schedule[1]) == list(range(24))  # every sample once per epoch
    torch.manual_seed(0)
    plain = minibatch_schedule(num_samples=24, minibatch_size=12, num_epochs=2)
    assert [sorted(m) for m in plain] == [sorted(m) for m in schedule]  # the same samples in each mini-batch
