"""The packed, shared-prompt pass on the real SmolLM2-135M-Instruct (float32, SDPA): two chat prompts, each with four
completions of different lengths, each prompt computed once (unit/ops/test_packing.py has the tiny models, LoRA, the
critic and the fallbacks).

The reference is each sequence run alone, without padding. The packed pass, and the padded pass as well, equal it
within the rounding bound of a float32 pass of this 30-layer model (support/tolerances.py): ~3e-4 of the logits' size
for log-probs and entropies (~0.02 nats), ~3e-4 of the largest gradient for each gradient. Both are ~1e-5 off on the
machines tried, whatever their kernels; a completion token given the wrong position, or an attention mask that drops
a token, moves log-probs by 1 to 10 nats and gradients by 15% to 360% of the largest."""

import torch
from support.tolerances import assert_gradients_within, assert_within, decoder_bound, logit_scale
from transformers import AutoModelForCausalLM, AutoTokenizer
from unit.ops.test_packing import outputs

from steadyrl.ops import completion_logprobs, pad_prompts_and_completions
from steadyrl.ops import packing as packing_module
from steadyrl.ops.packing import pack_shared_prompts
from steadyrl.real import smollm2_path


def one_at_a_time(model, batch):
    """``outputs`` of each sequence alone, without padding: log-probs and entropy [B, C] and the summed gradients."""
    model.zero_grad()
    mask = batch[3]
    weights = torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape)
    logprobs, entropy = torch.zeros(mask.shape), torch.zeros(mask.shape)
    for row in range(len(mask)):
        n, prompt = int(mask[row].sum()), batch[1][row].bool()
        tokens = (
            batch[0][row, prompt][None],
            batch[1][row, prompt][None],
            batch[2][row, :n][None],
            mask[row, :n][None],
        )
        values, entropies = completion_logprobs(model, *tokens, temperature=0.7, with_entropy=True)
        loss = (values[0] * weights[row, :n]).sum() + 0.1 * (entropies[0] * weights.flip(1)[row, :n]).sum()
        loss.backward()
        logprobs[row, :n], entropy[row, :n] = values[0].detach(), entropies[0].detach()
    return logprobs, entropy, {name: p.grad.clone() for name, p in model.named_parameters()}


def test_packed_and_padded_passes_on_smollm2_equal_unpadded_sequences_up_to_float32_rounding():
    path = smollm2_path()
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    assert model.config._attn_implementation == "sdpa" and model.dtype == torch.float32
    questions = ("What is 12 + 30? Answer with the number only.", "Name a colour of the sky at noon.")
    texts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]
    prompts = [tokenizer(text).input_ids for text in texts]
    answers = (" 42", " It is 42, since 12 + 30 = 42.", " Forty-two.", " 42, of course, as 30 + 12 is 42 too.")
    completions = [tokenizer(text).input_ids for text in answers] * 2
    tokens = pad_prompts_and_completions([prompts[0]] * 4 + [prompts[1]] * 4, completions, tokenizer.pad_token_id)
    batch = tuple(tokens.values())
    packed_rows = pack_shared_prompts(*batch)
    assert (packed_rows.segment >= 0).sum() == sum(map(len, prompts)) + tokens["completion_mask"].sum()

    reference = one_at_a_time(model, batch)
    relative = decoder_bound(model.config, positions=batch[0].shape[1] + batch[2].shape[1])
    logits = logit_scale(model, *batch, temperature=0.7)
    for name, packing in (("padded", False), ("packed", True)):
        result = outputs(model, batch, packing=packing, temperature=0.7)
        assert_within(result[0], reference[0], relative * logits, what=f"{name} log-probs")
        assert_within(result[1], reference[1], relative * logits, what=f"{name} entropy")
        assert_gradients_within(result[2], reference[2], relative, what=f"{name} gradient of ")
    assert packing_module._packing_checked[model] == ""
