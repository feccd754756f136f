"""The packed, shared-prompt pass on the real SmolLM2-135M-Instruct (float32, SDPA): two chat prompts, each with four
completions of different lengths, each prompt computed once (unit/ops/test_packing.py has the tiny models, LoRA, the
critic and the fallbacks, within 1e-5).

On this model float32 rounding alone moves the padded pass's results more than 1e-5 when only the batch's shape
changes: its log-probs are ~2e-5 off a float64 pass, and its gradients up to ~7e-5 (of each one's largest element)
off the same sequences run one at a time without padding. The packed pass is held to that reference (each sequence
alone): at most as far from it as the padded pass is, give or take a factor of 2 -- a mask or position error moves
log-probs by orders of magnitude more."""

import torch
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


def distance(result, reference) -> list[float]:
    """Largest difference of log-probs, of entropies, and of any gradient relative to its largest element."""
    grads = max(float((result[2][n] - g).abs().max() / g.abs().max()) for n, g in reference[2].items())
    return [float((result[i] - reference[i]).abs().max()) for i in (0, 1)] + [grads]


def test_packed_pass_on_smollm2_is_as_close_to_unpadded_sequences_as_the_padded_pass():
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
    padded = distance(outputs(model, batch, packing=False, temperature=0.7), reference)
    packed = distance(outputs(model, batch, packing=True, temperature=0.7), reference)
    assert packing_module._packing_checked[model] == ""
    assert all(p <= max(2 * q, 1e-6) for p, q in zip(packed, padded)), (packed, padded)
    assert packed[0] < 1e-4 and packed[2] < 2e-4, packed
