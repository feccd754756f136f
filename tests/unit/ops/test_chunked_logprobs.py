"""Log-probs from the hidden states, the LM head projecting a chunk of positions at a time (ops/head_logprobs.py),
equal the logits path (``chunked_head=False``) up to float32 rounding: log-probs, entropy, loss and the gradient of
every trained parameter, for tied and untied heads, a head with a bias, temperature, padding rows and PEFT; models
whose head output is not the logits fall back to the logits path and say so once.

The two paths sum over positions and the vocabulary in another order, so they agree within the rounding bound of a
float32 pass of the model (support/tolerances.py): relative to the logits for log-probs, entropy and loss, relative to
the largest gradient of any parameter for each gradient (a gradient that cancels to almost nothing, like a key
projection's bias, still carries the rounding of the terms it sums)."""

import logging

import pytest
import torch
from peft import LoraConfig, get_peft_model
from support.tolerances import (
    assert_gradients_within,
    assert_within,
    decoder_bound,
    gradient_scale,
    logit_scale,
    relative_bound,
)
from transformers import Gemma2Config, Gemma2ForCausalLM, Qwen2Config, Qwen2ForCausalLM

from steadyrl.ops import completion_logprobs, joined_inputs, pad_prompts_and_completions
from steadyrl.ops import head_logprobs as head_module

VOCAB = 1000


def tiny_qwen(tied: bool = True, head_bias: bool = False) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=tied,
    )
    model = Qwen2ForCausalLM(config)
    if head_bias:
        model.lm_head = torch.nn.Linear(32, VOCAB, bias=True)
    return model


def padded_tokens() -> dict[str, torch.Tensor]:
    """Three rows: left-padded prompts, right-padded completions, one completion a single token long."""
    torch.manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,)).tolist() for n in (5, 9, 2)]
    completions = [torch.randint(3, VOCAB, (n,)).tolist() for n in (6, 1, 4)]
    return pad_prompts_and_completions(prompts, completions, pad_token_id=0)


def run_path(model, tokens, chunked_head: bool, temperature: float, entropy_weight: float = 0.0):
    """Log-probs, entropy, a weighted loss over the completion tokens (with ``entropy_weight``, an entropy term as an
    entropy bonus adds) and the gradient of each trained parameter."""
    model.zero_grad()
    logprobs, entropy = completion_logprobs(
        model, *tokens.values(), temperature=temperature, with_entropy=True, chunked_head=chunked_head
    )
    mask = tokens["completion_mask"]
    weights = torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape)
    loss = (logprobs * weights * mask).sum() + entropy_weight * (entropy * weights.flip(1) * mask).sum()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    return logprobs.detach() * mask, entropy.detach() * mask, loss.detach(), grads


def rounding(model, tokens, sides: int = 2) -> float:
    """How far float32 passes of ``model`` over ``tokens`` (forward and backward) may be apart (``sides=1``: from the
    exact values), relative to the size of the terms (support/tolerances.py)."""
    positions = tokens["prompt_ids"].shape[1] + tokens["completion_ids"].shape[1]
    return decoder_bound(head_module.unwrapped(model).config, positions, sides=sides)


def assert_paths_equal(model, tokens, temperature, entropy_weight=0.0):
    logits_path = run_path(model, tokens, chunked_head=False, temperature=temperature, entropy_weight=entropy_weight)
    chunked = run_path(model, tokens, chunked_head=True, temperature=temperature, entropy_weight=entropy_weight)
    relative, logits = rounding(model, tokens), logit_scale(model, *tokens.values(), temperature=temperature)
    mask = tokens["completion_mask"]
    weights = torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape).abs() * mask
    loss_terms = float(weights.sum()) * (1 + entropy_weight) * logits  # the size of the loss's summed terms
    for what, expected, actual, scale in zip(
        ("logprobs", "entropy", "loss"), logits_path[:3], chunked[:3], (logits, logits, loss_terms)
    ):
        assert_within(actual, expected, relative * scale, what=what)
    assert_gradients_within(chunked[3], logits_path[3], relative)


@pytest.fixture
def small_chunks(monkeypatch):
    """Four positions per chunk: the 3 x 6 completion positions take 5 chunks. The size is read where each pass
    reads it; the test then checks that its chunks had at most four rows, and that there were several."""
    for module in ("logit_rows", "logprobs", "packing"):
        monkeypatch.setattr(f"steadyrl.ops.{module}.CHUNK_HEAD_LOGITS", 4 * VOCAB)
    rows, chunk_logits = [], head_module.chunk_logits

    def recording(hidden, *args):
        rows.append(len(hidden))
        return chunk_logits(hidden, *args)

    monkeypatch.setattr(head_module, "chunk_logits", recording)
    yield
    assert len(rows) > 1 and max(rows) <= 4, f"the head's chunks had {rows} rows"


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("head", ["tied", "untied", "untied-with-bias"])
def test_chunked_head_equals_the_logits_path(small_chunks, head, temperature):
    model = tiny_qwen(tied=head == "tied", head_bias=head == "untied-with-bias")
    assert_paths_equal(model, padded_tokens(), temperature)


@pytest.mark.parametrize("head", ["tied", "untied-with-bias"])
def test_entropy_gradient_of_both_paths_equals_float64_autograd(small_chunks, head):
    """An entropy bonus trains through the entropy: its gradient, on the chunked path and on the logits path, equals
    plain autograd through log_softmax in float64 (within one float32 pass's rounding bound of the largest gradient:
    the key projection's bias has a gradient of almost nothing, ~1e-3 of the largest, that rounds like the rest)."""
    model, tokens = tiny_qwen(tied=head == "tied", head_bias=head != "tied"), padded_tokens()
    assert_paths_equal(model, tokens, temperature=0.7, entropy_weight=0.3)
    chunked = run_path(model, tokens, chunked_head=True, temperature=0.7, entropy_weight=0.3)
    relative = rounding(model, tokens, sides=1)
    reference = model.double()
    reference.zero_grad()
    inputs = dict(tokens)
    keep = inputs["completion_ids"].shape[1] + 1
    logits = reference(**joined_inputs(*inputs.values()), use_cache=False).logits[:, -keep:-1] / 0.7
    logp = torch.log_softmax(logits, dim=-1)
    mask = inputs["completion_mask"].double()
    weights = torch.linspace(-1.0, 2.0, mask.numel(), dtype=torch.float64).view(mask.shape)
    entropy = -(logp.exp() * logp).sum(-1)
    picked = logp.gather(-1, inputs["completion_ids"].unsqueeze(-1)).squeeze(-1)
    ((picked * weights * mask).sum() + 0.3 * (entropy * weights.flip(1) * mask).sum()).backward()
    exact = {name: param.grad for name, param in reference.named_parameters()}
    assert_gradients_within({name: grad.double() for name, grad in chunked[3].items()}, exact, relative)


def test_chunked_head_in_one_chunk_equals_the_logits_path():
    assert_paths_equal(tiny_qwen(tied=False), padded_tokens(), temperature=0.7)


def test_chunked_head_never_returns_vocabulary_wide_outputs(small_chunks):
    """The head's output is [B, C, 2] (log-prob, entropy), not [B, C + 1, V]; the logits path's is the logits."""
    model, tokens = tiny_qwen(), padded_tokens()
    shapes = []
    model.lm_head.register_forward_hook(lambda module, args, output: shapes.append(tuple(output.shape)))
    completion_logprobs(model, *tokens.values(), with_entropy=True)
    completion_logprobs(model, *tokens.values(), with_entropy=False)
    completion_logprobs(model, *tokens.values(), chunked_head=False)
    assert shapes == [(3, 6, 2), (3, 6, 1), (3, 7, VOCAB)]
    assert "forward" not in vars(model.lm_head), "the head's own forward is back after the call"


def test_chunked_head_with_lora_trains_the_adapter_and_modules_to_save_like_the_logits_path(small_chunks):
    config = LoraConfig(
        r=4,
        lora_alpha=8,
        target_modules=["q_proj", "v_proj"],
        modules_to_save=["embed_tokens"],
        init_lora_weights=False,
    )
    model = get_peft_model(tiny_qwen(tied=False), config)
    assert head_module.chunkable_head(model)[0] is model.get_output_embeddings()
    assert_paths_equal(model, padded_tokens(), temperature=0.7)


def test_chunked_head_under_bf16_autocast_matches_the_logits_path(small_chunks, monkeypatch):
    """Under autocast the head's matmul runs in bfloat16 on both paths (each chunk a bfloat16 product), what follows
    it in float32: log-probs, entropy and loss agree within a bfloat16 rounding of the logits, and so does the head's
    weight gradient (summed over chunks in float32; the logits path's is one bfloat16 product). The other gradients
    pass through the layers' bfloat16 backward, whose bound over the pass is coarse (~0.4 of the largest gradient;
    support/tolerances.py)."""
    chunk_dtypes, chunk_logits = [], head_module.chunk_logits

    def recording(hidden, weight, bias, temperature):
        chunk_dtypes.append(weight.dtype)
        return chunk_logits(hidden, weight, bias, temperature)

    monkeypatch.setattr(head_module, "chunk_logits", recording)
    model, tokens = tiny_qwen(tied=False), padded_tokens()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits_path = run_path(model, tokens, chunked_head=False, temperature=0.7)
        chunked = run_path(model, tokens, chunked_head=True, temperature=0.7)
    assert chunk_dtypes and set(chunk_dtypes) == {torch.bfloat16}
    # the logits' one bfloat16 rounding, then the log-softmax's float32 sum over the vocabulary
    head = relative_bound(1, torch.bfloat16) + relative_bound(VOCAB)
    logits, mask = logit_scale(model, *tokens.values(), temperature=0.7), tokens["completion_mask"]
    loss_terms = float((torch.linspace(-1.0, 2.0, mask.numel()).view(mask.shape).abs() * mask).sum()) * logits
    for what, expected, actual, scale in zip(
        ("logprobs", "entropy", "loss"), logits_path[:3], chunked[:3], (logits, logits, loss_terms)
    ):
        assert_within(actual, expected, head * scale, what=what)
    positions = tokens["prompt_ids"].shape[1] + tokens["completion_ids"].shape[1]
    head_weight = relative_bound(1, torch.bfloat16) + relative_bound(mask.numel())  # one rounding; the chunks' sum
    bound = head_weight * gradient_scale(logits_path[3])
    assert_within(chunked[3]["lm_head.weight"], logits_path[3]["lm_head.weight"], bound, what="lm_head.weight")
    assert_gradients_within(chunked[3], logits_path[3], decoder_bound(model.config, positions, torch.bfloat16))


def soft_capped_gemma2() -> Gemma2ForCausalLM:
    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        head_dim=16,
        num_attention_heads=2,
        num_key_value_heads=1,
        final_logit_softcapping=30.0,
    )
    return Gemma2ForCausalLM(config)


@pytest.mark.parametrize("model_kind", ["soft-capped", "lora-on-lm-head"])
def test_models_whose_head_output_is_not_the_logits_fall_back_and_say_so_once(caplog, monkeypatch, model_kind):
    monkeypatch.setattr(head_module, "_warned", set())
    if model_kind == "soft-capped":
        model, why = soft_capped_gemma2(), "config.final_logit_softcapping=30.0"
    else:
        lora = LoraConfig(r=4, target_modules=["lm_head"], init_lora_weights=False)
        model, why = get_peft_model(tiny_qwen(tied=False), lora), "not a plain torch.nn.Linear"
    tokens = padded_tokens()
    with caplog.at_level(logging.WARNING, logger=head_module.__name__):
        assert_paths_equal(model, tokens, temperature=0.7)
        completion_logprobs(model, *tokens.values())
    warnings = [r.getMessage() for r in caplog.records if r.name == head_module.__name__]
    assert len(warnings) == 1 and why in warnings[0] and "full [B, C, V] logits" in warnings[0], warnings
    assert "forward" not in vars(model.get_output_embeddings())


def test_chunked_head_through_ddp_equals_the_logits_path(small_chunks, tmp_path):
    """Under DistributedDataParallel (one process, gloo) the head is found through ``.module`` and gradients reach
    every parameter through DDP's reducer as they do on the logits path."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        model = DistributedDataParallel(tiny_qwen(tied=False))
        assert head_module.chunkable_head(model)[0] is model.module.lm_head
        assert_paths_equal(model, padded_tokens(), temperature=0.7)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("tied", [True, False])
def test_float32_head_on_a_bfloat16_model(small_chunks, tied):
    """cast_lm_head_to_fp32: the head's weight is stored in float32 and its logits computed in float32 on both paths
    (equal up to float32 rounding); a tied input embedding still returns bfloat16; the log-probs move closer to a
    float32 head of the same hidden states than the bfloat16 head's are."""
    from steadyrl.models.float32_head import cast_lm_head_to_fp32

    model, tokens = tiny_qwen(tied=tied).to(torch.bfloat16), padded_tokens()
    before = completion_logprobs(model, *tokens.values())[0]
    cast_lm_head_to_fp32(model)
    head = model.get_output_embeddings()
    assert head.weight.dtype == torch.float32 and (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert model.model.embed_tokens(tokens["prompt_ids"]).dtype == torch.bfloat16
    assert model(**joined_inputs(*tokens.values())).logits.dtype == torch.float32
    chunked, _ = completion_logprobs(model, *tokens.values(), chunked_head=True)
    plain, _ = completion_logprobs(model, *tokens.values(), chunked_head=False)
    mask = tokens["completion_mask"].bool()
    head_roundings = model.config.hidden_size + VOCAB  # same bfloat16 hidden states; the float32 heads differ
    bound = relative_bound(head_roundings) * logit_scale(model, *tokens.values())
    assert_within(chunked[mask], plain[mask], bound, what="float32 head: chunked against whole")
    assert (chunked - before.float())[mask].abs().max() > 1e-4  # a bfloat16 head rounds its logits visibly
