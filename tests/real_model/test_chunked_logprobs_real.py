"""The chunked LM head (ops/head_logprobs.py) on the real SmolLM2-135M-Instruct (tied 49,152 x 576 head, float32):
log-probs and entropy equal a float64 log-softmax of the model's logits, every parameter's gradient the logits path's
(unit/ops/test_chunked_logprobs.py has the tiny models, PEFT, bf16 and the fallbacks)."""

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from unit.ops.test_chunked_logprobs import run_path

from steadyrl.ops import completion_logits, pad_prompts_and_completions
from steadyrl.real import smollm2_path


def test_chunked_head_on_smollm2_equals_the_logits_path():
    """The batch's positions fit one chunk, so both paths see the same logits (with chunks of a few rows BLAS rounds
    the head's matmul differently: logits of size ~40 then differ by ~1e-5). Log-probs and entropy are compared with
    a float64 log-softmax of those logits: the chunked path is within 1e-6 of it, the logits path only within 2e-5
    (torch's float32 log_softmax sums the 49,152 exps less exactly than torch.sum)."""
    path = smollm2_path()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    assert model.config.tie_word_embeddings and model.dtype == torch.float32
    prompts = [tokenizer(text).input_ids for text in ("What is 12 + 30?", "Name a colour.", "2 * 3 =")]
    completions = [tokenizer(text).input_ids for text in (" 42, of course.", " Blue", " 6")]
    tokens = pad_prompts_and_completions(prompts, completions, pad_token_id=tokenizer.pad_token_id)
    mask = tokens["completion_mask"]
    with torch.no_grad():
        exact = torch.log_softmax(completion_logits(model, *tokens.values()).double() / 0.7, dim=-1)
    exact_logprobs = exact.gather(-1, tokens["completion_ids"].unsqueeze(-1)).squeeze(-1) * mask
    exact_entropy = -(exact.exp() * exact).sum(-1) * mask

    logits_path = run_path(model, tokens, chunked_head=False, temperature=0.7)
    chunked = run_path(model, tokens, chunked_head=True, temperature=0.7)
    for exact_values, values in ((exact_logprobs, chunked[0]), (exact_entropy, chunked[1])):
        torch.testing.assert_close(values.double(), exact_values, atol=1e-6, rtol=1e-6)
    for exact_values, values in ((exact_logprobs, logits_path[0]), (exact_entropy, logits_path[1])):
        torch.testing.assert_close(values.double(), exact_values, atol=2e-5, rtol=0)
    assert chunked[3].keys() == logits_path[3].keys() and len(chunked[3]) == len(list(model.parameters()))
    for name, grad in logits_path[3].items():  # within 1e-6 of each gradient's largest element
        scale, error = float(grad.abs().max()), float((chunked[3][name] - grad).abs().max())
        assert scale > 0 and error <= 1e-6 * scale, (name, error, scale)
