"""LoRA (peft_config) on a sharded base: DeepSpeed ZeRO-3 and FSDP2 (``accelerate launch``, two processes on gloo).
Each trains like the same LoRA run under DDP, checkpoints the adapter alone (and the optimizer state of its
parameters only), exports it (adapter and merged) equal to the live model, and resumes byte-identically after a
SIGKILL; under FSDP2, vLLM gets the merged actor. The checks share short runs (6 steps, checkpoint-3 in the middle
of the first rollout). A file of its own, so that pytest-xdist runs it beside the other multi-process tests."""

from __future__ import annotations

import pytest
import torch
from conftest import CONFIGS, MULTI_CPU, TWO_PROCESSES, ZERO, read_logs, run_toy
from safetensors.torch import load as safetensors_load
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from integration.resume.test_resume import TIMINGS
from steadyrl.publish.export import export_actor
from steadyrl.toy import toy_model_path

BACKENDS = {"zero3": ZERO["zero3"], "fsdp2": CONFIGS / "fsdp2.yaml"}
SETTINGS = [*TWO_PROCESSES, "max_steps=6"]  # save_steps 3; a rollout is 4 steps
COMPARED = ("loss", "grad_norm", "reward", "kl", "entropy")


@pytest.fixture(scope="module")
def ddp_lora(tmp_path_factory, toy_path):
    out = tmp_path_factory.mktemp("ddp-lora")
    run_toy(out, "--lora", *SETTINGS, accelerate_config=MULTI_CPU)
    return out


@pytest.fixture(scope="module", params=list(BACKENDS))
def runs(request, tmp_path_factory, toy_path):
    """(backend, uninterrupted run with the live actor written after step 3 that pushes each checkpoint's actor
    merged to a Hub stand-in, run SIGKILLed after checkpoint-3 and resumed, the Hub's commits)."""
    from support.hub_server import start

    config = BACKENDS[request.param]
    full, resumed = (tmp_path_factory.mktemp(f"{request.param}-lora-{kind}") for kind in ("full", "resumed"))
    hub, server = start()
    push = [
        "push_to_hub=true",
        "hub_strategy=every_save",
        "hub_push_merged=true",
        "hub_token=hf_x",
        f"hub_model_id=someone/{request.param}",
    ]
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("HF_ENDPOINT", hub.url)
            env.delenv("HF_TOKEN", raising=False)
            run_toy(full, "--lora", "--save-live-actor", "3", *SETTINGS, *push, accelerate_config=config)
    finally:
        server.shutdown()
    run_toy(resumed, "--lora", "--kill-after-save", "3", *SETTINGS, expect_kill=True, accelerate_config=config)
    assert sorted(p.name for p in resumed.glob("checkpoint-*")) == ["checkpoint-3"]
    _, output = run_toy(resumed, "--lora", "--resume", *SETTINGS, accelerate_config=config)
    assert output.count("Resuming from") == 2 and "checkpoint-3" in output
    return request.param, full, resumed, hub.commits


def adapter_file(directory) -> bytes:
    return (directory / "adapter_model.safetensors").read_bytes()


def test_sigkill_after_a_checkpoint_resumes_identically(runs):
    _, full, resumed, _ = runs
    assert (resumed / "checkpoint-3" / "rollout_buffer_0.safetensors").is_file(), "the save at 3 is mid-rollout"
    assert adapter_file(resumed / "final-actor") == adapter_file(full / "final-actor")
    assert adapter_file(resumed / "checkpoint-6") == adapter_file(full / "checkpoint-6")
    expected, actual = read_logs(full), read_logs(resumed)
    assert sorted(actual) == sorted(expected) == list(range(1, 7))
    for step in range(4, 7):
        assert set(actual[step]) == set(expected[step])
        for key in set(expected[step]) - TIMINGS:
            assert actual[step][key] == expected[step][key], f"step {step}: {key} differs"


def test_checkpoint_holds_the_adapter_and_its_optimizer_state_only(runs):
    backend, full, _, _ = runs
    checkpoint = full / "checkpoint-3"
    names = {p.name for p in checkpoint.iterdir()}  # the adapter at the top level, as Trainer's PEFT checkpoint
    assert {"adapter_config.json", "adapter_model.safetensors"} <= names and "model.safetensors" not in names
    adapter = sum(t.numel() for t in load_file(checkpoint / "adapter_model.safetensors").values())
    states = [torch.load(checkpoint / f"optimizer_{rank}.pt", weights_only=True) for rank in (0, 1)]
    if backend == "zero3":  # each process: the fp32 master weights of its half of the adapter
        sizes = [sum(p.numel() for p in state["fp32_partitions"]) for state in states]
    else:  # each process: the AdamW moments of its shards of the adapter's parameters
        sizes = [sum(entry["exp_avg"].numel() for entry in state["state"].values()) for state in states]
    assert sum(sizes) >= adapter and max(sizes) <= adapter // 2 + 64, (sizes, adapter)


def test_export_of_a_checkpoint_equals_the_live_model(runs, tmp_path):
    from peft import PeftModel

    _, full, _, _ = runs
    live = load_file(full / "live-actor-3.safetensors")  # the PeftModel's parameters, gathered after step 3
    saved = load_file(full / "checkpoint-3" / "adapter_model.safetensors")
    assert saved and len(saved) == sum("lora_" in name for name in live)
    for name, weights in saved.items():
        assert torch.equal(live[name.replace(".weight", ".default.weight")], weights), name
    export_actor(full / "checkpoint-3", tmp_path / "merged")  # what `steadyrl export` runs
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "merged").state_dict()
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(toy_model_path()), full / "checkpoint-3")
    assert not model.load_state_dict(live, strict=False).unexpected_keys
    merged = model.merge_and_unload().state_dict()
    assert exported.keys() == merged.keys()
    for name, weights in merged.items():
        assert torch.equal(exported[name], weights), name


def test_merged_hub_pushes_equal_the_export_of_their_checkpoint(runs, tmp_path):
    _, full, _, commits = runs
    steps = ["Training in progress, step 3", "Training in progress, step 6"]
    assert [c.message for c in commits] == [*steps, "Model save"]
    for commit, step in zip(commits, (3, 6, 6)):
        assert "adapter_config.json" not in commit.files
        exported = export_actor(full / f"checkpoint-{step}", tmp_path / f"{len(list(tmp_path.iterdir()))}")
        expected = load_file(exported / "model.safetensors")
        weights = safetensors_load(commit.files["model.safetensors"])
        assert weights.keys() == expected.keys()
        for name, tensor in expected.items():
            assert torch.equal(weights[name], tensor), (commit.message, name)


def test_lora_trains_like_ddp(runs, ddp_lora):
    _, full, _, _ = runs
    sharded, ddp = read_logs(full), read_logs(ddp_lora)
    for step in range(1, 7):  # same data, same seeds: only the order of floating-point sums may differ
        for key in COMPARED:
            assert sharded[step][key] == pytest.approx(ddp[step][key], rel=1e-4, abs=1e-5), (step, key)


def test_vllm_gets_the_merged_actor_of_an_fsdp2_lora_run(tmp_path):
    # step 5 samples from the second rollout, with the adapters trained 4 steps merged into the gathered base (ZeRO-3
    # gathers the whole PeftModel and merges it as on one process: tests/integration/distributed/test_distributed.py
    # covers its gather); REINFORCE++'s run (the runs above are RLOO's)
    vllm = ["use_vllm=true", "vllm_dtype=float32", "max_steps=5"]
    flags = ["--algorithm", "reinforce-pp", "--lora", *TWO_PROCESSES, *vllm]
    run_toy(tmp_path, *flags, accelerate_config=BACKENDS["fsdp2"])
    logs = read_logs(tmp_path)
    assert sorted(logs) == list(range(1, 6))
    for step, entry in logs.items():  # vLLM's log-probs of its samples are the trainer's: the push was W + scale x BA
        assert entry["generation_logprob_diff"] < 1e-4, step
