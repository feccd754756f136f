"""Publishing the actor alone to the Hub, against the local stand-in in hub_server.py (the Hub itself cannot be
reached from here): which files arrive, that they load as the live model, that the token stays out of every
file and log, and that a failing Hub never stops training nor loses the actor."""

import copy
import json
import logging
import random
import re
import shlex

import numpy as np
import peft
import pytest
import torch
from peft import LoraConfig
from safetensors.torch import load_file
from support.old_layout import to_old_layout
from support.toy_run import make_trainer
from transformers import AutoModelForCausalLM

from steadyrl.cli.main import main
from steadyrl.publish.actor import PublishMixin
from steadyrl.publish.hub import HubPushError, hub_model_name

TOKEN = "hf_steadyrlTestTokenThatMustNotLeak"
FORBIDDEN = ("critic", "optimizer", "scheduler", "rng_state", "rollout_buffer", "training_args", "manifest")


def load_pushed(files: dict[str, bytes], directory):
    directory.mkdir()
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return AutoModelForCausalLM.from_pretrained(directory)


def assert_token_nowhere(tmp_path, text: str) -> None:
    assert TOKEN not in text
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), f"the token was written to {path}"


@pytest.mark.parametrize(
    "strategy, extra_folder",
    [
        ("end", None),
        ("every_save", None),
        ("checkpoint", "last-checkpoint/"),
        ("all_checkpoints", "checkpoint-4/"),
    ],
)
def test_push_sends_exactly_the_actor_and_its_card(hub, tmp_path, toy_path, caplog, capsys, strategy, extra_folder):
    caplog.set_level(logging.DEBUG)
    trainer = make_trainer(
        tmp_path / "run",
        algorithm="ppo",
        max_steps=4,
        save_steps=2,
        push_to_hub=True,
        hub_model_id="someone/toy-ppo",
        hub_strategy=strategy,
        hub_token=TOKEN,
    )
    trainer.train()
    trainer.save_model(str(tmp_path / "run" / "final"))  # with push_to_hub, save_model publishes too

    saved = {p.name for p in (tmp_path / "run" / "final").iterdir()}  # a checkpoint's push sends the same files
    expected = saved | {"README.md"}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= saved
    checkpoint_commits = [c for c in hub.commits if c.message.startswith("Training in progress")]
    assert len(checkpoint_commits) == (0 if strategy == "end" else {"every_save": 2}.get(strategy, 4))
    assert hub.commits[-1].message == "Model save"
    for commit in hub.commits:
        assert commit.repo_id == "someone/toy-ppo"
        names = {name.split("/", 1)[1] if "/" in name else name for name in commit.files}
        assert names == expected, commit.message
        assert not any(word in name for name in commit.files for word in FORBIDDEN)
    tree = hub.files("someone/toy-ppo")
    if extra_folder:
        assert {name for name in tree if name.startswith(extra_folder)} == {extra_folder + n for n in expected}

    root = {name: data for name, data in tree.items() if "/" not in name}
    pushed = load_pushed(root, tmp_path / "pushed").state_dict()
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(pushed[name], value), name
    card = root["README.md"].decode()
    for text in ("- steadyrl", "- ppo", "4 optimizer steps", "| reward |", "0.1.0"):
        assert text in card, text
    assert hub.card_metadata[-1]["tags"] == ["steadyrl", "ppo", "reinforcement-learning"]
    assert "base_model" not in hub.card_metadata[-1] and toy_path not in card  # loaded from disk: no Hub id
    assert set(hub.authorizations) == {f"Bearer {TOKEN}"}
    captured = capsys.readouterr()
    assert_token_nowhere(tmp_path, captured.out + captured.err + caplog.text + card)


@pytest.mark.parametrize("merged", [True, False])
def test_lora_run_pushes_merged_model_or_adapter_alone(hub, tmp_path, toy_path, merged):
    trainer = make_trainer(
        tmp_path / "run",
        max_steps=2,
        save_steps=2,
        push_to_hub=True,
        hub_model_id="someone/toy-lora",
        hub_strategy="end",
        hub_token=TOKEN,
        hub_push_merged=merged,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    trainer.train()
    trainer.push_to_hub()
    files = hub.files("someone/toy-lora")
    if merged:
        assert "adapter_config.json" not in files and "model.safetensors" in files
        pushed = load_pushed(files, tmp_path / "pushed").state_dict()
        reference = trainer.model.merge_and_unload().state_dict()
        for name, value in reference.items():
            torch.testing.assert_close(pushed[name], value, rtol=1e-5, atol=1e-6)
    else:
        assert {"adapter_config.json", "adapter_model.safetensors", "README.md"} <= set(files)
        assert "model.safetensors" not in files
        (tmp_path / "adapter").mkdir()
        (tmp_path / "adapter" / "a.safetensors").write_bytes(files["adapter_model.safetensors"])
        adapter = load_file(tmp_path / "adapter" / "a.safetensors")
        assert adapter and all("lora_" in name for name in adapter)


@pytest.mark.parametrize("layout", ["top level", "actor/"])
def test_steadyrl_push_publishes_a_checkpoint_after_the_fact(hub, tmp_path, toy_path, capsys, monkeypatch, layout):
    """From a checkpoint of either layout: the actor's files at its top level, or under actor/ (an earlier
    version's)."""
    make_trainer(tmp_path / "run", max_steps=2, save_steps=2).train()
    if layout == "actor/":
        to_old_layout(tmp_path / "run" / "checkpoint-2")
    monkeypatch.setenv("HF_TOKEN", TOKEN)  # the usual place: the environment
    assert main(["push", str(tmp_path / "run" / "checkpoint-2"), "someone/after"]) == 0
    files = hub.files("someone/after")
    actor = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert set(files) == actor | {"README.md"}
    assert "- rloo" in files["README.md"].decode() and "2 optimizer steps" in files["README.md"].decode()
    assert set(hub.authorizations) == {f"Bearer {TOKEN}"}
    assert main(["push", str(tmp_path / "run"), "someone/after"]) == 2  # an output dir is not a checkpoint
    assert "neither a steadyrl checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize("failures", [[500], [429], ["drop", 503]])
def test_failed_checkpoint_pushes_never_stop_training(hub, tmp_path, toy_path, caplog, failures):
    """The Hub fails the first push(es) of an every_save run: training and checkpointing go on, each failure is
    logged with its step and cause, and the next save pushes its own newer actor."""
    run = tmp_path / "run"
    trainer = make_trainer(
        run,
        max_steps=6,
        save_steps=2,
        push_to_hub=True,
        hub_model_id="someone/flaky",
        hub_strategy="every_save",
        hub_token=TOKEN,
    )
    hub.fail_next(1, failures[0])  # after the trainer made the repository
    for how in failures[1:]:
        hub.fail_next(1, how)
    with caplog.at_level(logging.WARNING):
        trainer.train()

    assert trainer.state.global_step == 6
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert len(hub.failed) == len(failures)
    failed_steps = [2 * (i + 1) for i in range(len(failures))]
    pushed = [c.message for c in hub.commits if c.message.startswith("Training in progress")]
    assert pushed == [f"Training in progress, step {step}" for step in range(2, 7, 2) if step not in failed_steps]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for step, how in zip(failed_steps, failures):
        [message] = [w for w in warnings if w.startswith(f"Could not push the actor of step {step} ")]
        assert "'someone/flaky'" in message and "Training goes on" in message
        cause = "RemoteProtocolError" if how == "drop" else f"HfHubHTTPError: {how} " if how == 429 else f"'{how} "
        assert cause in message, message
        command = shlex.split(message.rsplit("by hand: ", 1)[1])
        assert command == ["steadyrl", "push", str((run / f"checkpoint-{step}").absolute()), "someone/flaky"]
    if len(failures) > 1:
        assert "Earlier failed pushes: step 2." in next(w for w in warnings if "of step 4 " in w)
    steps = "steps 2, 4" if len(failures) > 1 else "step 2"
    next_step = failed_steps[-1] + 2
    recovered = f"Hub push recovered: {steps} failed, step {next_step} pushed to 'someone/flaky', superseding the"
    assert [w for w in warnings if w.startswith("Hub push recovered")] == [recovered + " failed one(s)."]
    assert trainer.failed_push_steps == ()
    assert_token_nowhere(tmp_path, caplog.text)


def test_a_hub_outage_when_the_trainer_is_built_does_not_stop_the_run(hub, tmp_path, toy_path, caplog):
    """Creating the repository fails as the trainer is built (503): the run starts anyway and the first push creates
    it. A token the Hub refuses (401) is an error at once: no later push could succeed."""
    hub.fail_next(1, 503, path="/api/repos/create")
    with caplog.at_level(logging.WARNING):
        trainer = make_trainer(
            tmp_path / "run",
            max_steps=2,
            save_steps=2,
            push_to_hub=True,
            hub_model_id="someone/late",
            hub_strategy="every_save",
            hub_token=TOKEN,
        )
    assert "Could not create the Hub repository 'someone/late' now" in caplog.text
    trainer.train()
    assert [c.message for c in hub.commits] == ["Training in progress, step 2"]
    assert "someone/late" in hub.repos

    hub.fail_next(1, 401, path="/api/repos/create")
    with pytest.raises(
        HubPushError,
        match=r"push_to_hub=True, but the Hugging Face Hub at http://127\.0\.0\.1:\d+ "
        r"answered HTTP 401 \(the token is missing, invalid or cannot write there\).*'someone/denied'",
    ):
        make_trainer(tmp_path / "denied", push_to_hub=True, hub_model_id="someone/denied", hub_token=TOKEN)
    # after a refused creation huggingface_hub asks whether the repository exists anyway; the stand-in answers 404
    assert hub.unexpected == ["GET /api/models/someone/denied"]
    hub.unexpected.clear()


def test_programming_errors_in_a_checkpoint_push_are_not_swallowed(hub, tmp_path, toy_path, monkeypatch):
    trainer = make_trainer(
        tmp_path / "run",
        max_steps=2,
        save_steps=2,
        push_to_hub=True,
        hub_model_id="someone/bug",
        hub_strategy="every_save",
        hub_token=TOKEN,
    )

    def broken(*args, **kwargs):
        raise TypeError("a bug, not the network")

    monkeypatch.setattr("steadyrl.publish.actor.upload", broken)
    with pytest.raises(TypeError, match="a bug, not the network"):
        trainer.train()
    assert (tmp_path / "run" / "checkpoint-2" / "manifest.json").is_file()  # the checkpoint was complete first


def test_failed_final_push_says_where_the_actor_is_and_how_to_publish_it(hub, tmp_path, toy_path, capsys):
    run = tmp_path / "run"
    trainer = make_trainer(
        run,
        max_steps=2,
        save_steps=2,
        push_to_hub=True,
        hub_model_id="someone/final",
        hub_strategy="end",
        hub_token=TOKEN,
    )
    trainer.train()

    hub.fail_next(1, 503)
    with pytest.raises(HubPushError) as raised:
        trainer.push_to_hub()
    kept = (run / "actor-step-2").absolute()  # push_to_hub() alone staged the actor in a temporary directory
    expected = (
        r"Could not push the actor to the Hub repository 'someone/final' \(HfHubHTTPError: Server error '503 "
        rf".*\)\. The actor is saved locally in {re.escape(str(kept))}; once the Hub is reachable, publish it "
        rf"with: steadyrl push {re.escape(str(kept))} someone/final"
    )
    assert re.fullmatch(expected, str(raised.value)), str(raised.value)
    assert (kept / "model.safetensors").is_file() and (kept / "tokenizer.json").is_file()

    hub.fail_next(1, "drop")  # save_model with push_to_hub: the actor it just wrote is the local copy
    with pytest.raises(HubPushError, match=r"RemoteProtocolError.*saved locally in .*final; .*steadyrl push .*final"):
        trainer.save_model(str(run / "final"))
    assert not hub.commits

    hub.fail_next(1, 429)  # the command the message gives reports a failing Hub without a traceback
    assert main(["push", str(kept), "someone/final"]) == 2
    err = capsys.readouterr().err
    assert (
        f"steadyrl push: error: could not push to 'someone/final': the Hugging Face Hub at {hub.url} answered "
        "HTTP 429" in err
    )
    assert main(["push", str(kept), "someone/final"]) == 0
    pushed = load_pushed(hub.files("someone/final"), tmp_path / "pushed").state_dict()
    for name, value in trainer.model.state_dict().items():
        assert torch.equal(pushed[name], value), name


def dead_endpoint() -> str:
    """An address on this machine where nothing listens: a Hub that cannot be reached."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_an_unreachable_hub_is_one_clear_line_before_any_work(tmp_path, toy_path, monkeypatch, capsys, caplog):
    """steadyrl push: one line naming the endpoint and the cause, exit 2. push_to_hub=True: the same, when the trainer
    is built. HF_HUB_OFFLINE: the run trains and says how to publish later."""
    import huggingface_hub.constants

    endpoint = dead_endpoint()
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", endpoint)
    actor = tmp_path / "actor"
    AutoModelForCausalLM.from_pretrained(toy_path).save_pretrained(actor)
    capsys.readouterr()  # the progress bars of loading and saving
    assert main(["push", str(actor), "someone/x", "--token", TOKEN]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(
        f"steadyrl push: error: could not push to 'someone/x': the Hugging Face Hub at {endpoint} cannot be reached: "
    ), err
    assert main(["push", str(tmp_path / "missing"), "someone/x"]) == 2
    assert capsys.readouterr().err.strip() == f"steadyrl push: error: {tmp_path / 'missing'} does not exist"

    with pytest.raises(
        HubPushError,
        match=rf"^push_to_hub=True, but the Hugging Face Hub at {endpoint} cannot be "
        r"reached: .*set HF_HUB_OFFLINE=1",
    ):
        make_trainer(tmp_path / "run", push_to_hub=True, hub_model_id="someone/x", hub_token=TOKEN)
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").glob("checkpoint-*"))

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with caplog.at_level(logging.WARNING):
        trainer = make_trainer(
            tmp_path / "offline",
            max_steps=2,
            save_steps=2,
            push_to_hub=True,
            hub_model_id="someone/x",
            hub_strategy="every_save",
            hub_token=TOKEN,
        )
        trainer.train()
        assert trainer.push_to_hub() is None
    assert "HF_HUB_OFFLINE is set: training goes on without publishing" in caplog.text
    assert "HF_HUB_OFFLINE is set: the actor is not pushed. It is in " in caplog.text
    assert (tmp_path / "offline" / "checkpoint-2" / "manifest.json").is_file()


def test_the_card_names_a_hub_base_model_never_a_local_path(hub, tmp_path, toy_path, monkeypatch):
    """base_model: the model's Hub id; a path (existing here or not) would show the user's directories and is no
    model the Hub knows, so the card has no base_model then (the trainer's and steadyrl push's cards alike)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "mine").mkdir(parents=True)
    for local in (toy_path, "/no/such/dir/model", "./model", "~/model", "models/mine", "a/b/c", ""):
        assert hub_model_name(local) is None, local
    for hub_id in ("someone/tiny-base", "gpt2"):
        assert hub_model_name(hub_id) == hub_id

    trainer = make_trainer(
        tmp_path / "run", max_steps=2, save_steps=2, push_to_hub=True, hub_model_id="someone/named", hub_token=TOKEN
    )
    trainer.train()
    trainer.base_model_name = "someone/tiny-base"  # what a model from the Hub names (it cannot be loaded here)
    trainer.push_to_hub()
    assert hub.card_metadata[-1]["base_model"] == "someone/tiny-base"
    assert "2 optimizer steps from\n`someone/tiny-base`" in hub.files("someone/named")["README.md"].decode()

    lora = make_trainer(
        tmp_path / "lora",
        max_steps=2,
        save_steps=2,
        peft_config=LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]),
    )
    lora.train()
    adapter_config = (tmp_path / "lora" / "checkpoint-2" / "adapter_config.json").read_text()
    assert toy_path in adapter_config  # PEFT names the base by the path it was loaded from
    assert main(["push", str(tmp_path / "lora" / "checkpoint-2"), "someone/adapter", "--token", TOKEN]) == 0
    assert "base_model" not in hub.card_metadata[-1]
    pushed = hub.files("someone/adapter")
    assert toy_path not in pushed["README.md"].decode() and toy_path not in pushed["adapter_config.json"].decode()
    assert json.loads(pushed["adapter_config.json"])["base_model_name_or_path"] is None


@pytest.mark.parametrize("refused_at", ["/api/repos/create", "/preupload/"])
def test_a_refused_token_during_training_is_reported_once_and_training_goes_on(
    hub, tmp_path, toy_path, caplog, refused_at
):
    """Creating the repository fails as the trainer is built (503); then the Hub refuses the token at the first two
    checkpoint pushes (creating the repository again, or uploading). Training reaches max_steps with every
    checkpoint written, the refusal is one error that says what to do, and the third save's push gets through."""
    run = tmp_path / "run"
    hub.fail_next(1, 503, path="/api/repos/create")
    hub.fail_next(2, 401 if "create" in refused_at else 403, path=refused_at)
    with caplog.at_level(logging.WARNING):
        trainer = make_trainer(
            run,
            max_steps=6,
            save_steps=2,
            push_to_hub=True,
            hub_model_id="someone/refused",
            hub_strategy="every_save",
            hub_token=TOKEN,
        )
        trainer.train()

    assert trainer.state.global_step == 6
    assert sorted(p.name for p in run.glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert all((run / f"checkpoint-{step}" / "manifest.json").is_file() for step in (2, 4, 6))
    assert [c.message for c in hub.commits] == ["Training in progress, step 6"]
    status = 401 if "create" in refused_at else 403
    [error] = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert error.startswith(
        f"Could not push the actor of step 2 to the Hub repository 'someone/refused': the "
        f"Hugging Face Hub at {hub.url} answered HTTP {status} (the token is missing, invalid "
        "or cannot write there)"
    ), error
    assert "Training goes on" in error and "(hub_token, HF_TOKEN or `hf auth login`)" in error
    assert shlex.split(error.rsplit("with: ", 1)[1]) == [
        "steadyrl",
        "push",
        str((run / "checkpoint-2").absolute()),
        "someone/refused",
    ]
    assert "step 4" not in caplog.text.replace("steps 2, 4 failed", "")  # the second refusal is not reported again
    assert "Hub push recovered: steps 2, 4 failed, step 6 pushed to 'someone/refused'" in caplog.text
    assert_token_nowhere(tmp_path, caplog.text)
    # a refused creation makes huggingface_hub ask whether the repository exists anyway (the stand-in: 404)
    assert set(hub.unexpected) <= {"GET /api/models/someone/refused"}
    hub.unexpected.clear()


def global_rng() -> tuple:
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def assert_same_rng(before: tuple, after: tuple) -> None:
    assert torch.equal(before[0], after[0]), "torch's RNG moved"
    assert before[1][0] == after[1][0] and np.array_equal(before[1][1], after[1][1]), "NumPy's RNG moved"
    assert before[1][2:] == after[1][2:] and before[2] == after[2], "NumPy's or Python's RNG moved"


@pytest.mark.parametrize("use_dora", [False, True])
def test_merged_pushes_during_training_leave_the_run_as_if_it_did_not_push(
    hub, tmp_path, toy_path, monkeypatch, use_dora
):
    """hub_push_merged at every save: each push leaves the global RNG as it found it, so the run ends with the
    weights of one that never pushes (and a resumed run, which restores the RNG the checkpoint saved before the push,
    stays byte-identical). LoRA is merged from the live weights, never a second base model loaded; DoRA (which that
    merge does not cover) from the saved adapter and its base, with the RNG put back."""

    def lora() -> LoraConfig:
        return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], use_dora=use_dora)

    around_pushes = []
    publish_checkpoint = PublishMixin.publish_checkpoint

    def publish_and_record_rng(self, checkpoint, step):
        before = global_rng()
        publish_checkpoint(self, checkpoint, step)
        around_pushes.append((before, global_rng()))

    def no_second_model(*args, **kwargs):
        raise AssertionError("a merged push of a LoRA actor loaded its base model again")

    monkeypatch.setattr(PublishMixin, "publish_checkpoint", publish_and_record_rng)
    if not use_dora:
        monkeypatch.setattr(peft.AutoPeftModelForCausalLM, "from_pretrained", no_second_model)
    pushing = make_trainer(
        tmp_path / "pushing",
        max_steps=4,
        save_steps=2,
        push_to_hub=True,
        hub_model_id="someone/m",
        hub_strategy="every_save",
        hub_token=TOKEN,
        hub_push_merged=True,
        peft_config=lora(),
    )
    pushing.train()
    assert [c.message for c in hub.commits] == [f"Training in progress, step {step}" for step in (2, 4)]
    assert len(around_pushes) == 2
    for before, after in around_pushes:
        assert_same_rng(before, after)

    files = hub.files("someone/m")
    assert "adapter_config.json" not in files and {"model.safetensors", "tokenizer.json"} <= set(files)
    assert not any(word in name for name in files for word in FORBIDDEN)
    pushed = load_pushed(files, tmp_path / "pushed").state_dict()
    merged = copy.deepcopy(pushing.model).merge_and_unload().state_dict()
    assert pushed.keys() == merged.keys()
    for name, value in merged.items():  # the live merge equals PEFT's, bit for bit; DoRA's too, to rounding
        torch.testing.assert_close(pushed[name], value, rtol=1e-5 * use_dora, atol=1e-6 * use_dora, msg=name)

    quiet = make_trainer(tmp_path / "quiet", max_steps=4, save_steps=2, peft_config=lora())
    quiet.train()
    quiet_weights = quiet.model.state_dict()
    for name, value in pushing.model.state_dict().items():
        assert torch.equal(value, quiet_weights[name]), name
    # the RNG checkpoint-4 saves (after the push at step 2) is the quiet run's, as crash_fuzz.py compares checkpoints
    assert checkpoint_hashes(tmp_path / "pushing" / "checkpoint-4") == checkpoint_hashes(
        tmp_path / "quiet" / "checkpoint-4"
    )


def checkpoint_hashes(checkpoint) -> dict[str, str]:
    files = json.loads((checkpoint / "manifest.json").read_text())["files"]
    names = ("rng_state_0.json", "adapter_model.safetensors", "optimizer.pt", "scheduler.pt")
    assert set(names) <= set(files)
    return {name: files[name]["sha256"] for name in names}
