"""The real-model fixture (steadyrl/real/smollm2.py): SmolLM2-135M-Instruct converted from its registry package into
a plain float32 checkpoint with its chat template. A conversion killed midway: tests/integration/real_model/
test_real_fixture.py."""

from transformers import AutoConfig, AutoTokenizer

from steadyrl.real import smollm2_path


def test_the_converted_model_is_a_plain_float32_checkpoint_with_the_chat_template():
    path = smollm2_path()
    config = AutoConfig.from_pretrained(path)
    assert config.model_type == "llama" and config.vocab_size == 49152 and config.hidden_size == 576
    assert not hasattr(config, "quantization_config") and str(config.dtype) in ("float32", "torch.float32")
    tokenizer = AutoTokenizer.from_pretrained(path)
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"), text
    assert tokenizer.eos_token == "<|im_end|>"
