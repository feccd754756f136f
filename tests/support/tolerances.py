"""How far two floating-point computations of one value may be apart: bounds taken from the arithmetic, not from
what one machine's kernels happened to produce.

Two computations of a value (float32 and float64, a chunked and a whole LM head, a packed and a padded pass, steadyrl
and TRL) round differently, and how they round depends on the machine's kernels: AVX-512 or AVX2, MKL's code path
on AMD, blocked or sequential sums. A bound read off one machine fails on another. These come from the rounding
itself (Higham & Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci. Comput. 41(5), 2019):
a value computed through k roundings of unit roundoff u is within lambda * sqrt(k) * u of the exact value, relative
to the size of the terms it is made of, with probability at least 1 - 2 exp(-lambda**2 / 2), whatever the order of
the operations, so on any kernel.

- u (``unit_roundoff``): 2**-24 in float32, 2**-8 in bfloat16.
- k (``decoder_roundings``): the roundings on the longest chain from the inputs to the value. In float32 a sum of n
  terms is n roundings. A bfloat16 matmul or reduction accumulates in float32 (ATen's opmath) and rounds once, at
  its output: in bfloat16 one operation is one rounding (float32's sqrt(n) * 2**-24 stays below 2**-8 for any n
  under 2**32).
- the size of the terms (the scale): the largest magnitude among the values the compared ones are made of, named by
  each test. A value that cancels to almost nothing carries the rounding of its terms, not a rounding relative to
  itself: a parameter's gradient is compared at the scale of all of the model's gradients (one backward pass's
  per-position terms make them all), a log-prob at the scale of the logits it comes from. Where the exact value is
  zero the bound is then absolute.
- lambda = 5: a chain of roundings exceeds its bound with probability 2 exp(-12.5) < 1e-5.

Two computations that both round are within the sum of their bounds (``sides=2``); a computation and an exact
(float64) reference within one bound.
"""

from __future__ import annotations

import math

import torch

from steadyrl.ops import completion_logits

LAMBDA = 5.0
# A decoder layer's operations on one path from its input to its output, each a rounding in bfloat16: RMSNorm (~5),
# a projection, rotary embedding (~3), scores, softmax, the weighted sum, the output projection, the residual add,
# RMSNorm again, gate, activation, product, down projection, residual add.
OPS_PER_LAYER = 24


def unit_roundoff(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps / 2


def relative_bound(roundings: int, dtype: torch.dtype = torch.float32, sides: int = 2) -> float:
    """How far ``sides`` computations through ``roundings`` roundings of ``dtype`` may be apart (one: from the exact
    value), as a fraction of the size of the terms they are made of."""
    return sides * LAMBDA * math.sqrt(roundings) * unit_roundoff(dtype)


def decoder_roundings(config, positions: int, dtype: torch.dtype = torch.float32) -> int:
    """The roundings on the longest chain of a decoder's pass over ``positions`` positions and its LM head, in
    ``dtype``: in float32 each layer's sums (attention scores over the head dimension, the weighted sum over the
    positions, the output projection, RMSNorm and the MLP's input over the hidden size, the down projection over the
    intermediate size) and its other operations, then the head's over the hidden size and the log-softmax's over the
    vocabulary; in bfloat16 one per operation. The backward pass runs the same sums again."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden, layers = text.hidden_size, text.num_hidden_layers
    if dtype == torch.float32:
        head_dim = getattr(text, "head_dim", None) or hidden // text.num_attention_heads
        per_layer = head_dim + positions + 3 * hidden + text.intermediate_size + OPS_PER_LAYER
        one_pass = layers * per_layer + hidden + text.vocab_size
    else:
        one_pass = layers * OPS_PER_LAYER + 3  # the head's matmul, the final norm's output, the log-softmax's
    return 2 * one_pass


def decoder_bound(config, positions: int, dtype: torch.dtype = torch.float32, sides: int = 2) -> float:
    """``relative_bound`` of a decoder's forward and backward pass over ``positions`` positions in ``dtype``."""
    return relative_bound(decoder_roundings(config, positions, dtype), dtype, sides)


@torch.no_grad()
def logit_scale(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature: float = 1.0) -> float:
    """The size of the terms a completion token's log-prob and entropy are made of: the largest |logit| / temperature
    at the completion positions, and at least 1 (the log-sum-exp's sum, whose largest term is 1)."""
    logits = completion_logits(model, prompt_ids, prompt_mask, completion_ids, completion_mask).float()
    return max(1.0, float(logits[completion_mask.bool()].abs().max()) / temperature)


def assert_within(actual, expected, bound: float, what: str = "") -> float:
    """Every element of ``actual`` within ``bound`` (absolute) of ``expected``; returns the largest difference."""
    expected = torch.as_tensor(expected).detach().to(torch.float64)
    actual = torch.as_tensor(actual).detach().to(torch.float64)
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    error = float((actual - expected).abs().max()) if expected.numel() else 0.0
    assert error <= bound, f"{what}: off by {error:.3g}, more than the rounding bound {bound:.3g}"
    return error


def gradient_scale(grads: dict[str, torch.Tensor]) -> float:
    """The largest gradient element of any parameter: the size of the terms every parameter's gradient sums."""
    return max(float(grad.abs().max()) for grad in grads.values())


def assert_gradients_within(
    actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], relative: float, what: str = ""
) -> None:
    """The same parameters, each gradient within ``relative`` x ``gradient_scale(expected)`` of the expected one."""
    assert actual.keys() == expected.keys() and expected, (sorted(actual), sorted(expected))
    scale = gradient_scale(expected)
    assert scale > 0, f"{what}: no gradient to compare"
    for name, grad in expected.items():
        assert_within(actual[name], grad, relative * scale, what=f"{what}{name} (scale {scale:.3g})")
