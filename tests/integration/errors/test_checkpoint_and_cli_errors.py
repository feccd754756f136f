"""The rows of docs/errors.md's table ("When input is wrong") in the areas checkpoints and command line: resuming, the
run directory, export and the ``steadyrl`` commands. Each row's trigger provokes its error, checked against the table's
text (errors/error_table.py: how, and which file has which areas)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from support.toy_run import make_trainer
from transformers import (
    AutoModelForCausalLM,
)

from integration.errors.error_table import Context, Triggers
from steadyrl.toy import toy_model_path

trigger = Triggers(__file__)


# checkpoints


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    output_dir = tmp_path_factory.mktemp("finished-run")
    make_trainer(output_dir, max_steps=2, save_steps=2).train()
    return output_dir


@trigger("resume-missing")
def _(ctx):
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(ctx.tmp_path / "checkpoint-500"))


@trigger("resume-incomplete")
def _(ctx):
    unfinished = ctx.tmp_path / "checkpoint-500"
    unfinished.mkdir()
    (unfinished / "trainer_state.json").write_text("{}")
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(unfinished))


@trigger("resume-damaged")
def _(ctx):
    copy = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    weights = copy / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # one flipped bit pattern, same size: only the hash can tell
    weights.write_bytes(bytes(data))
    make_trainer(ctx.tmp_path / "out").train(resume_from_checkpoint=str(copy))


@trigger("resume-changed")
def _(ctx):
    make_trainer(ctx.tmp_path, learning_rate=5e-2).train(resume_from_checkpoint=str(ctx.run / "checkpoint-2"))


@trigger("resume-per-process-default")
def _(ctx):
    import json

    from steadyrl.checkpoint.files import write_manifest

    checkpoint = ctx.tmp_path / "checkpoint-2"  # as 2 processes would have written it, micro-batches left unset
    shutil.copytree(ctx.run / "checkpoint-2", checkpoint)
    state = json.loads((checkpoint / "steadyrl_state.json").read_text())
    state["fingerprint"]["args.micro_train_batch_size"] = 1  # each process's share of 2: its default there
    (checkpoint / "steadyrl_state.json").write_text(json.dumps(state))
    settings = json.loads((checkpoint / "settings.json").read_text())
    (checkpoint / "settings.json").write_text(json.dumps({**settings, "world_size": 2}))
    write_manifest(checkpoint, 2)
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


@trigger("output-dir-other-run")
def _(ctx):
    shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    make_trainer(ctx.tmp_path).train()


@trigger("output-dir-in-use")
def _(ctx):
    from steadyrl.checkpoint.ownership import OutputDirLock

    other = OutputDirLock(ctx.tmp_path)  # another run's lock (flock: another open file conflicts, even in-process)
    other.acquire()
    try:
        make_trainer(ctx.tmp_path).train()
    finally:
        other.release()


@trigger("output-dir-run-without-checkpoints")
def _(ctx):
    (ctx.tmp_path / "metrics.jsonl").write_text('{"loss": 0.5, "step": 1}\n')  # a run with save_strategy="no"
    (ctx.tmp_path / "actor").mkdir()
    make_trainer(ctx.tmp_path).train()


@trigger("output-dir-finished-run-resume")
def _(ctx):
    summary = '{"train_runtime": 9.0, "step": 2}'  # the line a run appends as it ends
    (ctx.tmp_path / "metrics.jsonl").write_text('{"loss": 0.5, "step": 1}\n' + summary + "\n")
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=True)


@trigger("output-dir-lock-link")
def _(ctx):
    (ctx.tmp_path / "notes.txt").write_text("not a lock")
    (ctx.tmp_path / ".steadyrl-run.lock").symlink_to(ctx.tmp_path / "notes.txt")
    make_trainer(ctx.tmp_path).train()


@trigger("resume-value")
def _(ctx):
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=2)


@trigger("resume-format")
def _(ctx):
    from steadyrl.checkpoint.files import write_manifest

    checkpoint = ctx.tmp_path / "checkpoint-2"
    shutil.copytree(ctx.run / "checkpoint-2", checkpoint)
    state = checkpoint / "steadyrl_state.json"
    state.write_text(state.read_text().replace('"format": 5', '"format": 1'))
    write_manifest(checkpoint, 2)
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


@trigger("resume-nonfinite")
def _(ctx):
    import json

    from safetensors.torch import load_file, save_file

    from steadyrl.checkpoint.files import write_manifest

    checkpoint = ctx.tmp_path / "checkpoint-2"
    shutil.copytree(ctx.run / "checkpoint-2", checkpoint)
    weights = load_file(checkpoint / "model.safetensors")
    next(iter(weights.values())).view(-1)[0] = float("nan")
    save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
    state = json.loads((checkpoint / "steadyrl_state.json").read_text())
    del state["finite_checked"]  # as an earlier steadyrl wrote it
    (checkpoint / "steadyrl_state.json").write_text(json.dumps(state))
    (checkpoint / "manifest.json").unlink()
    write_manifest(checkpoint, 2)
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


@trigger("export-not-checkpoint")
def _(ctx):
    return ctx.cli("export", ctx.run, ctx.tmp_path / "actor")


# command line


@trigger("cli-unknown-field")
def _(ctx):
    config = ctx.tmp_path / "cfg.yaml"
    config.write_text("learning_rat: 0.1\n")
    return ctx.cli("rloo", "--config", config)


@trigger("cli-bad-value")
def _(ctx):
    return ctx.cli("rloo", "--output_dir", ctx.tmp_path, "--train_batch_size", "3")


@trigger("cli-no-model")
def _(ctx):
    return ctx.cli("rloo", "--output_dir", ctx.tmp_path)


@trigger("cli-no-dataset")
def _(ctx):
    return ctx.cli("rloo", "--output_dir", ctx.tmp_path, "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct")


@trigger("cli-dataset-missing")
def _(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)
    return ctx.cli("rloo", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--dataset_name", "data/prompts.jsonl")


@trigger("cli-dataset-type")
def _(ctx):
    ctx.monkeypatch.chdir(ctx.tmp_path)
    (ctx.tmp_path / "notes.txt").write_text("abc:\n")
    return ctx.cli("rloo", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct", "--dataset_name", "notes.txt")


@trigger("cli-toy-and-model")
def _(ctx):
    return ctx.cli("rloo", "--output_dir", ctx.tmp_path, "--toy", "--model_name_or_path", "Qwen/Qwen2.5-0.5B-Instruct")


@trigger("cli-resume-changed")
def _(ctx):
    return ctx.cli(
        "rloo",
        "--toy",
        "--output_dir",
        ctx.tmp_path,
        "--learning_rate",
        "0.05",
        "--resume_from_checkpoint",
        ctx.run / "checkpoint-2",
    )


@trigger("push-unreachable")
def _(ctx):
    import socket

    import huggingface_hub.constants

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx.monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    actor = ctx.tmp_path / "actor"

    AutoModelForCausalLM.from_pretrained(toy_model_path()).save_pretrained(actor)
    return ctx.cli("push", actor, "someone/toy", "--token", "hf_x")


@trigger("export-missing")
def _(ctx):
    return ctx.cli("export", ctx.tmp_path / "out" / "checkpoint-500", ctx.tmp_path / "actor")


@trigger("checkpoints-missing")
def _(ctx):
    return ctx.cli("checkpoints", ctx.tmp_path / "out")


@trigger("export-unlisted")
def _(ctx):
    checkpoint = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    (checkpoint / "notes.txt").write_text("my notes")
    return ctx.cli("export", checkpoint, ctx.tmp_path / "actor")


@trigger("export-symlink")
def _(ctx):
    checkpoint = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    tokenizer = checkpoint / "tokenizer.json"
    shutil.move(tokenizer, ctx.tmp_path / "tokenizer.json")
    tokenizer.symlink_to(ctx.tmp_path / "tokenizer.json")
    return ctx.cli("export", checkpoint, ctx.tmp_path / "actor")


@trigger("resume-renamed")
def _(ctx):
    checkpoint = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-4")
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


@trigger("resume-manifest-json")
def _(ctx):
    checkpoint = shutil.copytree(ctx.run / "checkpoint-2", ctx.tmp_path / "checkpoint-2")
    manifest = checkpoint / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:100])
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


@trigger("resume-other-backend")
def _(ctx):
    from steadyrl.checkpoint.files import write_manifest

    checkpoint = ctx.tmp_path / "checkpoint-2"  # as a DeepSpeed ZeRO-2 run would have written it
    shutil.copytree(ctx.run / "checkpoint-2", checkpoint)
    state = checkpoint / "steadyrl_state.json"
    state.write_text(state.read_text().replace('"zero_stage": null', '"zero_stage": 2'))
    write_manifest(checkpoint, 2)
    make_trainer(ctx.tmp_path).train(resume_from_checkpoint=str(checkpoint))


@trigger("resume-optimizer-per-block")
def _(ctx):
    from support.zero_stage2 import in_zero2_process, resume_per_block_state

    return in_zero2_process(resume_per_block_state, str(ctx.tmp_path / "checkpoint-2"))


@pytest.mark.parametrize("row_id", trigger.row_ids())
def test_readme_error_table_row(row_id, tmp_path, request, monkeypatch, capsys):
    trigger.check(row_id, Context(tmp_path, request, monkeypatch, capsys))
