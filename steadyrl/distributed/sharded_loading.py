"""Loading models under FSDP2 without a whole copy on every process.

- A trained model (the actor, PPO's critic) is read by the main process only; the others create it with
  uninitialised parameters (memory the system has not handed out yet) and accelerate's ``prepare`` broadcasts the
  main process's weights into every process's shards (its ``cpu_ram_efficient_loading``, which ``mark_loaded_on_main``
  switches on). Until then only the main process holds its weights: ``on_main_only`` models have their weight
  digests taken there.
- A frozen model (the reference, reward models) is created on the meta device, sharded with ``fully_shard`` (one
  unit per decoder layer, forward only) and each process reads only its own rows of every tensor from the
  safetensors files.

Under DeepSpeed ZeRO-3 transformers partitions models as it loads them (``deepspeed.zero.Init``); nothing here is
needed there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, GenerationConfig, PreTrainedModel
from transformers.integrations import is_deepspeed_zero3_enabled

from .. import compat

LOADED_ON_MAIN = "_steadyrl_loaded_on_main"  # set on models whose weights only the main process holds until prepare


def fsdp2_split_loading(args) -> bool:
    """Whether this run shards its models with FSDP2 over several processes, read from the launch (``accelerate
    launch`` with ``fsdp_version: 2``) or ``TrainingArguments.fsdp`` before any accelerator exists. With parameter
    offload (refused later) or FSDP1, models are loaded whole as before."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() == 1:
        return False
    plugin_args = getattr(args, "fsdp_plugin_args", None)
    if plugin_args is not None:
        return int(plugin_args.get("fsdp_version", 1)) == 2 and not plugin_args.get("cpu_offload")
    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() != "true":
        return False
    offload = os.environ.get("FSDP_OFFLOAD_PARAMS", "false").lower() == "true"
    return os.environ.get("FSDP_VERSION", "1") == "2" and not offload


def is_main_process() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def on_main_only(model: torch.nn.Module) -> bool:
    """Whether only the main process holds ``model``'s weights (the others hold uninitialised memory)."""
    return bool(getattr(model, LOADED_ON_MAIN, False))


def mark_loaded_on_main(model: torch.nn.Module) -> None:
    setattr(model, LOADED_ON_MAIN, True)


def _dtype(init_kwargs: dict, config) -> torch.dtype:
    dtype = init_kwargs.get("dtype")
    if isinstance(dtype, torch.dtype):
        return dtype
    return getattr(config, "dtype", None) or torch.float32  # "auto" or unset: the checkpoint's


def _skeleton(model_class, path: str, init_kwargs: dict, **config_overrides) -> PreTrainedModel:
    """``model_class`` of ``path``'s config, its parameters on the meta device (buffers real)."""
    from accelerate import init_empty_weights

    trust = init_kwargs.get("trust_remote_code", False)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust, **config_overrides)
    extra = {k: init_kwargs[k] for k in ("attn_implementation",) if k in init_kwargs}
    with init_empty_weights(include_buffers=False):
        model = model_class.from_config(config, dtype=_dtype(init_kwargs, config), trust_remote_code=trust, **extra)
    model.tie_weights()  # transformers ties them as it loads weights, which a skeleton never does
    return model


def load_trained_on_main(model_class, path: str, init_kwargs: dict, **config_overrides) -> PreTrainedModel:
    """``model_class.from_pretrained(path)`` on the main process; on the others the same model with uninitialised
    parameters, which accelerate's ``prepare`` fills from the main process's."""
    files = _safetensors_files(path)
    model = _skeleton(model_class, path, init_kwargs, **config_overrides)
    materialize_uninitialised(model)
    # the main process reads one tensor at a time, the file mapped only meanwhile; from_pretrained keeps it mapped
    main = is_main_process()
    missing = load_split_weights(model, files)[0] - tied_parameter_names(model) if main and files else set()
    if main and (files is None or missing):
        model = model_class.from_pretrained(path, **config_overrides, **init_kwargs)
    try:
        model.generation_config = GenerationConfig.from_pretrained(path)
    except (OSError, AttributeError):
        pass
    mark_loaded_on_main(model)
    return model.eval()


def uninitialised(create) -> torch.nn.Module:
    """The model ``create()`` makes, with parameters in memory never written (``materialize_uninitialised``)."""
    from accelerate import init_empty_weights

    with init_empty_weights(include_buffers=False):
        model = create()
    if hasattr(model, "tie_weights"):
        model.tie_weights()
    materialize_uninitialised(model)
    return model


def materialize_uninitialised(model: torch.nn.Module) -> None:
    """Give every meta parameter CPU memory without writing it (tied parameters stay one): untouched pages cost no
    resident memory, and each parameter keeps a distinct address (accelerate maps optimizer parameters by it)."""
    replaced: dict[int, torch.nn.Parameter] = {}
    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is None or not param.is_meta:
                continue
            if id(param) not in replaced:
                replaced[id(param)] = torch.nn.Parameter(torch.empty_like(param, device="cpu"), param.requires_grad)
            module._parameters[name] = replaced[id(param)]


def file_of_key(files: list[Path]) -> dict[str, Path]:
    """Which of the safetensors ``files`` holds each tensor."""
    where = {}
    for file in files:
        with safe_open(str(file), framework="pt") as handle:
            where.update(dict.fromkeys(handle.keys(), file))
    return where


def _safetensors_files(path: str) -> list[Path] | None:
    directory = Path(path)
    if not directory.is_dir():
        return None
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        return [directory / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    single = directory / "model.safetensors"
    return [single] if single.is_file() else None


def shard_frozen(model: PreTrainedModel) -> None:
    """``fully_shard`` a frozen transformers model for forward passes: one unit per decoder layer, and the rest of
    its backbone and its head each a root of its own when a scalar head is called apart from the backbone (as
    ``scalar_head.token_scores`` does), else the whole model the root."""
    from torch.distributed.fsdp import fully_shard

    layer_names = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if type(module).__name__ in layer_names:
            fully_shard(module)
    if isinstance(getattr(model, "score", None), torch.nn.Linear):
        fully_shard(getattr(model, model.base_model_prefix))
        fully_shard(model.score)
    else:
        fully_shard(model)


def _local_rows(rows: int, rank: int, world: int) -> slice:
    chunk = -(-rows // world)  # torch.chunk's split, which Shard(0) follows
    start = min(rank * chunk, rows)
    return slice(start, min(start + chunk, rows))


def local_part(tensor: torch.Tensor) -> tuple[torch.Tensor, int] | None:
    """The part of ``tensor`` this process holds as a flat tensor (to read, or write in place) and the index of its
    first element in the flattened whole: a ZeRO-3 partition, or an FSDP2 shard's rows; None for a whole tensor."""
    if hasattr(tensor, "ds_tensor"):
        return compat.zero3_partition(tensor)
    if hasattr(tensor, "device_mesh"):
        rows = _local_rows(tensor.shape[0], tensor.device_mesh.get_local_rank(), tensor.device_mesh.size())
        return tensor.to_local().view(-1), rows.start * (tensor.numel() // max(tensor.shape[0], 1))
    return None


def read_rows(file: Path, key: str, rows: slice | None = None) -> torch.Tensor:
    """Tensor ``key`` of a safetensors file (only ``rows`` of it), the file mapped only while it is read: pages of a
    mapping still open count in the process's resident memory, a whole model's worth by the end of a load."""
    with safe_open(str(file), framework="pt") as handle:
        return handle.get_tensor(key) if rows is None else handle.get_slice(key)[rows.start : rows.stop]


def read_flat_range(file: Path, key: str, shape: torch.Size, start: int, count: int) -> torch.Tensor:
    """Elements ``start .. start + count`` of the flattened tensor ``key`` of a safetensors file, reading only the
    rows that hold them."""
    if len(shape) == 0:
        return read_rows(file, key).reshape(-1)[start : start + count]
    row = shape[1:].numel() if len(shape) > 1 else 1
    first, last = start // row, -(-(start + count) // row)
    rows = read_rows(file, key, slice(first, last)).reshape(-1)
    return rows[start - first * row : start - first * row + count]


@torch.no_grad()
def load_frozen_sharded(model_class, path: str, init_kwargs: dict, **config_overrides) -> PreTrainedModel | None:
    """``model_class`` of ``path`` sharded with ``shard_frozen``, each process reading only its own rows of each
    tensor; None where ``path`` is not a local directory of safetensors files holding every parameter by name."""
    from torch.distributed.tensor import DTensor

    files = _safetensors_files(path)
    if files is None:
        return None
    model = _skeleton(model_class, path, init_kwargs, **config_overrides)
    where = file_of_key(files)
    prefix = model.base_model_prefix + "."
    names = [name for name, _ in model.named_parameters()]
    keys = {name: name if name in where else name.removeprefix(prefix) for name in names}
    if any(key not in where for key in keys.values()):
        return None
    shard_frozen(model)
    state = {}
    for name, param in model.named_parameters():
        rank, world = param.device_mesh.get_local_rank(), param.device_mesh.size()
        rows = _local_rows(param.shape[0], rank, world)
        local = read_rows(where[keys[name]], keys[name], rows).to(param.dtype)
        local = local.to(param.device_mesh.device_type)
        state[name] = DTensor.from_local(
            local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
        )
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    return model.eval().requires_grad_(False)


def load_split(model_class, path: str, init_kwargs: dict, args, frozen: bool, **config_overrides) -> PreTrainedModel:
    """``model_class.from_pretrained(path)``, split over the processes where the run shards its models: under ZeRO-3
    transformers partitions it as it loads it; under FSDP2 a ``frozen`` model is sharded as it is read
    (``load_frozen_sharded``; whole with ``ref_reward_offload``, which keeps it in CPU memory) and a trained one is
    read by the main process (``load_trained_on_main``)."""
    if is_deepspeed_zero3_enabled():
        model = load_partitioned(model_class, path, init_kwargs, **config_overrides)
        if model is not None:
            return model
    elif args is not None and fsdp2_split_loading(args):
        if not frozen:
            return load_trained_on_main(model_class, path, init_kwargs, **config_overrides)
        if not args.ref_reward_offload:
            model = load_frozen_sharded(model_class, path, init_kwargs, **config_overrides)
            if model is not None:
                return model
    return model_class.from_pretrained(path, **config_overrides, **init_kwargs)


def load_partitioned(model_class, path: str, init_kwargs: dict, **config_overrides) -> PreTrainedModel | None:
    """``model_class`` of ``path`` created partitioned (transformers' ``deepspeed.zero.Init`` under ZeRO-3) and filled
    one module at a time by ``load_split_weights``: transformers' own loading reads the whole checkpoint into every
    process's memory first. None where ``path`` is not a local directory of safetensors files holding every
    parameter by name (transformers then loads it)."""
    files = _safetensors_files(path)
    if files is None:
        return None
    trust = init_kwargs.get("trust_remote_code", False)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust, **config_overrides)
    extra = {k: init_kwargs[k] for k in ("attn_implementation",) if k in init_kwargs}
    with compat.zero3_created_unfilled():  # its weights are read in: no initialisation
        model = model_class.from_config(config, dtype=_dtype(init_kwargs, config), trust_remote_code=trust, **extra)
    model.tie_weights()  # transformers ties them as it loads weights, which this model never does
    names = set(file_of_key(files))
    prefix = model.base_model_prefix + "."
    tied = tied_parameter_names(model)
    params = [name for name, _ in model.named_parameters(remove_duplicate=False) if name not in tied]
    strip = not any(name in names for name in params) and any(n.removeprefix(prefix) in names for n in params)
    source_key = (lambda name: name.removeprefix(prefix)) if strip else None
    missing, _ = load_split_weights(model, files, source_key)
    if missing - {source_key(n) if source_key else n for n in tied}:
        return None
    try:
        model.generation_config = GenerationConfig.from_pretrained(path)
    except (OSError, AttributeError):
        pass
    return model.eval()


def tied_parameter_names(model: torch.nn.Module) -> set[str]:
    """The names under which a parameter appears a second time (a tied output embedding)."""
    seen, tied = set(), set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.add(id(param))
    return tied


def unloaded(model: torch.nn.Module, missing) -> set[str]:
    """The ``missing`` names none of whose tied aliases (names of the same parameter) was loaded: a tied output
    embedding is loaded with its input embedding, whichever of the two names the file holds."""
    groups: dict[int, set[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), set()).add(name)
    alias = {name: group for group in groups.values() for name in group}
    missing = set(missing)
    return {name for name in missing if alias.get(name, {name}) <= missing}


@torch.no_grad()
def trained_copy_on_main(model: PreTrainedModel) -> PreTrainedModel:
    """A copy of an FSDP2-sharded frozen ``model`` to train, held by the main process (``load_trained_on_main``'s
    way): every tensor is gathered in turn, and only the main process keeps it."""
    config = model.config
    with torch.random.fork_rng():  # the throwaway initialisation must not move the run's random stream
        if is_main_process():
            twin = type(model)._from_config(config, dtype=model.dtype)
        else:
            twin = uninitialised(lambda: type(model)._from_config(config, dtype=model.dtype))
    targets = dict(twin.named_parameters())
    for name, param in model.named_parameters():
        whole = param.full_tensor() if hasattr(param, "full_tensor") else param
        if is_main_process():
            targets[name].copy_(whole)
    mark_loaded_on_main(twin)
    return twin


def broadcast_from_main(text: str) -> str:
    """The main process's ``text`` on every process."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return text
    box = [text if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]


@torch.no_grad()
def load_split_weights(model: torch.nn.Module, files: list[Path], source_key=None) -> tuple[set[str], set[str]]:
    """Load the safetensors ``files`` into a ZeRO-3 partitioned or FSDP2 sharded ``model`` with no whole copy and no
    communication: each process reads only the elements of its own partition or shard of every parameter (the rows
    holding them). ``source_key`` maps the model's names to the files' (default: the same). Returns the file names
    the model's tensors look for and do not find, and those the files hold beyond them."""
    where = file_of_key(files)
    file_key = source_key or (lambda name: name)
    expected: set[str] = set()
    for prefix, module in model.named_modules():
        params = [
            (file_key(f"{prefix}.{name}" if prefix else name), p) for name, p in module.named_parameters(recurse=False)
        ]
        buffers = [
            (file_key(f"{prefix}.{name}" if prefix else name), b)
            for name, b in module.named_buffers(recurse=False)
            if name not in module._non_persistent_buffers_set
        ]
        expected.update(key for key, _ in params + buffers)
        for key, param in params:
            if key not in where:
                continue
            part = local_part(param)
            if part is None:
                param.copy_(read_rows(where[key], key))
                continue
            local, start = part
            shape = param.ds_shape if hasattr(param, "ds_shape") else param.shape
            count = max(0, min(local.numel(), shape.numel() - start))  # a ZeRO-3 partition's tail is padding
            local[:count].copy_(read_flat_range(where[key], key, shape, start, count))
        for key, buffer in buffers:
            if key in where:
                buffer.copy_(read_rows(where[key], key))
    return expected - set(where), set(where) - expected
