"""The vision-language demo's builder (steadyrl/real/vision_demo.py) at small sizes: a tiny Llama with SmolLM2's
tokenizer as the language model, a few pretraining and alignment steps. The build is deterministic, and the saved
model with its processor takes a GRPO step on the demo's question with the image in the prompt (the demo itself:
bench/vision_demo.py)."""

import json

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from steadyrl import ALGORITHMS
from steadyrl.real import smollm2_path
from steadyrl.real.shapes import correct_side, one_word_answer, position_dataset, reply_texts
from steadyrl.real.vision_demo import build, language_model_parameters, load_vision_demo

SMALL_BUILD = dict(
    pretraining=dict(steps=2, batch_size=4, learning_rate=1e-3, seed=0),
    alignment=dict(steps=2, batch_size=2, learning_rate=1e-3, seed=0),
    held_out=2,
)
PROJECTOR = "model.multi_modal_projector.linear_1.weight"


def side_letters(completions, side, **kwargs):
    """A dense reward a random model already scores unevenly on: the share of the reply's first 6 characters that
    are letters of the right side's name (the demo's correct_side is 0 for every reply of a random model)."""
    return [sum(ch in name for ch in reply[:6]) / 6 for reply, name in zip(reply_texts(completions), side)]


@pytest.fixture(scope="module")
def tiny_language_model(tmp_path_factory):
    """A 2-layer Llama with SmolLM2-135M-Instruct's tokenizer and chat template, random weights."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_language_model):
    directory = tmp_path_factory.mktemp("vision-demo")
    build(directory, tiny_language_model, log=lambda line: None, **SMALL_BUILD)
    return directory


def test_the_build_is_deterministic_and_records_its_alignment(built, tmp_path, tiny_language_model):
    build(tmp_path, tiny_language_model, log=lambda line: None, **SMALL_BUILD)
    assert (tmp_path / "model.safetensors").read_bytes() == (built / "model.safetensors").read_bytes()
    record = json.loads((built / "alignment.json").read_text())
    assert record["alignment"] == SMALL_BUILD["alignment"] and 0 <= record["caption_accuracy"] <= 1


def test_the_built_model_takes_a_grpo_step_with_images_its_language_model_frozen(built, tmp_path):
    model, processor = load_vision_demo(str(built))
    assert model.config.model_type == "llava" and processor.image_token == "<image>"
    for param in language_model_parameters(model):
        param.requires_grad_(False)
    before = {name: param.detach().clone() for name, param in model.named_parameters()}
    config_class, trainer_class = ALGORITHMS["grpo"]
    args = config_class(
        output_dir=str(tmp_path / "run"),
        num_generations=4,
        per_device_train_batch_size=8,
        max_completion_length=4,
        learning_rate=1e-3,
        beta=0.0,
        max_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        seed=0,
    )
    trainer = trainer_class(
        model=model,
        processing_class=processor,
        reward_funcs=[side_letters, correct_side, one_word_answer],
        args=args,
        train_dataset=position_dataset(8, seed=0),
    )
    trainer.train()
    assert trainer.state.global_step == 1
    after = dict(trainer.model.named_parameters())
    assert not torch.equal(after[PROJECTOR], before[PROJECTOR]), "the projector is trained through the images"
    frozen = "model.language_model.layers.0.mlp.up_proj.weight"
    assert torch.equal(after[frozen], before[frozen]), "the frozen language model stays as built"
