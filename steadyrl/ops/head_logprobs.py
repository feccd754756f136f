"""Log-probs and entropy straight from the last hidden states: the LM head projects a chunk of positions at a time,
so no [B, C, V] logits (nor their gradient) ever exist.

The model still runs whole, as in the plain path, so every wrapper's hooks run (DDP, DeepSpeed ZeRO-3's gather
before the head's forward and again before its backward, FSDP2's unshard/reshard and gradient reduction, PEFT):
only for the duration of one call, the output embedding's forward is replaced by one that takes the hidden states
and its own (gathered) weight and returns per-position results instead of logits. Those results must be read from
what the model returns, not kept aside: ZeRO-3 and FSDP2 attach their pre-backward hooks to the module's output.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)

# Config fields with which transformers' causal LMs change the logits after the head (Gemma2/3 and nanochat's
# soft-capping, Cohere's logit_scale, Granite's and MiniCPM3's logits_scaling, Falcon-H1's lm_head_multiplier,
# MuseGlimmer's output_multiplier): the head's output is not the logits there.
LOGIT_TRANSFORM_FIELDS = (
    "final_logit_softcapping",
    "logit_scale",
    "logits_scaling",
    "lm_head_multiplier",
    "output_multiplier",
)
_warned: set[str] = set()


class Float32Head(nn.Linear):
    """An output embedding whose logits are computed in float32, whatever the hidden states', the weight's or
    autocast's dtype (``cast_lm_head_to_fp32``; ScaleRL, Khatri et al., 2025). A class swapped in place of
    ``nn.Linear`` on the model's own head, so its parameters and every wrapper's hooks stay as they were."""

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(hidden.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return F.linear(hidden.float(), self.weight.float(), bias)


def compute_dtype(hidden: torch.Tensor, head: nn.Linear | None = None) -> torch.dtype:
    """The dtype the head's matmul runs in: float32 for a ``Float32Head``, else autocast's where it is on (as
    nn.Linear would), else the input's."""
    if isinstance(head, Float32Head):
        return torch.float32
    device = hidden.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype


class ChunkedHeadLogProbs(torch.autograd.Function):
    """log_softmax((hidden @ weight.T + bias) / temperature) at ``token_ids`` [N] (and the entropy [N] if asked)
    from ``hidden`` [N, H], ``rows`` positions at a time. The backward recomputes each chunk's logits and turns them
    into grad_hidden and grad_weight from (onehot - softmax) / temperature, and where the entropy has a gradient (an
    entropy bonus) from -p (log p + H) / temperature as well."""

    @staticmethod
    def forward(
        ctx, hidden, weight, bias, token_ids, temperature: float, dtype: torch.dtype, rows: int, with_entropy: bool
    ):
        ctx.set_materialize_grads(False)
        logprobs = hidden.new_empty(len(hidden), dtype=torch.float32)
        entropy = torch.empty_like(logprobs) if with_entropy else None
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            for start in range(0, len(hidden), rows):
                part = slice(start, start + rows)
                shifted = chunk_logits(hidden[part], w, b, temperature)
                shifted.sub_(shifted.amax(-1, keepdim=True))  # as log_softmax: no rounding at the logsumexp's size
                if with_entropy:
                    entropy[part], total = shifted_entropy(shifted)
                else:
                    total = shifted.exp().sum(-1)
                logprobs[part] = shifted.gather(-1, token_ids[part, None]).squeeze(-1) - total.log()
        ctx.save_for_backward(hidden, weight, bias, token_ids, entropy)
        ctx.temperature, ctx.dtype, ctx.rows = temperature, dtype, rows
        return logprobs if entropy is None else (logprobs, entropy)

    @staticmethod
    def backward(ctx, grad: torch.Tensor | None, grad_entropy: torch.Tensor | None = None):
        hidden, weight, bias, token_ids, entropy = ctx.saved_tensors
        if grad is None and grad_entropy is None:
            return (None,) * 8
        temperature, dtype = ctx.temperature, ctx.dtype
        grads = HeadGradients(hidden, weight, bias, ctx.needs_input_grad[:3])
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(dtype), None if bias is None else bias.to(dtype)
            for start in range(0, len(hidden), ctx.rows):
                part = slice(start, start + ctx.rows)
                logits = chunk_logits(hidden[part], w, b, temperature)
                grad_logits = entropy_and_logprob_grad(
                    logits,
                    token_ids[part],
                    None if grad is None else grad[part],
                    None if grad_entropy is None else grad_entropy[part],
                    None if grad_entropy is None else entropy[part],
                )
                if temperature != 1.0:
                    grad_logits.div_(temperature)
                grads.add(part, grad_logits.to(dtype), w)
        return *grads.result(), None, None, None, None, None


class HeadGradients:
    """The gradients of an LM head's hidden states, weight and bias (those ``needs`` asks for), from the gradient of
    its logits one chunk of positions at a time: the weight's and bias's summed in float32 whatever their dtype."""

    def __init__(self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, needs) -> None:
        self.hidden, self.weight, self.bias = hidden, weight, bias
        self.grad_hidden = torch.zeros_like(hidden) if needs[0] else None
        self.grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if needs[1] else None
        self.grad_bias = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if needs[2] else None

    def add(self, part: slice, grad_logits: torch.Tensor, w: torch.Tensor) -> None:
        """One chunk's: ``grad_logits`` [n, V] of the positions ``part``, in the matmul's dtype (that of ``w``)."""
        if self.grad_hidden is not None:
            self.grad_hidden[part] = (grad_logits @ w).to(self.hidden.dtype)
        if self.grad_weight is not None:
            self.grad_weight.addmm_(grad_logits.t().float(), self.hidden[part].to(w.dtype).float())
        if self.grad_bias is not None:
            self.grad_bias += grad_logits.float().sum(0)

    def result(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        weight = None if self.grad_weight is None else self.grad_weight.to(self.weight.dtype)
        bias = None if self.grad_bias is None else self.grad_bias.to(self.bias.dtype)
        return self.grad_hidden, weight, bias


def entropy_and_logprob_grad(
    logits: torch.Tensor,  # [n, V] float32, already divided by the temperature
    token_ids: torch.Tensor,  # [n]
    grad: torch.Tensor | None,  # [n] of the log-probs at token_ids
    grad_entropy: torch.Tensor | None,  # [n] of the entropies
    entropy: torch.Tensor | None,  # [n] the forward's entropies, where grad_entropy is given
) -> torch.Tensor:
    """The gradient [n, V] float32 with respect to ``logits``: d log p(t) / dz = onehot(t) - softmax(z), as
    _GatheredLogSoftmax's backward (with exp(z - max) / the forward's sum as softmax, SmolLM2's gradients were 5x
    further off float64), and dH / dz = -p (log p + H)."""
    g = torch.zeros_like(logits[:, 0]) if grad is None else grad.float()
    if grad_entropy is None:
        grad_logits = torch.softmax(logits, dim=-1).mul_(-g.unsqueeze(-1))
    else:
        logp = torch.log_softmax(logits, dim=-1)
        weight = logp.add_(entropy.float().unsqueeze(-1)).mul_(grad_entropy.float().unsqueeze(-1))  # gH (log p + H)
        grad_logits = torch.softmax(logits, dim=-1).mul_(weight.add_(g.unsqueeze(-1))).neg_()
    if grad is not None:
        grad_logits.scatter_add_(-1, token_ids[:, None], g.unsqueeze(-1))
    return grad_logits


def shifted_entropy(shifted: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Entropy [n] of softmax(logits) and sum(exp(shifted)) [n] from ``shifted`` = logits - their row max [n, V]
    (float32): log sum(exp) - sum(p * shifted), free of the rounding at the logits' own size (large logits, low
    temperature) that logsumexp(logits) - sum(p * logits) has."""
    exps = shifted.exp()
    total = exps.sum(-1)
    return total.log() - exps.mul_(shifted).sum(-1) / total, total


def chunk_logits(hidden, weight, bias, temperature: float) -> torch.Tensor:
    """A new [n, V] float32 tensor of logits / temperature of ``hidden`` [n, H], the matmul in ``weight``'s dtype."""
    logits = F.linear(hidden.to(weight.dtype), weight, bias).float()  # float() of a float32 matmul: the same tensor
    return logits if temperature == 1.0 else logits.div_(temperature)


def unwrapped(model: nn.Module) -> nn.Module:
    """The model inside DDP / DeepSpeed engine wrappers (their ``.module``); PEFT forwards attributes itself."""
    while isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def chunkable_head(model: nn.Module) -> tuple[nn.Linear | None, str]:
    """The model's output embedding if the chunked path applies to it, else None and why not."""
    inner = unwrapped(model)
    get_head = getattr(inner, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if head is None:
        return None, "it has no output embedding (get_output_embeddings() is missing or None)"
    if not isinstance(head, nn.Linear) or type(head).forward not in (nn.Linear.forward, Float32Head.forward):
        return (
            None,
            f"its output embedding is a {type(head).__name__}, not a plain torch.nn.Linear (a LoRA adapter "
            "or quantization on the LM head)",
        )
    if "forward" in vars(head):
        return None, "its output embedding's forward is already replaced on the instance (an accelerate hook?)"
    config = getattr(inner, "config", None)
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for field in LOGIT_TRANSFORM_FIELDS:
        value = getattr(text_config, field, None)
        if value is not None and (field == "final_logit_softcapping" or value != 1):
            return None, f"it changes the logits after the LM head (config.{field}={value})"
    return head, ""


def warn_full_logits_once(model: nn.Module, reason: str) -> None:
    message = f"Log-probs of {type(unwrapped(model)).__name__} from full [B, C, V] logits, not in chunks: {reason}."
    if message not in _warned:
        _warned.add(message)
        logger.warning(message)


@contextlib.contextmanager
def head_returns_logprobs(
    head: nn.Linear,
    completion_ids: torch.Tensor,
    temperature: float,
    with_entropy: bool,
    rows: int,
    source: torch.Tensor | None = None,
) -> Iterator[list[int]]:
    """While open, ``head(hidden_states)`` returns, instead of logits, [B, C, 1]: the log-probs of ``completion_ids``
    [B, C] from the positions before each token (the last C + 1 of ``hidden_states`` [B, T, H]), or [B, C, 2] with
    the entropy second if asked. With ``source`` [K] (a packed pass), [1, K, 1 or 2]: those of ``completion_ids`` [K]
    from the flat positions ``source`` of ``hidden_states`` [R, T, H]. Yields a list that holds one item per call of
    the head."""
    calls: list[int] = []
    width = completion_ids.shape[-1]
    shape = completion_ids.shape if source is None else (1, len(source))

    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        calls.append(1)
        if source is None:
            hidden = hidden_states[:, -(width + 1) : -1]  # position t predicts token t + 1
        else:
            hidden = hidden_states.reshape(-1, hidden_states.shape[-1])[source.to(hidden_states.device)]
        token_ids = completion_ids.to(hidden.device).reshape(-1)
        results = ChunkedHeadLogProbs.apply(
            hidden.reshape(-1, hidden.shape[-1]),
            head.weight,
            head.bias,
            token_ids,
            temperature,
            compute_dtype(hidden, head),
            rows,
            with_entropy,
        )
        results = torch.stack(results, dim=-1) if with_entropy else results.unsqueeze(-1)
        return results.view(*shape, -1)

    head.forward = forward
    try:
        yield calls
    finally:
        del head.forward
