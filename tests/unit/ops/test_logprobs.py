"""The memory-lean log-prob path equals the plain one, and the scoring pass it skips changes nothing.

Plain: the LM head over every position, a float32 log-softmax over the whole [B, C, V], gathered. Lean: the LM head
over the completion positions only (``logits_to_keep``), each token's logit minus its row's logsumexp, one row at a
time; padding trimmed per micro-batch. Same numbers up to float32 rounding (support/tolerances.py: logit - logsumexp
and log-softmax round differently): log-probs, entropy and loss relative to the logits, gradients relative to the
largest gradient.
"""

import pytest
import torch
import torch.nn.functional as F
from support.tolerances import assert_gradients_within, assert_within, decoder_bound, logit_scale
from transformers import Qwen2Config, Qwen2ForCausalLM

from steadyrl.ops import batched_logprobs, completion_logprobs, joined_inputs, pad_prompts_and_completions


def plain_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
    logits = model(**joined_inputs(prompt_ids, prompt_mask, completion_ids, completion_mask), use_cache=False).logits
    logp = F.log_softmax(logits[:, prompt_ids.shape[1] - 1 : -1].float() / temperature, dim=-1)
    return logp.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk", [2**24, 32_000 * 6], ids=["all-rows-at-once", "one-row-at-a-time"])
def test_lean_logprobs_entropy_and_gradients_equal_the_plain_path(monkeypatch, chunk):
    monkeypatch.setattr("steadyrl.ops.logit_rows.CHUNK_LOGITS", chunk)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=32_000,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(config)
    prompts = [torch.randint(3, 32_000, (n,)).tolist() for n in (5, 9, 2)]  # left-padded to 9
    completions = [torch.randint(3, 32_000, (n,)).tolist() for n in (6, 1, 4)]  # right-padded to 6
    tokens = pad_prompts_and_completions(prompts, completions, pad_token_id=0)
    mask = tokens["completion_mask"]
    weights = torch.randn(mask.shape)

    results = []
    for path in (plain_logprobs, completion_logprobs):
        model.zero_grad()
        if path is completion_logprobs:
            logprobs, entropy = path(model, *tokens.values(), temperature=0.7, with_entropy=True)
        else:
            logprobs, entropy = path(model, *tokens.values(), temperature=0.7)
        loss = (logprobs * weights * mask).sum()
        loss.backward()
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        results.append((logprobs.detach(), entropy.detach(), loss.detach(), grads))
    (plain, plain_entropy, plain_loss, plain_grads), (lean, lean_entropy, lean_loss, lean_grads) = results
    relative = decoder_bound(config, positions=tokens["prompt_ids"].shape[1] + tokens["completion_ids"].shape[1])
    logits = logit_scale(model, *tokens.values(), temperature=0.7)
    assert_within(lean * mask, plain * mask, relative * logits, what="log-probs")
    assert_within(lean_entropy * mask, plain_entropy * mask, relative * logits, what="entropy")
    assert_within(lean_loss, plain_loss, relative * logits * float((weights * mask).abs().sum()), what="loss")
    assert_gradients_within(lean_grads, plain_grads, relative)

    # the scoring passes: length-grouped, trimmed chunks of 2 rows give the same log-probs
    with torch.no_grad():
        chunked = batched_logprobs(model, tuple(tokens.values()), temperature=0.7, batch_size=2)
    assert_within(chunked * mask, plain * mask, relative * logits, what="scoring passes' log-probs")
