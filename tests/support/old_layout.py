"""Checkpoints as steadyrl wrote them before the actor's files moved to the checkpoint's top level: the actor under
``actor/`` (config, model.safetensors, generation config, tokenizer; a PEFT actor's adapter files), no
model.safetensors.index.json. Old checkpoints must still resume, export and push."""

from __future__ import annotations

import json
import os
from pathlib import Path

from steadyrl.checkpoint import write_manifest

# every file the actor's save wrote at a toy run's checkpoint (save_pretrained, the tokenizer's, PEFT's)
ACTOR_FILE_NAMES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "adapter_config.json",
    "adapter_model.safetensors",
    "README.md",
)


def to_old_layout(checkpoint: Path) -> Path:
    """Move the actor's files of a complete checkpoint into ``actor/``, drop the weights index the old layout did not
    have, and write its manifest again: the checkpoint an earlier steadyrl wrote at that step."""
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    (checkpoint / "actor").mkdir()
    (checkpoint / "model.safetensors.index.json").unlink(missing_ok=True)
    for name in ACTOR_FILE_NAMES:
        if (checkpoint / name).is_file():
            os.replace(checkpoint / name, checkpoint / "actor" / name)
    (checkpoint / "manifest.json").unlink()
    write_manifest(checkpoint, manifest["global_step"], processes=manifest.get("processes"))
    return checkpoint
