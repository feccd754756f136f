"""DistillationTrainer on the toy chat task: the untrained toy chat model (the student) learns the trained one's
next-token distributions (the teacher, same tokenizer) on-policy; the divergence falls, no reward is involved, the
teacher is part of the run's fingerprint, and the saved model and checkpoints hold the student only."""

import torch
from safetensors.torch import load_file
from support.toy_run import make_trainer

from steadyrl.toy import chat_model_path


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
