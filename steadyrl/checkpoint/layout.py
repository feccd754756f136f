"""Where a checkpoint keeps each model, as ``transformers.Trainer`` keeps its model: the actor's Hugging Face files
(config, weights, generation config, tokenizer; a PEFT actor's adapter_config.json and adapter_model.safetensors) at
the checkpoint's top level, so that ``from_pretrained("out/checkpoint-500")`` and vLLM load the actor; any other model
under its own name (``critic/``, ``reference/``). Checkpoints of earlier steadyrl versions hold the actor under
``actor/``; they are read where they are.

Every other top-level file is steadyrl's own, and none takes a name that the actor's save writes. steadyrl's are
manifest.json, trainer_state.json (as Trainer's), steadyrl_state.json, settings.json, scaler.pt (as Trainer's),
[<module>_]optimizer.pt and [<module>_]scheduler.pt (optimizer.pt and scheduler.pt as Trainer's), and
``<name>_<rank>.json|pt|safetensors`` (a lowercase name, an underscore, digits). The actor's are Hugging Face's:
config.json, generation_config.json, model.safetensors (or model-NNNNN-of-NNNNN.safetensors) and
model.safetensors.index.json, tokenizer and processor files (tokenizer.json, tokenizer_config.json, vocab.json, ...,
additional_chat_templates/), adapter_config.json, adapter_model.safetensors and README.md: no ``_<digits>`` before the
extension, no optimizer or scheduler (tests/unit/checkpoint/test_checkpoint_layout.py checks every name transformers,
its tokenizers and PEFT write).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from safetensors import safe_open

from .manifest import MANIFEST_NAME, RANK_FILE_PATTERN, STATE_FILE

ACTOR = "actor"  # the actor's name (TrainedModule.name), and its directory in checkpoints of earlier versions
WEIGHTS_NAME = "model.safetensors"
WEIGHTS_INDEX_NAME = "model.safetensors.index.json"
OWN_FILES = frozenset({MANIFEST_NAME, "trainer_state.json", STATE_FILE, "settings.json", "scaler.pt"})
MODEL_FILES = frozenset({"config.json", "model.safetensors", "model.safetensors.index.json", "adapter_config.json"})
MODULE_STATE_FILE = re.compile(r"(?:[a-z][a-z0-9_]*_)?(?:optimizer|scheduler)\.pt")  # optimizer.pt, critic_scheduler.pt


def save_dir(checkpoint: Path, name: str) -> Path:
    """Where a checkpoint being written keeps model ``name``'s Hugging Face files: the actor's at its top level."""
    return checkpoint if name == ACTOR else checkpoint / name


def model_dir(checkpoint: Path, name: str) -> Path:
    """Where the checkpoint ``checkpoint`` holds model ``name``'s Hugging Face files: the actor's at its top level, or
    under ``actor/`` in a checkpoint of an earlier version; any other model's under ``name/``."""
    if name == ACTOR and not (checkpoint / ACTOR).is_dir():
        return checkpoint
    return checkpoint / name


def is_own_file(name: str) -> bool:
    """``name``, a file at a checkpoint's top level, is one of steadyrl's own, not the actor's."""
    return name in OWN_FILES or any(pattern.fullmatch(name) for pattern in (MODULE_STATE_FILE, RANK_FILE_PATTERN))


def actor_files(names: Iterable[str]) -> list[str]:
    """The actor's files among a checkpoint's ``names`` (relative to it, as its manifest lists them), relative to the
    actor's directory (``model_dir``): those under ``actor/`` in a checkpoint of an earlier version; else every file
    but steadyrl's own and those of another model's directory (critic/, reference/: one that holds a config or
    weights). A tokenizer's subdirectory (additional_chat_templates/) is the actor's."""
    names = list(names)
    old = sorted(name.removeprefix(ACTOR + "/") for name in names if name.startswith(ACTOR + "/"))
    if old:
        return old
    models = {name.split("/")[0] for name in names if "/" in name and name.split("/", 1)[1] in MODEL_FILES}
    return sorted(name for name in names if not (name.split("/")[0] in models if "/" in name else is_own_file(name)))


def weight_files(directory: Path) -> list[Path]:
    """The safetensors files of the Hugging Face model saved in ``directory``: those its index names, else
    model.safetensors. Never any other: a checkpoint's top level also holds steadyrl's ``<part>_<rank>.safetensors``."""
    index = directory / WEIGHTS_INDEX_NAME
    if index.is_file():
        return [directory / name for name in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    return [directory / WEIGHTS_NAME] if (directory / WEIGHTS_NAME).is_file() else []


def index_single_file(directory: Path) -> None:
    """Write model.safetensors.index.json for a model saved in one model.safetensors (none for an adapter or a model
    saved in shards, which has its index): vLLM loads every ``*.safetensors`` of a model directory that has no index,
    which at a checkpoint's top level would include steadyrl's own. transformers reads model.safetensors first."""
    weights = directory / WEIGHTS_NAME
    if not weights.is_file() or (directory / WEIGHTS_INDEX_NAME).exists():
        return
    with safe_open(weights, framework="pt") as f:
        names = list(f.keys())
    index = {"metadata": {"total_size": _tensor_bytes(weights)}, "weight_map": dict.fromkeys(names, WEIGHTS_NAME)}
    (directory / WEIGHTS_INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def _tensor_bytes(weights: Path) -> int:
    """The bytes of a safetensors file's tensors: its size less its header (8 bytes of length, then the header)."""
    with open(weights, "rb") as f:
        header = int.from_bytes(f.read(8), "little")
    return weights.stat().st_size - 8 - header
