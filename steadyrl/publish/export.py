"""Write the actor of a steadyrl checkpoint as a plain Hugging Face model, with no GPU and no distributed launch."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import torch

from ..checkpoint import CheckpointError, verify_checkpoint
from ..checkpoint.layout import ACTOR, WEIGHTS_INDEX_NAME, WEIGHTS_NAME, actor_files, model_dir
from ..distributed.zero import whole_at_load
from ..generation.weights import plain_state_dict


def checkpoint_actor(checkpoint: Path, manifest: dict) -> tuple[Path, list[str]]:
    """The actor's directory in a verified steadyrl checkpoint (its top level, or actor/ in one of an earlier version)
    and the files its manifest lists there to export or push, relative to it: what ``save_model`` writes, without the
    index of a one-file model that the checkpoint keeps for vLLM (layout.index_single_file). None is an error, and so
    is a plain transformers.Trainer checkpoint (its model is no steadyrl actor: it loads with ``from_pretrained``)."""
    layout = manifest.get("layout", "steadyrl")
    names = actor_files(manifest["files"]) if layout == "steadyrl" else []
    if WEIGHTS_NAME in names:
        names = [name for name in names if name != WEIGHTS_INDEX_NAME]
    if not names:
        raise CheckpointError(
            f"{checkpoint} has no actor: its manifest ({layout} layout) lists no actor file to export or push."
        )
    return model_dir(checkpoint, ACTOR), names


def regular_files(directory: Path) -> list[str]:
    """The regular files directly in a saved actor directory (no manifest): never a symlink or what it points to."""
    with os.scandir(directory) as entries:
        return sorted(entry.name for entry in entries if entry.is_file(follow_symlinks=False))


def copy_files(source: Path, names: Iterable[str], out: Path) -> None:
    """Copy ``source/name`` to ``out/name`` for each name (a regular file, checked by the caller)."""
    for name in names:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / name, out / name, follow_symlinks=False)


def export_actor(checkpoint: str | Path, output_dir: str | Path) -> Path:
    """Copy (or, for a LoRA checkpoint, merge) the actor of ``checkpoint`` into ``output_dir``.

    The checkpoint is verified against its manifest first, and only the actor's files it lists are copied (never
    the optimizer, the state files or another model's); the output holds safetensors weights, the config, the
    generation config and the tokenizer, and loads with ``AutoModelForCausalLM`` and vLLM.
    """
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    if not (checkpoint / "manifest.json").is_file() and any(checkpoint.glob("checkpoint-*")):
        newest = max(checkpoint.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        raise CheckpointError(f"{checkpoint} is an output directory, not a checkpoint: give one, e.g. {newest}.")
    manifest = verify_checkpoint(checkpoint)
    actor, files = checkpoint_actor(checkpoint, manifest)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"{output_dir} exists and is not empty: choose a new directory for the export.")
    output_dir.mkdir(parents=True, exist_ok=True)
    if (actor / "adapter_config.json").is_file():
        merge_adapter(actor, output_dir)
    else:
        copy_files(actor, files, output_dir)
    return output_dir


def merge_adapter(actor: Path, output_dir: Path) -> None:
    """A LoRA actor: its base model (as named in adapter_config.json) with the adapter merged in. Loading it
    initialises LoRA weights from the global RNG, which is put back as it was: a run that pushes stays
    reproducible."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    with rng_untouched(), whole_at_load():  # under ZeRO-3 (zero3_init_flag) only this process loads it
        model = AutoPeftModelForCausalLM.from_pretrained(actor)
    model.merge_and_unload().save_pretrained(output_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(actor).save_pretrained(output_dir)


@contextlib.contextmanager
def rng_untouched() -> Iterator[None]:
    """Python's, NumPy's, torch's and this process's CUDA device's global RNG are as they were after the block."""
    python_state, numpy_state = random.getstate(), np.random.get_state()
    cuda = [torch.cuda.current_device()] if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)


def merges_live(model: torch.nn.Module) -> bool:
    """``model`` is a PEFT model whose adapters ``merged_lora_weights`` merges: plain LoRA (no DoRA or other variant,
    no LoRA bias), with at most ``modules_to_save`` besides."""
    if not hasattr(model, "peft_config"):
        return False
    from peft.tuners.lora import LoraLayer
    from peft.tuners.tuners_utils import BaseTunerLayer
    from peft.utils import ModulesToSaveWrapper
    from peft.utils.other import AuxiliaryTrainingWrapper

    for module in model.modules():
        if isinstance(module, LoraLayer):
            if any(module.lora_variant.get(a) or module.lora_bias.get(a) for a in module.active_adapters):
                return False
        elif isinstance(module, BaseTunerLayer) or (
            isinstance(module, AuxiliaryTrainingWrapper) and not isinstance(module, ModulesToSaveWrapper)
        ):
            return False
    return True


def merged_lora_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What ``merge_and_unload().state_dict()`` holds, from the live model without changing it (``plain_state_dict``:
    the adapted weights computed one at a time and kept on the CPU, every other weight the live tensor). No base model
    is loaded again and no random number is drawn; its memory against PEFT's reload is in BENCHMARKS.md."""
    return plain_state_dict(model, adapted_to="cpu")


def save_merged_live(model: torch.nn.Module, actor: Path, output_dir: Path, files: list[str] | None = None) -> None:
    """The live LoRA ``model`` merged into its base (``merged_lora_weights``), with the tokenizer files of its saved
    ``actor`` directory: everything of ``files`` (by default the directory's regular files) but the adapter and its
    card."""
    base = model.get_base_model()
    base.save_pretrained(output_dir, state_dict=merged_lora_weights(model), safe_serialization=True)
    names = regular_files(actor) if files is None else files
    kept = [name for name in names if not name.startswith("adapter_") and name != "README.md"]
    copy_files(actor, kept, output_dir)
