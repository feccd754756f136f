"""Span-by-span attention over packed rows (ops/segment_attention.py) computes what SDPA computes under the packed
mask, forward and backward, and a packed model pass takes it: gradient checkpointing's recompute included."""

import torch
import torch.nn.functional as F
from support.tolerances import assert_gradients_within, assert_within, decoder_bound

from steadyrl.ops.packing import pack_shared_prompts, packed_inputs
from steadyrl.ops.segment_attention import SEGMENTS_KWARG, segment_attention

from .test_packing import tiny, tokens


def test_spans_attend_exactly_as_the_packed_mask_says():
    packed = pack_shared_prompts(*tokens(), multiple_of=8)  # two packed rows, a padded tail, an empty completion
    rows, width = packed.input_ids.shape
    real = (packed.segment >= 0)[:, None, :, None]  # a padding position's output is not read
    torch.manual_seed(0)
    query = torch.randn(rows, 4, width, 8, dtype=torch.float64, requires_grad=True)
    key, value = (torch.randn(rows, 2, width, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    weights = torch.randn(rows, 4, width, 8, dtype=torch.float64)

    def result_and_grads(attention):
        out = attention() * real
        grads = torch.autograd.grad((out * weights).sum(), (query, key, value))
        return out.detach(), grads

    def dense():
        k, v = key.repeat_interleave(2, 1), value.repeat_interleave(2, 1)
        return F.scaled_dot_product_attention(query, k, v, attn_mask=packed.attention_mask(), scale=0.3)

    def spans():
        return segment_attention(packed.segments(), query, key, value, 0.3, 0.0).transpose(1, 2)

    expected, got = result_and_grads(dense), result_and_grads(spans)
    torch.testing.assert_close(got[0], expected[0], atol=1e-12, rtol=0)
    for want, have in zip(expected[1], got[1]):
        torch.testing.assert_close(have, want, atol=1e-12, rtol=0)


def test_a_packed_model_pass_attends_by_spans_also_when_recomputed():
    """Given the spans, the model's SDPA attention follows them, not the mask: a plain causal mask passed beside them
    (wrong for packed rows) gives the packed mask's results and gradients, with gradient checkpointing on."""
    model = tiny(attn_implementation="sdpa")
    model.gradient_checkpointing_enable()
    model.train()
    packed = pack_shared_prompts(*tokens())
    inputs = packed_inputs(model, packed)
    assert SEGMENTS_KWARG in inputs
    wrong = dict(inputs, attention_mask=torch.ones_like(inputs["attention_mask"]).tril())
    without_spans = {k: v for k, v in inputs.items() if k != SEGMENTS_KWARG}
    real = (packed.segment >= 0)[..., None]

    def logits_and_grads(model_inputs):
        model.zero_grad()
        logits = model(**model_inputs, use_cache=False).logits * real
        logits.square().mean().backward()
        return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    expected, got = logits_and_grads(without_spans), logits_and_grads(wrong)
    relative = decoder_bound(model.config, positions=packed.input_ids.shape[1])  # float32 rounding, both sides
    assert_within(got[0], expected[0], relative * max(1.0, float(expected[0].abs().max())), what="logits")
    assert_gradients_within(got[1], expected[1], relative)
    assert not torch.allclose(logits_and_grads({**without_spans, "attention_mask": wrong["attention_mask"]})[0], got[0])
