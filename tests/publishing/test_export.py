"""``steadyrl export CKPT_DIR OUT_DIR``: the actor of a checkpoint as a plain model that transformers and vLLM load."""

import subprocess
import sys

import pytest
import torch
from peft import LoraConfig
from support.toy_run import make_config, make_trainer
from transformers import AutoModelForCausalLM

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


def test_export_writes_the_live_actor_as_a_plain_model(trained, tmp_path):
    checkpoint, live = trained
    code, output = export(checkpoint, tmp_path / "model")
    assert code == 0, output
    files = {p.name for p in (tmp_path / "model").iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json"} <= files
    assert not files & {"optimizer.pt", "scheduler.pt", "manifest.json"}
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    assert exported.keys() == live.keys()
    for key in live:
        assert torch.equal(exported[key], live[key]), key


def test_export_loads_in_vllm_and_generates_like_transformers(trained, tmp_path):
    from steadyrl.generation.vllm import import_vllm

    vllm = import_vllm()
    checkpoint, _ = trained
    assert export(checkpoint, tmp_path / "model")[0] == 0
    # an explicit KV cache size: by default vLLM on CPU wants 92% of the machine's memory free at start-up
    llm = vllm.LLM(
        model=str(tmp_path / "model"),
        dtype="float32",
        max_model_len=64,
        enforce_eager=True,
        kv_cache_memory_bytes=2**28,
    )
    prompt = [3, 4, 5, 42]
    out = llm.generate(
        [vllm.inputs.TokensPrompt(prompt_token_ids=prompt)], vllm.SamplingParams(max_tokens=8, temperature=0)
    )
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model")
    hf = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=8)[0, len(prompt) :].tolist()
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
    code, output = export(tmp_path / "run" / "checkpoint-2", tmp_path / "model")
    assert code == 0, output
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    merged = trainer.model.merge_and_unload().state_dict()
    assert exported.keys() == merged.keys()
    for key in merged:
        torch.testing.assert_close(exported[key], merged[key], rtol=1e-5, atol=1e-6)


def test_damaged_checkpoint_or_wrong_directory_is_refused(trained, tmp_path):
    import shutil

    checkpoint, _ = trained
    shutil.copytree(checkpoint, tmp_path / "run" / "checkpoint-3")
    code, output = export(tmp_path / "run", tmp_path / "a")
    assert code == 2 and "is an output directory, not a checkpoint" in output and "checkpoint-3" in output
    (tmp_path / "run" / "checkpoint-3" / "actor" / "model.safetensors").write_bytes(b"broken")
    code, output = export(tmp_path / "run" / "checkpoint-3", tmp_path / "b")
    assert code == 2 and "actor/model.safetensors" in output
    assert not (tmp_path / "b").exists()
    code, output = export(checkpoint, checkpoint)
    assert code == 2 and "not empty" in output
