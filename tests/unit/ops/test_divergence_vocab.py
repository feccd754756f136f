"""A teacher with more vocabulary rows than the student (its embedding padded past the shared tokenizer, as
Qwen2.5-7B's 152,064 rows against 0.5B's 151,936) against a student whose LM head cannot be chunked (a LoRA adapter
on ``lm_head``): the divergence from whole logits reads the teacher's logits of the student's vocabulary only, as the
chunked path does, and equals it."""

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from steadyrl.ops import pad_prompts_and_completions
from steadyrl.ops.divergence import completion_divergence
from steadyrl.ops.head_logprobs import chunkable_head

STUDENT_ROWS, TEACHER_ROWS = 40, 48


def tiny_qwen(seed: int, vocab_size: int) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, tie_word_embeddings=False,
    )  # fmt: skip
    return Qwen2ForCausalLM(config)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_a_lora_head_student_against_a_teacher_with_padded_rows_equals_the_chunked_path(beta):
    teacher = tiny_qwen(1, TEACHER_ROWS).eval()
    with torch.no_grad():  # padding rows a tokenizer never emits, but that would take probability if read
        teacher.lm_head.weight[STUDENT_ROWS:] *= 50
    tokens = pad_prompts_and_completions([[5, 6, 7], [8, 9]], [[10, 11, 12, 13], [14, 15]], 0)
    tensors = (tokens["prompt_ids"], tokens["prompt_mask"], tokens["completion_ids"], tokens["completion_mask"])
    head = teacher.lm_head.weight[:STUDENT_ROWS], None  # as the trainer keeps it: the student's rows

    plain = tiny_qwen(0, STUDENT_ROWS)
    assert chunkable_head(plain)[0] is not None
    chunked, chunked_entropy = completion_divergence(plain, tensors, teacher, head, beta, 0.9)

    lora = get_peft_model(tiny_qwen(0, STUDENT_ROWS), LoraConfig(r=2, target_modules=["lm_head", "q_proj"]))
    assert chunkable_head(lora)[0] is None, "a LoRA head takes the whole-logits path"
    divergence, entropy = completion_divergence(lora, tensors, teacher, head, beta, 0.9)  # the adapter starts at 0

    mask = tokens["completion_mask"].bool()
    torch.testing.assert_close(divergence[mask], chunked[mask], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(entropy[mask], chunked_entropy[mask], atol=1e-6, rtol=1e-5)
    assert divergence.requires_grad
