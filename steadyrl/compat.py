"""Every use steadyrl makes of private internals of DeepSpeed, transformers and vLLM, each with why it is needed.

These internals change without notice, so each accessor first checks that the package's installed version is one
steadyrl was tested with (``TESTED``, the same ranges as setup.cfg). Outside that range the first use raises
``UntestedVersionError``; with ``STEADYRL_ALLOW_UNTESTED_VERSIONS=1`` it logs a warning instead. A package is
checked only where its internals are used: DeepSpeed once a ZeRO optimizer or engine is at hand, transformers only
under ZeRO-3, vLLM only with ``use_vllm=True``, accelerate only when FSDP is launched on a machine without a GPU.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
from collections.abc import Iterator

import torch
from packaging.specifiers import SpecifierSet

logger = logging.getLogger(__name__)

TESTED = {
    "accelerate": ">=1.0,<1.16",
    "deepspeed": ">=0.15,<0.20",
    "transformers": ">=5.0,<5.20",
    "vllm": ">=0.10,<0.33",
}
ALLOW_UNTESTED = "STEADYRL_ALLOW_UNTESTED_VERSIONS"


class UntestedVersionError(RuntimeError):
    """An installed package is outside the versions whose private internals steadyrl was tested with."""


def installed_version(package: str) -> str:
    return getattr(importlib.import_module(package), "__version__", "unknown")


@functools.cache  # one check per package and process (an error is not cached: every use raises it again)
def require_tested(package: str) -> None:
    """Raise ``UntestedVersionError`` unless ``package``'s installed version is in ``TESTED`` (or warn, with
    STEADYRL_ALLOW_UNTESTED_VERSIONS=1)."""
    require_tested_version(package, installed_version(package), "is installed")


def require_tested_version(package: str, version: str, where: str) -> None:
    """``require_tested`` for a version of ``package`` found elsewhere (``where``: e.g. "runs the vLLM server")."""
    tested = TESTED[package]
    if SpecifierSet(tested).contains(version, prereleases=True):  # an unparsable version is not contained
        return
    problem = (
        f"steadyrl relies on private internals of {package} and was tested with {package}{tested}; "
        f"{package} {version} {where}, outside that range, and its internals may differ."
    )
    if os.environ.get(ALLOW_UNTESTED, "").lower() in ("1", "true", "yes"):
        logger.warning("%s Going on because %s is set.", problem, ALLOW_UNTESTED)
        return
    raise UntestedVersionError(
        f"{problem} Install a tested version ({package}{tested}), or set {ALLOW_UNTESTED}=1 to run anyway with "
        "a warning instead of this error."
    )


# ---- accelerate ----------------------------------------------------------------------------------------------


def enable_accelerate_fsdp(accelerator, plugin_args: dict | None = None) -> int | None:
    """The FSDP version of the run, or None without FSDP. FSDP comes from the launch (``ACCELERATE_USE_FSDP`` and
    ``FSDP_*``, which ``accelerate launch`` sets from a config with ``distributed_type: FSDP``) or from
    ``TrainingArguments.fsdp`` / ``fsdp_config``, whose plugin settings (``args.fsdp_plugin_args``) are
    ``plugin_args``.

    accelerate picks FSDP only for GPU-like process types: with ``use_cpu`` (gloo on CPU) its state says MULTI_CPU and
    the run would silently train as DDP. There the FSDP type and plugin are written into accelerate's shared state
    (``PartialState`` and ``AcceleratorState``), which is what ``Accelerator(fsdp_plugin=...)`` sets on a GPU."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType, FullyShardedDataParallelPlugin

    state = accelerator.state
    if state.distributed_type == DistributedType.FSDP:
        return state.fsdp_plugin.fsdp_version
    if plugin_args is None and os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return None
    if state.distributed_type != DistributedType.MULTI_CPU:  # one process: nothing to shard over
        return None
    require_tested("accelerate")
    plugin = FullyShardedDataParallelPlugin(**(plugin_args or {}))  # the one given to Accelerator is not kept here
    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["fsdp_plugin"] = plugin
    return plugin.fsdp_version


# ---- DeepSpeed ------------------------------------------------------------------------------------------------


def zero_optimizer(optimizer):
    """DeepSpeed's ZeRO optimizer (stage 1/2 or 3) inside accelerate's wrapper, or None. Recognised by the
    attributes that hold its fp32 master partitions, which checkpoints save instead of its pickled state_dict."""
    inner = getattr(optimizer, "optimizer", None)
    if not (hasattr(inner, "single_partition_of_fp32_groups") or hasattr(inner, "fp32_partitioned_groups_flat")):
        return None
    require_tested("deepspeed")
    return inner


def is_stage3(zero) -> bool:
    return hasattr(zero, "fp32_partitioned_groups_flat")


def fp32_partitions(zero) -> list[torch.Tensor]:
    """This process's fp32 master weights, one flat tensor per param group."""
    require_tested("deepspeed")
    return zero.fp32_partitioned_groups_flat if is_stage3(zero) else zero.single_partition_of_fp32_groups


def inner_optimizer_state(zero) -> dict:
    """The state_dict of the torch optimizer ZeRO steps. Stage 3 hands it its param groups only while it steps."""
    require_tested("deepspeed")
    if not is_stage3(zero):
        return zero.optimizer.state_dict()
    zero._set_fp32_optimizer_param_groups()
    try:
        return zero.optimizer.state_dict()
    finally:
        zero._clear_fp32_optimizer_param_groups()


def load_stage3_state(zero, inner_state: dict, partitions: list[torch.Tensor]) -> None:
    """Stage 3's own loader, given plain tensors instead of its pickled checkpoint: besides the inner optimizer and
    the fp32 partitions, it copies the partitions into the model's working parameters."""
    require_tested("deepspeed")
    from deepspeed.checkpoint.constants import FP32_FLAT_GROUPS, LOSS_SCALER, OPTIMIZER_STATE_DICT

    live = {LOSS_SCALER: zero.loss_scaler, "dynamic_loss_scale": zero.dynamic_loss_scale, "overflow": False}
    saved = {OPTIMIZER_STATE_DICT: inner_state, FP32_FLAT_GROUPS: partitions}
    zero._rigid_load_state_dict({**live, **saved}, load_optimizer_states=True)


LOSS_SCALER_FIELDS = ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")  # the dynamic ones


def loss_scaler_state(zero) -> dict:
    """The fp16 loss scaler's state as plain numbers: its scale and, for a dynamic one, the iterations since the last
    overflow and the hysteresis left (DeepSpeed's own checkpoint pickles the scaler object)."""
    require_tested("deepspeed")
    scaler = zero.loss_scaler
    return {name: getattr(scaler, name) for name in LOSS_SCALER_FIELDS if hasattr(scaler, name)}


def load_loss_scaler_state(zero, state: dict) -> None:
    """Put ``loss_scaler_state``'s numbers back into the live loss scaler."""
    require_tested("deepspeed")
    for name, value in state.items():
        setattr(zero.loss_scaler, name, value)


def advance_cpu_adam_bias_correction(optimizer, step: int) -> None:
    """Run DeepSpeedCPUAdam's C++ update for ``step`` on empty tensors: it advances the bias corrections, kept there
    as a running float32 product that no state_dict holds."""
    require_tested("deepspeed")
    group, empty = optimizer.param_groups[0], torch.empty(0)
    beta1, beta2 = group["betas"]
    optimizer.ds_opt_adam.adam_update(
        optimizer.opt_id,
        step,
        group["lr"],
        beta1,
        beta2,
        group["eps"],
        group["weight_decay"],
        group["bias_correction"],
        empty,
        empty,
        empty,
        empty,
    )


def zero3_partition(param: torch.nn.Parameter) -> tuple[torch.Tensor, int]:
    """This process's partition of a ZeRO-3 parameter, a flat tensor to read or write in place, and the index of its
    first element in the flattened parameter: DeepSpeed cuts each flattened parameter into equal slices, one per
    process of its partition group in rank order (the last padded), and keeps them as ``ds_tensor``."""
    require_tested("deepspeed")
    return param.ds_tensor, param.ds_zero_partition_rank * param.ds_tensor.ds_numel


@contextlib.contextmanager
def zero3_hooks_lifted(engine) -> Iterator[torch.nn.Module | None]:
    """Under ZeRO-3, the engine's module (else None) with DeepSpeed's per-module gather and release hooks removed
    for the block: those gather collectively, which would tie each process's forward passes to the others'.
    Afterwards the hooks are registered again and DeepSpeed's parameter coordinator starts a fresh trace."""
    offload = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
    if offload is None:
        yield None
        return
    require_tested("deepspeed")
    module = offload.module
    for param in module.parameters():
        param.ds_active_sub_modules.clear()
    for hook in offload.forward_hooks + offload.backward_hooks:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []
    try:
        yield module
    finally:
        coordinator = offload.param_coordinator
        if not coordinator.is_invalid_trace():  # the generation passes are not the recorded training trace
            coordinator._invalidate_trace()
        offload._register_deepspeed_module(module)


def zero3_trace_reset(engine) -> None:
    """Under ZeRO-3, make DeepSpeed's parameter coordinator record the next forward pass's module order afresh (the
    generation passes are not the training trace it prefetches by); nothing elsewhere."""
    offload = getattr(getattr(engine, "optimizer", None), "parameter_offload", None)
    if offload is not None and not offload.param_coordinator.is_invalid_trace():
        offload.param_coordinator._invalidate_trace()


def fsdp2_root_initialised(root: torch.nn.Module) -> None:
    """FSDP2 makes the first unit to run forward the root (``FSDPState._lazy_init``), and refuses a forward through
    a unit inside the root before the root's own first one. Under PEFT the root is the ``PeftModel``, whose
    ``generate`` runs the base model's forward: the root is initialised first. torch has no public call for it."""
    root._get_fsdp_state()._lazy_init()


# ---- transformers ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def zero3_init_suspended() -> Iterator[None]:
    """Models created in the block are whole, where transformers would partition them with ``deepspeed.zero.Init``
    as it loads them. transformers can drop the config that turns this on (``unset_hf_deepspeed_config``) but has
    no public way to get it back: the block restores its private weak reference to the very same object."""
    from transformers.integrations import deepspeed as hf_deepspeed

    if not hf_deepspeed.is_deepspeed_zero3_enabled():
        yield
        return
    require_tested("transformers")
    saved = hf_deepspeed._hf_deepspeed_config_weak_ref
    hf_deepspeed.unset_hf_deepspeed_config()
    try:
        yield
    finally:
        hf_deepspeed._hf_deepspeed_config_weak_ref = saved


@contextlib.contextmanager
def zero3_created_unfilled() -> Iterator[None]:
    """Under ZeRO-3, models created in the block are partitioned (``deepspeed.zero.Init``, as transformers'
    ``from_config`` does) but not initialised: transformers would gather every module once to draw weights that the
    caller overwrites anyway. Its private flag ``set_zero3_state`` keeps ``from_config`` from opening a second
    zero.Init and initialising."""
    from transformers import initialization
    from transformers import modeling_utils as hf_modeling
    from transformers.integrations import deepspeed as hf_deepspeed

    if not hf_deepspeed.is_deepspeed_zero3_enabled():
        yield
        return
    require_tested("transformers")
    require_tested("deepspeed")
    import deepspeed

    class UnfilledInit(deepspeed.zero.Init):
        def _zero_init_param(self, param):
            # zero.Init broadcasts each new parameter from the main process before partitioning it, so that every
            # process holds the same random weights; weights not drawn need no broadcast, and receiving it would
            # make each other process write a whole copy of every parameter in turn.
            self._convert_to_deepspeed_param(param)
            param.partition()

    with initialization.no_init_weights(), UnfilledInit(config_dict_or_path=hf_deepspeed.deepspeed_config()):
        with hf_modeling.set_zero3_state():
            yield


# ---- vLLM -----------------------------------------------------------------------------------------------------


def cpu_attention_head_sizes() -> list[int]:
    """The head sizes vLLM's CPU attention kernels support: refusing others before training beats a crash later."""
    require_tested("vllm")
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    return CPUAttentionBackend.get_supported_head_sizes()


def reload_weights(llm, weights: list[tuple[str, torch.Tensor]]) -> None:
    """Replace the engine's weights in place through its workers' ``reload_weights``; the model's own
    ``load_weights`` fails on CPU (``'Parameter' object has no attribute 'weight_loader'``)."""
    require_tested("vllm")
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})


def shutdown(llm) -> None:
    """Stop the engine's core and free what it holds now: ``LLM`` has no public way to close it."""
    require_tested("vllm")
    engine_core = getattr(llm.llm_engine, "engine_core", None)
    if hasattr(engine_core, "shutdown"):
        engine_core.shutdown()
