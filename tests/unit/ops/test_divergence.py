"""The distillation divergence (ops/divergence.py) equals TRL 1.16's ``DistillationTrainer`` loss on the same batch:
TRL's own ``_chunked_divergence_loss`` (imported from the installed trl) and steadyrl's chunked path, fed the same
student and teacher hidden states and LM heads, give the same loss (the per-token mean over the loss mask) and the
same gradients for the student's hidden states and head, up to float32 rounding (support/tolerances.py: the loss
relative to the logits, gradients relative to the largest gradient), for beta 0 (forward KL), 0.5 (JSD), 1 (reverse
KL) and a generalized JSD, at temperatures 1 and 0.7; and through whole models (the student's forward with its head
replaced, the teacher's hidden states from its own forward) as TRL computes it from the backbones."""

import pytest
import torch
from support.tolerances import assert_gradients_within, assert_within, decoder_bound, relative_bound
from transformers import Qwen2Config, Qwen2ForCausalLM

from steadyrl.ops import pad_prompts_and_completions
from steadyrl.ops.divergence import ChunkedHeadDivergence, completion_divergence, generalized_jsd

trl_loss = pytest.importorskip("trl.trainer.distillation_trainer")._chunked_divergence_loss

B, C, H, HT, V = 3, 6, 16, 24, 500
# two float32 computations of the heads' divergence: sums over the hidden size, the vocabulary and the positions,
# forward and backward
HEADS = relative_bound(2 * (HT + V + B * C))
CASES = [(beta, temperature) for beta in (0.0, 0.5, 1.0, 0.2) for temperature in (1.0, 0.7)]


def batch(seed: int = 0):
    torch.manual_seed(seed)
    student_hidden, teacher_hidden = torch.randn(B, C, H), torch.randn(B, C, HT)
    student_head, teacher_head = torch.randn(V, H) * 0.3, torch.randn(V, HT) * 0.3
    mask = torch.ones(B, C)
    mask[0, 4:], mask[2, 1:] = 0, 0  # completions of 4, 6 and 1 tokens
    return student_hidden, teacher_hidden, student_head, teacher_head, mask


def logit_size(student_hidden, teacher_hidden, student_head, teacher_head, temperature: float) -> float:
    """The size of the terms a token's divergence is made of: the largest |logit| / temperature of either model."""
    logits = (student_hidden @ student_head.T, teacher_hidden @ teacher_head.T)
    return max(1.0, *(float(z.detach().abs().max()) for z in logits)) / temperature


def steadyrl_loss(student_hidden, teacher_hidden, student_head, teacher_head, mask, beta, temperature, rows):
    divergence, entropy = ChunkedHeadDivergence.apply(
        student_hidden.reshape(-1, H), student_head, None, teacher_hidden.reshape(-1, HT), teacher_head, None,
        beta, temperature, torch.float32, rows,
    )  # fmt: skip
    flat = mask.reshape(-1)
    return (divergence * flat).sum() / flat.sum(), (entropy * flat).sum()


@pytest.mark.parametrize("beta,temperature", CASES)
def test_equals_trl_loss_and_gradients(beta, temperature):
    student_hidden, teacher_hidden, student_head, teacher_head, mask = batch()
    ours = [student_hidden.clone().requires_grad_(), student_head.clone().requires_grad_()]
    theirs = [student_hidden.clone().requires_grad_(), student_head.clone().requires_grad_()]
    loss, entropy = steadyrl_loss(ours[0], teacher_hidden, ours[1], teacher_head, mask, beta, temperature, rows=4)
    trl, trl_entropy, _ = trl_loss(
        theirs[0], teacher_hidden, theirs[1], teacher_head, mask, beta, temperature=temperature
    )
    loss.backward()
    trl.backward()
    logits = logit_size(student_hidden, teacher_hidden, student_head, teacher_head, temperature)
    assert_within(loss, trl, HEADS * logits, what="loss")
    assert_within(entropy, trl_entropy, HEADS * logits * mask.sum().item(), what="entropy")  # a sum over 11 tokens
    grads = {"hidden": theirs[0].grad, "head": theirs[1].grad}
    assert_gradients_within({"hidden": ours[0].grad, "head": ours[1].grad}, grads, HEADS)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_chunking_and_autograd_reference(beta):
    """The analytic backward equals autograd through the reference formula (float64), and the chunk size changes
    nothing beyond rounding."""
    student_hidden, teacher_hidden, student_head, teacher_head, mask = batch(1)
    grads = []
    for rows in (1, 7, B * C):
        hidden = student_hidden.clone().requires_grad_()
        steadyrl_loss(hidden, teacher_hidden, student_head, teacher_head, mask, beta, 0.7, rows)[0].backward()
        grads.append(hidden.grad)
    reference_hidden = student_hidden.double().requires_grad_()
    logits = reference_hidden @ student_head.double().T
    logits.retain_grad()
    teacher_logits = (teacher_hidden @ teacher_head.T).double()  # rounded in float32, as on the chunked path
    per_token = generalized_jsd(logits, teacher_logits, beta, 0.7)
    ((per_token * mask).sum() / mask.sum()).backward()
    # each element of the hidden states' gradient sums, over the vocabulary, d loss / d logit x the head's weight
    terms = float((logits.grad.abs() @ student_head.double().abs()).max())
    for rows, grad in zip((1, 7, B * C), grads):
        assert_within(grad, reference_hidden.grad, HEADS * terms, what=f"chunks of {rows} rows")


def tiny_qwen(seed: int, hidden: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=V, hidden_size=hidden, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


@pytest.mark.parametrize("beta,temperature", [(0.0, 1.0), (0.5, 0.7), (1.0, 0.7)])
def test_models_equal_trl_from_backbones(beta, temperature):
    """Through whole models, the positions aligned as TRL aligns them (the hidden state before each completion token,
    from the backbone): steadyrl's ``completion_divergence`` gives TRL's loss and the student's gradients."""
    student, teacher = tiny_qwen(0, H), tiny_qwen(1, HT).eval()
    tokens = pad_prompts_and_completions([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]], 0)
    tensors = (tokens["prompt_ids"], tokens["prompt_mask"], tokens["completion_ids"], tokens["completion_mask"])
    mask = tokens["completion_mask"].float()
    head = (teacher.lm_head.weight, None)
    divergence, _ = completion_divergence(student, tensors, teacher, head, beta, temperature)
    loss = (divergence * mask).sum() / mask.sum()
    loss.backward()
    ours = {name: p.grad.clone() for name, p in student.named_parameters()}
    student.zero_grad()

    input_ids = torch.cat([tensors[0], tensors[2]], 1)
    attention_mask = torch.cat([tensors[1], tensors[3]], 1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)

    def hidden(model):
        out = model.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
        return out.last_hidden_state[:, -(C_ + 1) : -1]

    C_ = tensors[2].shape[1]
    with torch.no_grad():
        teacher_hidden = hidden(teacher)
    trl, _, _ = trl_loss(
        hidden(student), teacher_hidden, student.lm_head.weight, teacher.lm_head.weight, mask, beta,
        temperature=temperature,
    )  # fmt: skip
    trl.backward()
    relative = decoder_bound(student.config, positions=input_ids.shape[1])
    with torch.no_grad():
        logits = max(1.0, *(float(m(input_ids=input_ids).logits.abs().max()) for m in (student, teacher)))
    logits /= temperature
    assert_within(loss, trl, relative * logits, what="loss")
    assert_gradients_within(ours, {name: param.grad for name, param in student.named_parameters()}, relative)
