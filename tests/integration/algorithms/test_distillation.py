"""DistillationTrainer on the toy chat task: the untrained toy chat model (the student) learns the trained one's
next-token distributions (the teacher, same tokenizer) on-policy; the divergence falls, no reward is involved, the
teacher is part of the run's fingerprint, and the saved model and checkpoints hold the student only."""

import pytest
import torch
from conftest import read_logs, run_toy
from safetensors.torch import load_file
from support.toy_run import make_config, make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer

from steadyrl import DistillationTrainer
from steadyrl.toy import chat_dataset, chat_model_path, untrained_chat_model_path


def mean(values):
    return sum(values) / len(values)


def test_divergence_falls_and_only_the_student_is_saved(tmp_path):
    trainer = make_trainer(
        tmp_path, algorithm="distillation", learning_rate=3e-3, max_steps=12, save_steps=12, num_ppo_epochs=1
    )
    assert trainer.reward_funcs == [] and trainer.ref_model is None
    assert trainer.identity["teacher_model.weights"] != trainer.identity["model.weights"]
    trainer.train()
    steps = [entry for entry in trainer.state.log_history if "divergence" in entry]
    divergence = [entry["divergence"] for entry in steps]
    assert len(divergence) == 12 and "reward" not in steps[0]
    assert mean(divergence[-3:]) < 0.5 * mean(divergence[:3]), divergence

    trainer.save_model(str(tmp_path / "student"))
    saved = load_file(str(tmp_path / "student" / "model.safetensors"))
    student = trainer.model.state_dict()
    assert set(saved) <= set(student) and all(torch.equal(saved[k], student[k]) for k in saved)
    teacher = load_file(str(chat_model_path() + "/model.safetensors"))
    assert not torch.equal(saved["model.embed_tokens.weight"], teacher["model.embed_tokens.weight"])
    checkpoint = tmp_path / "checkpoint-12"
    files = sorted(path.name for path in checkpoint.iterdir())
    assert not any("teacher" in name for name in files), files


def test_lora_student_with_colocated_vllm_generates_from_each_updated_student(tmp_path):
    """LoRA on the student and vLLM generating its rollouts: after every update the engine samples from the merged
    student (its log-probs equal the trainer's), and the adapters learn the teacher's distributions."""
    run_toy(tmp_path, "--algorithm", "distillation", "--lora", "--set", "use_vllm=true", 'vllm_dtype="float32"')
    logs = read_logs(tmp_path)
    assert all(logs[step]["generation_logprob_diff"] < 1e-5 for step in range(1, 13)), logs
    divergence = [logs[step]["divergence"] for step in range(1, 13)]
    assert mean(divergence[-3:]) < mean(divergence[:3]), divergence
    assert (tmp_path / "final-actor" / "adapter_model.safetensors").exists(), "the student's adapters are exported"


def test_evaluate_reports_the_divergence_of_the_students_completions_as_eval_loss(tmp_path):
    from steadyrl.toy import chat_dataset

    settings = dict(max_steps=4, save_steps=100, eval_strategy="steps", eval_steps=2, num_ppo_epochs=1)
    trainer = make_trainer(tmp_path, algorithm="distillation", eval_dataset=chat_dataset("eval"), **settings)
    trainer.train()
    evaluations = [entry for entry in trainer.state.log_history if "eval_loss" in entry]
    assert [entry["step"] for entry in evaluations] == [2, 4]
    assert all(entry["eval_loss"] > 0 and entry["eval_completions/mean_length"] > 0 for entry in evaluations)
    assert not any(key.startswith("eval_reward") for entry in evaluations for key in entry)


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The Hub stand-in (support/hub_server.py), uploads and downloads, with an empty HF cache of this test's own."""
    import huggingface_hub.constants as constants
    import transformers.utils.hub
    from support.hub_server import start

    hub, server = start()
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    # transformers keeps one HfApi, made with the endpoint of its first use: an earlier test's may be the real Hub's
    monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    yield hub
    server.shutdown()
    assert not hub.unexpected, f"requests the stand-in does not implement: {hub.unexpected}"


def test_a_teacher_object_from_a_hub_id_with_an_embedding_padded_past_its_tokenizer_is_accepted(tmp_path, hub):
    """As Qwen2.5-7B's 152,064 rows for 151,665 tokens: the teacher's tokenizer is read from the Hub id its config
    names (it was looked for in local directories only, and the teacher refused for its vocab_size), found to be the
    student's, and the rows past the student's are left out."""
    teacher = AutoModelForCausalLM.from_pretrained(chat_model_path())
    rows = teacher.config.vocab_size
    teacher.resize_token_embeddings(rows + 12)
    teacher.push_to_hub("org/padded-teacher", token="hf_test")
    AutoTokenizer.from_pretrained(chat_model_path()).push_to_hub("org/padded-teacher", token="hf_test")
    loaded = AutoModelForCausalLM.from_pretrained("org/padded-teacher")
    assert loaded.config._name_or_path == "org/padded-teacher" and loaded.config.vocab_size == rows + 12

    args = make_config(tmp_path / "run", "distillation")
    trainer = DistillationTrainer(untrained_chat_model_path(), loaded, args, chat_dataset("train"))
    weight, _ = trainer.algorithm.teacher_head()
    assert torch.equal(weight, teacher.lm_head.weight[:rows]), "the student's rows of the teacher's head"
