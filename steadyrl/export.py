"""Write the actor of a steadyrl checkpoint as a plain Hugging Face model, with no GPU and no distributed launch."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from .checkpoint import CheckpointError, verify_checkpoint

ACTOR = "actor"


def listed_actor_files(checkpoint: Path, manifest: dict) -> list[str]:
    """The files a verified checkpoint's manifest lists under ``actor/``, relative to it; none is an error (a plain
    transformers.Trainer checkpoint has no actor/)."""
    prefix = ACTOR + "/"
    names = sorted(name.removeprefix(prefix) for name in manifest["files"] if name.startswith(prefix))
    if not names:
        raise CheckpointError(f"{checkpoint} has no {prefix}: its manifest lists no actor file to export or push.")
    return names


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

    The checkpoint is verified against its manifest first, and only the files it lists under ``actor/`` are
    copied; the output holds safetensors weights, the config, the generation config and the tokenizer, and
    loads with ``AutoModelForCausalLM`` and vLLM.
    """
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    if not (checkpoint / "manifest.json").is_file() and any(checkpoint.glob("checkpoint-*")):
        newest = max(checkpoint.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        raise CheckpointError(f"{checkpoint} is an output directory, not a checkpoint: give one, e.g. {newest}.")
    manifest = verify_checkpoint(checkpoint)
    actor, files = checkpoint / ACTOR, listed_actor_files(checkpoint, manifest)
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"{output_dir} exists and is not empty: choose a new directory for the export.")
    output_dir.mkdir(parents=True, exist_ok=True)
    if (actor / "adapter_config.json").is_file():
        merge_adapter(actor, output_dir)
    else:
        copy_files(actor, files, output_dir)
    return output_dir


def merge_adapter(actor: Path, output_dir: Path) -> None:
    """A LoRA actor: its base model (as named in adapter_config.json) with the adapter merged in."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    model = AutoPeftModelForCausalLM.from_pretrained(actor)
    model.merge_and_unload().save_pretrained(output_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(actor).save_pretrained(output_dir)
