"""The chunked LM head (ops/head_logprobs.py) on the real SmolLM2-135M-Instruct (tied 49,152 x 576 head, float32):
log-probs and entropy equal a float64 log-softmax of the model's logits, every parameter's gradient the logits path's,
up to float32 rounding (support/tolerances.py; unit/ops/test_chunked_logprobs.py has the tiny models, PEFT, bf16 and
the fallbacks)."""

import torch
from support.tolerances import assert_gradients_within, assert_within, decoder_bound, logit_scale, relative_bound
from transformers import AutoModelForCausalLM, AutoTokenizer
from unit.ops.test_chunked_logprobs import run_path

from steadyrl.ops import completion_logits, pad_prompts_and_completions
from steadyrl.real import smollm2_path


def test_chunked_head_on_smollm2_equals_the_logits_path():
    """Log-probs and entropy of both paths are compared with a float64 log-softmax of the model's float32 logits: the
    paths round the head's sum over the hidden size and the log-softmax's over the vocabulary (~1.3e-4 of the logits'
    size, ~8e-3 nats here; both are within 2e-5 on the machines tried). Gradients agree within a float32 pass's bound
    of the largest gradient."""
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
    head = relative_bound(model.config.hidden_size + model.config.vocab_size) * logit_scale(
        model, *tokens.values(), temperature=0.7
    )
    for path, values in (("chunked", chunked), ("logits path", logits_path)):
        assert_within(values[0].double(), exact_logprobs, head, what=f"{path} log-probs")
        assert_within(values[1].double(), exact_entropy, head, what=f"{path} entropy")
    assert chunked[3].keys() == logits_path[3].keys() and len(chunked[3]) == len(list(model.parameters()))
    positions = tokens["prompt_ids"].shape[1] + tokens["completion_ids"].shape[1]
    assert_gradients_within(chunked[3], logits_path[3], decoder_bound(model.config, positions))
