"""save_model writes the actor only, in plain Hugging Face format, loadable and generating."""

import torch
from support.toy_run import make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer


def test_save_model_writes_the_actor_only(tmp_path):
    trainer = make_trainer(tmp_path / "run", max_steps=2, save_steps=100, max_completion_length=4)
    trainer.train()
    trainer.save_model(str(tmp_path / "actor"))
    files = sorted(p.name for p in (tmp_path / "actor").iterdir())
    assert files == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "actor")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "actor")
    actor_state = trainer.model.state_dict()
    for name, value in model.state_dict().items():
        assert torch.equal(value, actor_state[name]), name
    reference = trainer.ref_model.state_dict()
    assert any(not torch.equal(actor_state[n], reference[n]) for n in reference), "the trained actor was saved"

    inputs = tokenizer(["abc:"], return_tensors="pt")
    out = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > inputs["input_ids"].shape[1]
