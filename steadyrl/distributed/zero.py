"""DeepSpeed ZeRO pieces the on-policy loop needs: optimizer state as plain tensors, whole weights under ZeRO-3,
frozen models as inference engines, and generation with gathered parameters.

Optimizer state: under ZeRO each process holds the AdamW moments and fp32 master weights of its own partition
of the parameters. DeepSpeed's ``state_dict`` pickles its own classes (loss scaler, enums, slice mappings); this
module saves only what resuming needs — the inner torch optimizer's state, the fp32 partitions and the fp16 loss
scaler's numbers — and puts them back into the live optimizer of the same layout (same processes, same model, which
the run's fingerprint guarantees). Loaded with ``weights_only=True``.

Every private DeepSpeed or transformers internal used here is reached through ``steadyrl.compat``.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch

from .. import compat
from ..compat import zero_optimizer


def bind_scheduler(scheduler, optimizer) -> None:
    """Point ``scheduler`` at the torch optimizer DeepSpeed actually steps. With optimizer offload, accelerate
    replaces the client optimizer by a DeepSpeedCPUAdam sharing its param-group dicts; loading a checkpoint gives
    that optimizer new dicts, and a scheduler left on the client optimizer would stop changing the learning rate."""
    zero = zero_optimizer(optimizer)
    if zero is not None:
        scheduler.optimizer = zero.optimizer


def zero_state(optimizer) -> dict:
    """This process's optimizer state as plain tensors: the inner torch optimizer's and the fp32 partitions."""
    zero = zero_optimizer(optimizer)
    base = compat.inner_optimizer_state(zero)
    partitions = [p.detach().clone() for p in compat.fp32_partitions(zero)]
    return {"base_optimizer": base, "fp32_partitions": partitions, "loss_scaler": compat.loss_scaler_state(zero)}


@torch.no_grad()
def load_zero_state(optimizer, state: dict) -> None:
    """Put ``zero_state``'s tensors back into the live optimizer of the same layout."""
    zero = zero_optimizer(optimizer)
    if compat.is_stage3(zero):
        compat.load_stage3_state(zero, state["base_optimizer"], state["fp32_partitions"])
        replay_cpu_adam_steps(zero.optimizer)
    else:
        zero.optimizer.load_state_dict(state["base_optimizer"])
        for live, saved in zip(compat.fp32_partitions(zero), state["fp32_partitions"], strict=True):
            live.copy_(saved)
    compat.load_loss_scaler_state(zero, state.get("loss_scaler", {}))  # absent from older steadyrl's checkpoints


def replay_cpu_adam_steps(optimizer) -> None:
    """Offloaded optimizers are DeepSpeedCPUAdam, whose C++ side keeps the bias corrections beta^t as a running
    float32 product that no state_dict holds. A restored optimizer would compute pow(beta, t) instead, which
    differs in the last bits; replaying its steps on empty tensors rebuilds the very same product."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    if not isinstance(optimizer, DeepSpeedCPUAdam):
        return
    steps = {int(state["step"]) for state in optimizer.state.values() if "step" in state}
    for step in range(1, max(steps, default=0) + 1):
        compat.advance_cpu_adam_bias_correction(optimizer, step)


# ---- ZeRO-3: parameters partitioned over the processes --------------------------------------------------------


def is_partitioned(model: torch.nn.Module) -> bool:
    """Whether ``model``'s parameters are ZeRO-3 partitions (``deepspeed.zero.Init`` or a stage-3 engine)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


@contextlib.contextmanager
def whole_at_load() -> Iterator[None]:
    """Models created in the block are whole, even where transformers would partition them as it creates them
    (accelerate's ``zero3_init_flag``): copies of a whole model given as an object are whole like it."""
    with compat.zero3_init_suspended():
        yield


def check_whole(model: torch.nn.Module, argument: str) -> None:
    """Refuse a model object that ``deepspeed.zero.Init`` partitioned when the run does not partition its models as
    it loads them (no ZeRO-3 with ``zero3_init_flag``): its parameters would hold no weights."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if is_partitioned(model) and not is_deepspeed_zero3_enabled():
        raise ValueError(
            f"{argument} was partitioned by DeepSpeed ZeRO-3 (deepspeed.zero.Init), but this run does not partition "
            "models as it loads them, so its parameters hold no weights here: run it under ZeRO-3 with "
            "zero3_init_flag: true (examples/accelerate_configs/zero3.yaml), or pass the model's path or a whole model."
        )


def same_kind_of_model(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """Models created in the block are partitioned and left unfilled if ``model`` is partitioned (their weights are
    to be copied in), whole if it is whole."""
    return compat.zero3_created_unfilled() if is_partitioned(model) else whole_at_load()


@torch.no_grad()
def copy_weights(source: torch.nn.Module, target: torch.nn.Module, source_name=lambda name: name) -> None:
    """Copy each parameter of ``source`` into ``target``'s of the same name (``source_name`` maps source names).
    Between two ZeRO-3 partitioned parameters each process copies its own partition (the same elements on both
    sides), so nothing is gathered; otherwise one module of ``target`` at a time is gathered whole. Every process
    must call it."""
    sources = {source_name(name): param for name, param in source.named_parameters()}
    for prefix, module in target.named_modules():
        pairs = [
            (param, sources[key])
            for name, param in module.named_parameters(recurse=False)
            if (key := f"{prefix}.{name}" if prefix else name) in sources
        ]
        alike = [(t, s) for t, s in pairs if hasattr(t, "ds_tensor") and getattr(s, "ds_numel", -1) == t.ds_numel]
        for into, value in alike:  # partitions of parameters of the same size hold the same elements
            compat.zero3_partition(into)[0].copy_(compat.zero3_partition(value)[0])
        pairs = [(t, s) for t, s in pairs if not (hasattr(t, "ds_tensor") and getattr(s, "ds_numel", -1) == t.ds_numel)]
        if not pairs:
            continue
        with gathered([s for _, s in pairs]), gathered([t for t, _ in pairs], modify=True):
            for into, value in pairs:
                into.copy_(value)


def copy_model(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of a transformers ``model``. Of a ZeRO-3 partitioned model a partitioned one, created and filled one
    module at a time (``copy_weights``), so that no process holds either whole; else ``copy.deepcopy``."""
    if not is_partitioned(model):
        return copy.deepcopy(model)
    with compat.zero3_created_unfilled():  # its weights are copied in: no initialisation
        twin = type(model)._from_config(copy.deepcopy(model.config), dtype=model.dtype)
    twin.tie_weights()  # transformers ties them as it loads weights, which this model never does
    copy_weights(model, twin)
    if getattr(model, "generation_config", None) is not None:
        twin.generation_config = copy.deepcopy(model.generation_config)
    return twin


@torch.no_grad()
def consolidated_state_dict(module: torch.nn.Module, main: bool) -> dict[str, torch.Tensor] | None:
    """The whole weights of a ZeRO-3 partitioned ``module``, one layer gathered at a time; every process must
    call it, the main one gets the state dict (CPU copies), the others None."""
    import deepspeed

    state = {} if main else None
    seen: dict[int, str] = {}  # ds_id -> first name: tied weights stay one tensor

    def visit(module: torch.nn.Module, prefix: str) -> None:
        params = list(module.parameters(recurse=False))
        with deepspeed.zero.GatheredParameters(params, modifier_rank=0):
            if main:
                for name, param in module.named_parameters(recurse=False):
                    key = prefix + name
                    if param.ds_id in seen:
                        state[key] = state[seen[param.ds_id]]
                    else:
                        state[key], seen[param.ds_id] = param.detach().to("cpu", copy=True), key
                for name, buffer in module.named_buffers(recurse=False):
                    if name not in module._non_persistent_buffers_set:
                        state[prefix + name] = buffer.detach().to("cpu", copy=True)
        for name, child in module.named_children():
            visit(child, f"{prefix}{name}.")

    visit(module, "")
    return state


@contextlib.contextmanager
def modifiable(model: torch.nn.Module) -> Iterator[None]:
    """Let the block write ``model``'s weights: under ZeRO-3 whole parameters, and the main process's writes are
    partitioned to every process at the end. Without partitioned parameters, nothing."""
    if not is_partitioned(model):
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(model.parameters()), modifier_rank=0):
        yield


@contextlib.contextmanager
def gathered(params: list[torch.nn.Parameter], modify: bool = False) -> Iterator[bool]:
    """Whole ``params`` on every process for the block, if ZeRO-3 partitions them (the block gets whether it does);
    with ``modify``, the main process's writes are partitioned to every process at the end."""
    if not any(hasattr(p, "ds_id") for p in params):
        yield False
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=0 if modify else None):
        yield True


@contextlib.contextmanager
def zero3_generation(engine, gather: bool = True) -> Iterator[None]:
    """The block in which HF generate runs under ZeRO-3 (nothing to do elsewhere): with ``gather`` the whole actor
    gathered (``gathered_for_generation``); without, partitioned as it trains, each module gathered by DeepSpeed's
    hooks for each forward pass, and the training passes' recorded module order started afresh afterwards."""
    if gather:
        with gathered_for_generation(engine):
            yield
        return
    try:
        yield
    finally:
        compat.zero3_trace_reset(engine)


@contextlib.contextmanager
def gathered_for_generation(engine) -> Iterator[None]:
    """Under ZeRO-3, the whole actor on every process for the block, with DeepSpeed's per-module gather and
    release hooks lifted, so that ``generate`` runs as many forward passes on each process as its own
    completions need. Costs one whole copy of the actor per process while it lasts."""
    with compat.zero3_hooks_lifted(engine) as module:
        if module is None:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters())):
            yield


def inference_engine(model: torch.nn.Module, deepspeed_config: dict, offload: bool) -> torch.nn.Module:
    """A frozen model partitioned like the trained ones under ZeRO-3: each process keeps 1/N of its weights
    (in CPU memory with ``offload``) and gathers one layer at a time in the forward pass."""
    import deepspeed

    config = copy.deepcopy(deepspeed_config)
    config.pop("optimizer", None)
    config.pop("scheduler", None)
    zero = config["zero_optimization"]
    zero.pop("offload_optimizer", None)  # no optimizer
    zero["offload_param"] = {"device": "cpu", "pin_memory": True} if offload else {"device": "none"}
    engine, *_ = deepspeed.initialize(model=model, config=config)
    engine.eval()  # DeepSpeedEngine.eval returns None
    return engine
