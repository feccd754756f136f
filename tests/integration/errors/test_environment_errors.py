"""The rows of docs/errors.md's table ("When input is wrong") in the areas environment and FSDP2: what is installed, the
disk, the Hub, several machines, the launcher's config. Each row's trigger provokes its error, checked against the
table's text (errors/error_table.py: how, and which file has which areas)."""

from __future__ import annotations

import sys
import types

import pytest
from support.toy_run import make_config, make_trainer
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from integration.errors.error_table import Context, Triggers, rloo
from steadyrl.toy import toy_model_path

trigger = Triggers(__file__)


def fake_vllm(ctx: Context, head_sizes: list[int], version: str = "0.32.0") -> None:
    """Stand in for vLLM (importing the real one takes ~20 s): the modules steadyrl's checks import, with a CPU
    attention backend that supports ``head_sizes``. tests/integration/generation/test_vllm.py runs the same checks with
    the real vLLM."""
    backend = types.SimpleNamespace(get_supported_head_sizes=lambda: head_sizes)
    module = "vllm.v1.attention.backends.cpu_attn"
    names = [module.rsplit(".", depth)[0] for depth in range(module.count("."), -1, -1)]  # vllm, vllm.v1, ...
    for name in names:
        ctx.monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[names[-1]].CPUAttentionBackend = backend
    sys.modules["vllm"].__version__ = version  # by default a tested one, for steadyrl.compat's check


# environment


@trigger("deepspeed-overflow-check")
def _(ctx):
    from steadyrl.models.loading import check_deepspeed_support

    config = {"zero_optimization": {"stage": 2}, "bf16": {"enabled": True, "check_grad_overflow": False}}
    check_deepspeed_support(config, None)


@trigger("output-dir-file")
def _(ctx):
    (ctx.tmp_path / "out").write_text("")
    make_config(ctx.tmp_path / "out")


def save_failing_with(ctx, errno: int, reason: str) -> None:
    """Train one step whose checkpoint's torch.save fails with OSError(errno, reason), as the disk would."""
    import torch

    def failing(obj, path, *args, **kwargs):
        raise OSError(errno, reason, str(path))

    trainer = make_trainer(ctx.tmp_path / "out", max_steps=1, save_steps=1)
    ctx.monkeypatch.setattr(torch, "save", failing)
    trainer.train()


@trigger("disk-full")
def _(ctx):
    save_failing_with(ctx, 28, "No space left on device")


@trigger("vllm-missing")
def _(ctx):
    ctx.monkeypatch.setitem(sys.modules, "vllm", None)  # as if it were not installed
    make_trainer(ctx.tmp_path, use_vllm=True)


@trigger("liger-missing")
def _(ctx):
    ctx.monkeypatch.setitem(sys.modules, "liger_kernel", None)  # as if it were not installed (it is not, on CPU)
    make_trainer(ctx.tmp_path, use_liger_kernel=True)


@trigger("liger-fused-head")
def _(ctx):
    make_trainer(ctx.tmp_path, use_liger_kernel=True, liger_kernel_config={"fused_linear_cross_entropy": True})


@trigger("vllm-dora")
def _(ctx):
    from peft import LoraConfig

    make_trainer(ctx.tmp_path, use_vllm=True, peft_config=LoraConfig(r=4, target_modules=["q_proj"], use_dora=True))


@trigger("vllm-lora-adapter")
def _(ctx):
    from peft import LoraConfig

    lora = LoraConfig(r=4, target_modules=["q_proj", "lm_head"])
    make_trainer(ctx.tmp_path, use_vllm=True, vllm_lora_sync="adapter", peft_config=lora)


@trigger("vllm-head-dim")
def _(ctx):
    fake_vllm(ctx, head_sizes=[32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512])
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    rloo(
        ctx,
        model=Qwen2ForCausalLM(config),
        processing_class=tokenizer,
        args=make_config(ctx.tmp_path, use_vllm=True, use_cpu=True),
    )


@trigger("untested-version")
def _(ctx):
    from steadyrl.compat import ALLOW_UNTESTED, require_tested

    fake_vllm(ctx, head_sizes=[32, 64], version="0.40.0")
    ctx.monkeypatch.delenv(ALLOW_UNTESTED, raising=False)
    require_tested.cache_clear()  # the check runs once per package and process
    try:
        make_trainer(ctx.tmp_path, use_vllm=True)
    finally:
        require_tested.cache_clear()


@trigger("output-dir-unwritable")
def _(ctx):
    (ctx.tmp_path / "file").write_text("")
    make_trainer(ctx.tmp_path / "file" / "out")


@trigger("output-dir-not-shared")
def _(ctx):
    """What each process of a run does, one after the other here: the main process marks output_dir, each process
    looks for the mark in its own view of it. tests/integration/distributed/test_multinode.py does it with two launched
    machines."""
    from steadyrl.checkpoint.shared_dir import create_marker, not_shared_error, view_of

    machines = [ctx.tmp_path / "machine-0", ctx.tmp_path / "machine-1"]
    for machine in machines:  # the same relative output_dir under each machine's working directory
        (machine / "out").mkdir(parents=True)
    ctx.monkeypatch.chdir(machines[0])
    marker = create_marker("out")
    views = [view_of("out", marker, 0)]
    ctx.monkeypatch.chdir(machines[1])
    views.append(view_of("out", marker, 1))
    raise not_shared_error("out", views)


@trigger("save-read-only")
def _(ctx):
    save_failing_with(ctx, 30, "Read-only file system")


@trigger("hub-unreachable")
def _(ctx):
    import socket

    import huggingface_hub.constants

    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx.monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    make_trainer(ctx.tmp_path / "out", push_to_hub=True, hub_model_id="someone/toy", hub_token="hf_x")


@trigger("hub-push-failed")
def _(ctx):
    import huggingface_hub.constants
    from support.hub_server import start

    hub, server = start()
    ctx.monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", hub.url)
    try:
        trainer = make_trainer(ctx.tmp_path / "out", push_to_hub=True, hub_model_id="someone/toy", hub_token="hf_x")
        hub.fail_next(1, 500)
        trainer.push_to_hub()
    finally:
        server.shutdown()


def fsdp_plugin(**kwargs):
    """accelerate's FSDP plugin as ``accelerate launch`` builds it from a config's ``fsdp_config``."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    return FullyShardedDataParallelPlugin(**kwargs)


@trigger("fsdp-version")
def _(ctx):
    from steadyrl.distributed.fsdp import check_fsdp_support

    check_fsdp_support(fsdp_plugin(fsdp_version=1), AutoModelForCausalLM.from_pretrained(toy_model_path()))


@trigger("fsdp-offload")
def _(ctx):
    from steadyrl.distributed.fsdp import check_fsdp_support

    plugin = fsdp_plugin(fsdp_version=2, cpu_offload=True)  # fsdp_offload_params: true
    check_fsdp_support(plugin, AutoModelForCausalLM.from_pretrained(toy_model_path()))


@pytest.mark.parametrize("row_id", trigger.row_ids())
def test_readme_error_table_row(row_id, tmp_path, request, monkeypatch, capsys):
    trigger.check(row_id, Context(tmp_path, request, monkeypatch, capsys))
