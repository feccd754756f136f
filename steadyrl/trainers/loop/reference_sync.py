"""TR-DPO's reference syncing, as TRL's ``SyncRefModelCallback``: after every global step that is a multiple of
``ref_model_sync_steps``, the reference moves towards the policy, parameter by parameter::

    ref = ref_model_mixup_alpha x policy + (1 - ref_model_mixup_alpha) x ref

(TRL's ``ref.mul_(1 - alpha).add_(policy, alpha=alpha)``). The reference then changes during the run, so its weights
are part of every checkpoint. Under DeepSpeed ZeRO-3 both models are partitioned: each module's own parameters are
gathered, the main process mixes them and its result is partitioned to every process.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ...distributed.zero import gathered


def check_reference_sync(sync_ref_model: bool, ref_model: torch.nn.Module | None, peft: bool) -> None:
    """Refuse ``sync_ref_model=True`` when the run has no reference model of its own to update."""
    if not sync_ref_model or ref_model is not None:
        return
    if peft:
        raise ValueError(
            "sync_ref_model=True is not supported with peft_config: under PEFT the reference is the base model with "
            "its adapters disabled, not a model of its own, so it cannot move towards the policy without moving the "
            "policy too. Set sync_ref_model=False, or train without peft_config (the reference is then a copy of "
            "the model)."
        )
    raise ValueError(
        "sync_ref_model=True needs a reference model to update, and with beta=0 the run has no KL term and keeps no "
        "reference. Set beta > 0, or sync_ref_model=False."
    )


def sync_due(args, global_step: int) -> bool:
    """Whether the reference is mixed with the policy after ``global_step`` (TRL's condition)."""
    return args.sync_ref_model and global_step % args.ref_model_sync_steps == 0


def parameter_pairs(policy: torch.nn.Module, reference: torch.nn.Module) -> Iterator[list[tuple]]:
    """For each module, the ``(policy, reference)`` parameters it holds itself, a shared (tied) parameter once. The
    reference is a copy of the policy: the two must have the same modules and parameter names."""
    seen: set[int] = set()
    modules = zip(policy.named_modules(), reference.named_modules(), strict=True)
    for (name, module), (ref_name, ref_module) in modules:
        own = zip(module.named_parameters(recurse=False), ref_module.named_parameters(recurse=False), strict=True)
        pairs = []
        for (param_name, param), (ref_param_name, ref_param) in own:
            if (name, param_name) != (ref_name, ref_param_name):
                raise RuntimeError(
                    f"the reference does not mirror the policy: {ref_name}.{ref_param_name} faces {name}.{param_name}"
                )
            if id(ref_param) not in seen:
                seen.add(id(ref_param))
                pairs.append((param, ref_param))
        if pairs:
            yield pairs


def counterparts(param: torch.Tensor, ref_param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(what to mix in, what to mix into)`` for one actor parameter and its reference parameter under FSDP2:
    both sharded alike (each parameter's rows split the same way over the processes), each process mixes its own
    rows; a whole reference (given as a model object, or with ``ref_reward_offload``) mixes in the whole actor
    parameter, gathered (every process calls it, in the same order). Other tensors as they are."""
    from torch.distributed.tensor import DTensor

    if isinstance(ref_param, DTensor):
        return param.to_local(), ref_param.to_local()
    return (param.full_tensor() if isinstance(param, DTensor) else param), ref_param


@torch.no_grad()
def mix_into_reference(policy: torch.nn.Module, reference: torch.nn.Module, alpha: float, main: bool) -> None:
    """``reference = alpha x policy + (1 - alpha) x reference`` in place, wherever each model lives (the reference
    may wait in CPU memory). Every process calls it; under ZeRO-3 the main process computes and the others receive
    its result."""
    for pairs in parameter_pairs(policy, reference):
        params, ref_params = [p for p, _ in pairs], [r for _, r in pairs]
        with gathered(params), gathered(ref_params, modify=True) as partitioned:
            if main or not partitioned:
                for param, ref_param in pairs:
                    value, into = counterparts(param, ref_param)
                    into.mul_(1.0 - alpha).add_(value.to(into.device), alpha=alpha)
