"""ZeRO-3 buffer sizes for the model at hand where the DeepSpeed config leaves them unset (zero3_release)."""

from transformers import Qwen2Config, Qwen2ForCausalLM

from steadyrl.models.zero3_release import bound_zero3_buffers


def tiny_model():
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
    )
    return Qwen2ForCausalLM(config)


def test_unset_and_auto_sizes_follow_the_model_and_given_ones_stay():
    model = tiny_model()
    numel = sum(p.numel() for p in model.parameters())
    config = {"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": 1234}}
    chosen = bound_zero3_buffers(config, model)
    zero = config["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == 1234 and "stage3_prefetch_bucket_size" not in chosen
    assert zero["reduce_bucket_size"] == 32 * 32  # not DeepSpeed's 5e8: a whole small model's gradients
    assert zero["stage3_param_persistence_threshold"] == 320
    assert zero["stage3_max_reuse_distance"] == 0  # layers released after use
    assert zero["stage3_max_live_parameters"] == numel // 10


def test_other_stages_are_left_alone():
    config = {"zero_optimization": {"stage": 2}}
    assert bound_zero3_buffers(config, tiny_model()) == {}
    assert config == {"zero_optimization": {"stage": 2}}
