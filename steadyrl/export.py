"""Write the actor of a steadyrl checkpoint as a plain Hugging Face model, with no GPU and no distributed launch."""

from __future__ import annotations

import shutil
from pathlib import Path

from .checkpoint import CheckpointError, verify_checkpoint

ACTOR = "actor"


def export_actor(checkpoint: str | Path, output_dir: str | Path) -> Path:
    """Copy (or, for a LoRA checkpoint, merge) the actor of ``checkpoint`` into ``output_dir``.

    The checkpoint is verified against its manifest first; the output holds safetensors weights, the
    config, the generation config and the tokenizer, and loads with ``AutoModelForCausalLM`` and vLLM.
    """
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    if not (checkpoint / "manifest.json").is_file() and any(checkpoint.glob("checkpoint-*")):
        newest = max(checkpoint.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[-1]))
        raise CheckpointError(f"{checkpoint} is an output directory, not a checkpoint: give one, e.g. {newest}.")
    verify_checkpoint(checkpoint)
    actor = checkpoint / ACTOR
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"{output_dir} exists and is not empty: choose a new directory for the export.")
    output_dir.mkdir(parents=True, exist_ok=True)
    if (actor / "adapter_config.json").is_file():
        merge_adapter(actor, output_dir)
    else:
        for path in actor.iterdir():
            shutil.copy2(path, output_dir / path.name)
    return output_dir


def merge_adapter(actor: Path, output_dir: Path) -> None:
    """A LoRA actor: its base model (as named in adapter_config.json) with the adapter merged in."""
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    model = AutoPeftModelForCausalLM.from_pretrained(actor)
    model.merge_and_unload().save_pretrained(output_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(actor).save_pretrained(output_dir)
