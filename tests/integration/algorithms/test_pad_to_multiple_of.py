"""TRL's ``pad_to_multiple_of``: every forward pass's token tensors (the rollout, its scoring passes, each training
micro-batch) are padded to a multiple of N columns, and the numbers do not change (float32, CPU, within 1e-6)."""

import pytest
import torch
from support.toy_run import make_trainer
from transformers import Qwen2Config, Qwen2ForCausalLM

from steadyrl.ops import batched_logprobs, completion_logprobs, pad_prompts_and_completions, trim_padding
from steadyrl.rollout import Rollout

TOLERANCE = dict(atol=1e-6, rtol=1e-6)


def tiny_model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=256,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        attn_implementation="sdpa",
    )
    return Qwen2ForCausalLM(config).eval()


def test_padded_log_probs_equal_the_unpadded_and_widths_are_multiples():
    model = tiny_model()
    prompts = [torch.randint(3, 256, (n,)).tolist() for n in (5, 11, 2, 7)]
    completions = [torch.randint(3, 256, (n,)).tolist() for n in (6, 1, 9, 3)]
    plain = pad_prompts_and_completions(prompts, completions, 0)
    padded = pad_prompts_and_completions(prompts, completions, 0, multiple_of=8)
    assert plain["prompt_ids"].shape == (4, 11) and plain["completion_ids"].shape == (4, 9)
    assert padded["prompt_ids"].shape == (4, 16) and padded["completion_ids"].shape == (4, 16)
    names = ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")
    plain_tokens, padded_tokens = (tuple(batch[n] for n in names) for batch in (plain, padded))
    with torch.no_grad():
        expected, expected_entropy = completion_logprobs(model, *plain_tokens, with_entropy=True)
        got, got_entropy = completion_logprobs(model, *padded_tokens, with_entropy=True)
        # the scoring pass: micro-batches of 2 rows, each trimmed to its own longest, rounded up to 8
        scored = batched_logprobs(model, padded_tokens, 1.0, 2, multiple_of=8)
    mask = plain["completion_mask"].bool()
    torch.testing.assert_close(got[:, :9][mask], expected[mask], **TOLERANCE)
    torch.testing.assert_close(got_entropy[:, :9][mask], expected_entropy[mask], **TOLERANCE)
    torch.testing.assert_close(scored[:, :9][mask], expected[mask], **TOLERANCE)
    (prompt_ids, _, completion_ids, _), width = trim_padding(*(t[:2] for t in padded_tokens), multiple_of=8)
    assert prompt_ids.shape[1] == 16 and completion_ids.shape[1] == width == 8  # longest prompt 11, completion 6


def test_a_micro_batch_of_a_narrower_rollout_is_padded_out_to_the_multiple():
    """A rollout saved without the setting (resumed with it) or narrower than N: masked columns are added."""
    rollout = Rollout(
        prompt_ids=torch.tensor([[0, 5, 6], [7, 8, 9]]),
        prompt_mask=torch.tensor([[0, 1, 1], [1, 1, 1]]),
        completion_ids=torch.tensor([[3, 4], [5, 0]]),
        completion_mask=torch.tensor([[1, 1], [1, 0]]),
        scores=torch.zeros(2),
        old_logprobs=torch.tensor([[-1.0, -2.0], [-3.0, 0.0]]),
        advantages=torch.tensor([0.5, -0.5]),
    )
    trimmed = rollout.trimmed(multiple_of=4, pad_token_id=99)
    assert trimmed.prompt_ids.tolist() == [[99, 0, 5, 6], [99, 7, 8, 9]]
    assert trimmed.prompt_mask.tolist() == [[0, 0, 1, 1], [0, 1, 1, 1]]
    assert trimmed.completion_ids.tolist() == [[3, 4, 99, 99], [5, 0, 99, 99]]
    assert trimmed.completion_mask.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0]]
    assert trimmed.old_logprobs.tolist() == [[-1.0, -2.0, 0.0, 0.0], [-3.0, 0.0, 0.0, 0.0]]
    assert trimmed.advantages.tolist() == [0.5, -0.5]  # one per sequence, as it was
    assert rollout.trimmed().prompt_ids.shape == (2, 3)  # without it: the longest, as before


def train(tmp_path, name: str, algorithm: str, **overrides):
    widths = []
    trainer = make_trainer(
        tmp_path / name, algorithm=algorithm, max_steps=2, save_steps=100, num_ppo_epochs=1, **overrides
    )
    compute = trainer.algorithm.loss

    def recording(model, batch):
        widths.append((batch.prompt_ids.shape[1], batch.completion_ids.shape[1]))
        return compute(model, batch)

    trainer.algorithm.loss = recording
    trainer.train()
    actor = {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}
    assert trainer.state.global_step == 2 and trainer.state.log_history[-1]["train_loss"] is not None
    logs = [log for log in trainer.state.log_history if "loss" in log]
    return [[log["loss"], log["grad_norm"]] for log in logs], actor, widths


@pytest.mark.parametrize("algorithm", ["grpo", "rloo"])
def test_a_toy_run_trains_the_same_with_padding_to_a_multiple(tmp_path, algorithm):
    losses, actor, widths = train(tmp_path, "plain", algorithm)
    padded_losses, padded_actor, padded_widths = train(tmp_path, "padded", algorithm, pad_to_multiple_of=8)
    assert all(p % 8 == 0 and c % 8 == 0 for p, c in padded_widths), padded_widths
    assert any(p % 8 or c % 8 for p, c in widths), widths  # the toy lengths are not all multiples of 8 already
    assert len(padded_losses) == len(losses) == 2
    # the loss and the gradient norm of each step; the weights only loosely, as Adam divides each gradient by its
    # own root mean square: a coordinate whose gradient is ~1e-9 moves by ~lr whatever its last bits are
    torch.testing.assert_close(torch.tensor(padded_losses), torch.tensor(losses), **TOLERANCE)
    for key, value in actor.items():
        torch.testing.assert_close(padded_actor[key], value, atol=1e-4, rtol=0, msg=key)
    initial = make_trainer(tmp_path / "initial", algorithm=algorithm).model.state_dict()
    assert any(not torch.equal(value, initial[key]) for key, value in padded_actor.items())  # it trained
