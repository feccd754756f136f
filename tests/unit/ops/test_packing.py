"""Packed, shared-prompt passes (ops/packing.py) compute what the padded pass computes: each distinct prompt once,
no padding between sequences, and log-probs, entropies, critic values and every parameter's gradient equal to the
padded pass's up to float32 rounding (support/tolerances.py: log-probs relative to the logits, gradients relative to
the largest gradient of any parameter). Models whose attention cannot take a packed mask run padded and say why,
once."""

import logging

import pytest
import torch
import transformers
from peft import LoraConfig, get_peft_model
from support.tolerances import assert_gradients_within, assert_within, decoder_bound, logit_scale

from steadyrl.models.scalar_head import Critic, critic_from_policy
from steadyrl.ops import completion_logprobs, pad_prompts_and_completions
from steadyrl.ops import packing as packing_module
from steadyrl.ops.packing import pack_shared_prompts

VOCAB = 300
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)


def tiny(kind: str = "llama", **config):
    torch.manual_seed(0)
    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }
    config_class, model_class = classes[kind]
    return model_class(config_class(**{**TINY, **config}))


def tokens() -> tuple[torch.Tensor, ...]:
    """Seven rows: three prompts of different lengths, a group's rows not adjacent, completions of every length
    from empty to 9 tokens (as a rollout's micro-batch holds them)."""
    torch.manual_seed(1)
    a, b, c = (torch.randint(3, VOCAB, (n,)).tolist() for n in (6, 11, 2))
    prompts = [a, a, b, a, c, b, c]
    completions = [torch.randint(3, VOCAB, (n,)).tolist() for n in (5, 9, 1, 0, 7, 3, 4)]
    padded = pad_prompts_and_completions(prompts, completions, pad_token_id=0)
    return padded["prompt_ids"], padded["prompt_mask"], padded["completion_ids"], padded["completion_mask"]


def test_each_prompt_is_packed_once_and_its_completions_continue_its_positions():
    prompt_ids, prompt_mask, completion_ids, completion_mask = batch = tokens()
    packed = pack_shared_prompts(*batch, multiple_of=8)
    real = packed.segment >= 0
    assert int(real.sum()) == 6 + 11 + 2 + int(completion_mask.sum())  # each prompt once, no padding inside
    assert packed.input_ids.shape[1] % 8 == 0
    for row in range(len(prompt_ids)):  # each completion: its prompt's length onwards, its own tokens
        prompt_length = int(prompt_mask[row].sum())
        n = int(completion_mask[row].sum())
        where = packed.branch == row
        assert packed.position_ids[where].tolist() == list(range(prompt_length, prompt_length + n))
        assert packed.input_ids[where].tolist() == completion_ids[row, :n].tolist()
    assert packed.targets.tolist() == completion_ids[completion_mask.bool()].tolist()
    mask = packed.attention_mask()[:, 0]  # no completion token sees another completion's
    sees = mask & (packed.branch[:, :, None] >= 0) & (packed.branch[:, None, :] >= 0)
    assert (packed.branch[:, :, None] == packed.branch[:, None, :])[sees].all()


def outputs(model, batch, packing: bool, temperature: float = 1.0, chunked_head: bool = True):
    model.zero_grad()
    logprobs, entropy = completion_logprobs(
        model, *batch, temperature=temperature, with_entropy=True, chunked_head=chunked_head, packing=packing
    )
    mask = batch[3]
    weights = torch.linspace(-1.0, 2.0, mask.numel(), dtype=logprobs.dtype).view(mask.shape)
    ((logprobs * weights * mask).sum() + 0.1 * (entropy * weights.flip(1) * mask).sum()).backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return logprobs.detach() * mask, entropy.detach() * mask, grads


def rounding(model, batch) -> float:
    """How far two float32 passes of ``model`` over ``batch`` may be apart, relative to the size of the terms."""
    return decoder_bound(model.config, positions=batch[0].shape[1] + batch[2].shape[1])


def assert_same(padded, packed, model, batch, temperature: float = 1.0):
    relative, logits = rounding(model, batch), logit_scale(model, *batch, temperature=temperature)
    for what, expected, got in zip(("log-probs", "entropy"), padded[:2], packed[:2]):
        assert_within(got, expected, relative * logits, what=what)
    assert_gradients_within(packed[2], padded[2], relative)


@pytest.mark.parametrize(
    "kind, chunked_head, temperature, attention",
    [
        ("llama", True, 1.0, "sdpa"),
        ("llama", False, 0.7, "sdpa"),
        ("qwen2", True, 0.7, "sdpa"),
        ("llama", True, 1.0, "eager"),
    ],
)
def test_packed_pass_equals_padded_pass(kind, chunked_head, temperature, attention):
    model = tiny(kind, attn_implementation=attention)
    batch = tokens()
    padded = outputs(model, batch, False, temperature, chunked_head)
    packed = outputs(model, batch, True, temperature, chunked_head)
    assert packing_module._packing_checked[model] == ""  # the packed pass ran, not a fallback
    assert_same(padded, packed, model, batch, temperature)


def test_packed_pass_equals_padded_pass_with_lora():
    model = get_peft_model(tiny(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    for name, param in model.named_parameters():  # LoRA's B starts at 0: give the adapter an effect to check
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    batch = tokens()
    assert_same(outputs(model, batch, False), outputs(model, batch, True), model, batch)
    with model.disable_adapter():  # the reference under PEFT: the same model, adapters off
        padded = completion_logprobs(model, *batch, packing=False)[0] * batch[3]
        packed = completion_logprobs(model, *batch, packing=True)[0] * batch[3]
        bound = rounding(model, batch) * logit_scale(model, *batch)
    assert_within(packed, padded, bound, what="log-probs with the adapter off")


def test_critic_values_packed_equal_padded():
    policy = tiny()
    critic = Critic(critic_from_policy(policy, seed=3))
    batch = tokens()
    mask = batch[3].float()

    def values_and_grads(packing: bool):
        critic.zero_grad()
        values = critic(*batch, packing=packing) * mask
        (values * torch.linspace(-1, 1, mask.numel()).view(mask.shape)).sum().backward()
        return values.detach(), {n: p.grad.clone() for n, p in critic.named_parameters() if p.grad is not None}

    padded, packed = values_and_grads(False), values_and_grads(True)
    relative = rounding(policy, batch)  # the value head sums the hidden size, as the LM head does
    assert_within(packed[0], padded[0], relative * max(1.0, float(padded[0].abs().max())), what="values")
    assert_gradients_within(packed[1], padded[1], relative)


def test_sliding_window_model_runs_padded_and_says_why(caplog):
    model = tiny("mistral", sliding_window=4)
    batch = tokens()
    with caplog.at_level(logging.WARNING, logger="steadyrl.ops.packing"):
        packed = completion_logprobs(model, *batch, packing=True)[0]
        completion_logprobs(model, *batch, packing=True)
    assert "sliding_window=4" in packing_module._packing_checked[model]
    assert sum("Packing is off for MistralForCausalLM" in r.message for r in caplog.records) == 1
    torch.testing.assert_close(packed, completion_logprobs(model, *batch)[0])


def test_attention_that_ignores_the_packed_mask_is_caught_by_the_probe(monkeypatch, caplog):
    """An attention function registered as 'sdpa' that attends causally whatever the mask says: the probe sees the
    packed results differ from the padded ones and the model runs padded."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    def causal_only(module, query, key, value, attention_mask, **kwargs):
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS._global_mapping, "sdpa", causal_only)
    model = tiny()
    batch = tokens()
    with caplog.at_level(logging.WARNING, logger="steadyrl.ops.packing"):
        packed = completion_logprobs(model, *batch, packing=True)[0]
    assert "a packed probe's results differ" in packing_module._packing_checked[model]
    torch.testing.assert_close(packed, completion_logprobs(model, *batch)[0])
