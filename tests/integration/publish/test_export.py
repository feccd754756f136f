"""A checkpoint directory is the actor, as a Trainer checkpoint is its model: transformers and vLLM load it as it is;
``steadyrl export CKPT_DIR OUT_DIR`` writes that actor alone as a plain model, from checkpoints of either layout."""

import shutil
import subprocess
import sys

import pytest
import torch
from peft import LoraConfig
from support.old_layout import to_old_layout
from support.toy_run import make_config, make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from steadyrl import RLOOTrainer
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path


def export(*args):
    proc = subprocess.run([sys.executable, "-m", "steadyrl", "export", *map(str, args)], capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory, toy_path):
    """A 3-step run that checkpoints at its last step, and the live actor's weights at that step."""
    out = tmp_path_factory.mktemp("export-run")
    trainer = make_trainer(out, max_steps=3, save_steps=3)
    trainer.train()
    return out / "checkpoint-3", {k: v.clone() for k, v in trainer.model.state_dict().items()}


def assert_same_weights(model_dir, expected: dict) -> None:
    loaded = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    assert loaded.keys() == expected.keys()
    for key in expected:
        assert torch.equal(loaded[key], expected[key]), key


def test_the_checkpoint_loads_as_the_actor_with_from_pretrained(trained, toy_path):
    """As with a Trainer checkpoint: the actor's files at the top level, beside the optimizer and the run's state
    (here a mid-rollout save's rollout_buffer_0.safetensors, which the weights index keeps out of vLLM's load)."""
    checkpoint, live = trained
    files = {p.name for p in checkpoint.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json"} <= files
    assert {"optimizer.pt", "scheduler.pt", "trainer_state.json", "rollout_buffer_0.safetensors"} <= files
    assert "actor" not in files
    assert_same_weights(checkpoint, live)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert tokenizer("abc")["input_ids"] == AutoTokenizer.from_pretrained(toy_path)("abc")["input_ids"]


def test_export_writes_the_live_actor_as_a_plain_model(trained, tmp_path):
    checkpoint, live = trained
    code, output = export(checkpoint, tmp_path / "model")
    assert code == 0, output
    files = {p.name for p in (tmp_path / "model").iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= files
    assert not files & {"optimizer.pt", "scheduler.pt", "manifest.json", "rollout_buffer_0.safetensors"}
    assert_same_weights(tmp_path / "model", live)


def test_an_old_layout_checkpoint_exports_the_same_actor(trained, tmp_path):
    """A checkpoint of an earlier version (the actor under actor/) exports the same files."""
    checkpoint, live = trained
    old = to_old_layout(shutil.copytree(checkpoint, tmp_path / "old" / checkpoint.name))
    assert export(old, tmp_path / "from-old")[0] == 0 and export(checkpoint, tmp_path / "from-new")[0] == 0
    ours = {p.name: p.read_bytes() for p in (tmp_path / "from-new").iterdir()}
    theirs = {p.name: p.read_bytes() for p in (tmp_path / "from-old").iterdir()}
    assert ours == theirs and "model.safetensors.index.json" not in ours
    assert_same_weights(tmp_path / "from-old", live)


@pytest.mark.parametrize("source", ["checkpoint", "export"])
def test_vllm_serves_the_checkpoint_and_its_export_as_transformers_generates(trained, tmp_path, source):
    from steadyrl.generation.vllm import import_vllm

    vllm = import_vllm()
    checkpoint, _ = trained
    model = checkpoint if source == "checkpoint" else tmp_path / "model"
    if source == "export":
        assert export(checkpoint, model)[0] == 0
    # an explicit KV cache size: by default vLLM on CPU wants 92% of the machine's memory free at start-up
    llm = vllm.LLM(
        model=str(model),
        dtype="float32",
        max_model_len=64,
        enforce_eager=True,
        kv_cache_memory_bytes=2**28,
    )
    prompt = [3, 4, 5, 42]
    out = llm.generate(
        [vllm.inputs.TokensPrompt(prompt_token_ids=prompt)], vllm.SamplingParams(max_tokens=8, temperature=0)
    )
    hf = (
        AutoModelForCausalLM.from_pretrained(model)
        .generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8)[0, len(prompt) :]
        .tolist()
    )
    assert list(out[0].outputs[0].token_ids) == hf[: len(out[0].outputs[0].token_ids)]
    llm.llm_engine.engine_core.shutdown()


def test_lora_checkpoint_exports_the_merged_model(tmp_path):
    trainer = RLOOTrainer(
        model=toy_model_path(),
        args=make_config(tmp_path / "run", max_steps=2, save_steps=2),
        train_dataset=toy_dataset(),
        reward_funcs=[letters_reward],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    trainer.train()
    checkpoint = tmp_path / "run" / "checkpoint-2"
    # as Trainer's: the adapter at the top level, which from_pretrained loads onto its base model (peft installed)
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in checkpoint.iterdir()}
    live = {name.removeprefix("base_model.model."): t for name, t in trainer.model.state_dict().items()}
    assert_same_weights(checkpoint, live)
    code, output = export(checkpoint, tmp_path / "model")
    assert code == 0, output
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    merged = trainer.model.merge_and_unload().state_dict()
    assert exported.keys() == merged.keys()
    for key in merged:
        torch.testing.assert_close(exported[key], merged[key], rtol=1e-5, atol=1e-6)


def test_damaged_checkpoint_or_wrong_directory_is_refused(trained, tmp_path):
    checkpoint, _ = trained
    shutil.copytree(checkpoint, tmp_path / "run" / "checkpoint-3")
    code, output = export(tmp_path / "run", tmp_path / "a")
    assert code == 2 and "is an output directory, not a checkpoint" in output and "checkpoint-3" in output
    (tmp_path / "run" / "checkpoint-3" / "model.safetensors").write_bytes(b"broken")
    code, output = export(tmp_path / "run" / "checkpoint-3", tmp_path / "b")
    assert code == 2 and "file model.safetensors has 6 bytes" in output
    assert not (tmp_path / "b").exists()
    code, output = export(checkpoint, checkpoint)
    assert code == 2 and "not empty" in output
