"""A checkpoint's top level holds the actor's Hugging Face files beside steadyrl's own (checkpoint/layout.py), as a
transformers.Trainer checkpoint holds its model beside trainer_state.json and optimizer.pt. No name is both: a save
never overwrites one with the other, and export and push take exactly the actor's files. The same on real runs:
tests/integration/publish/test_export.py."""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from steadyrl.checkpoint.layout import actor_files, index_single_file, is_own_file, model_dir, weight_files

# every name steadyrl writes at a checkpoint's top level: shared files, each module's optimizer and scheduler (the
# critic's too), per-process files of every registered part (on_policy.py) and process, fp16's loss scaler
STEADYRL_FILES = [
    "manifest.json",
    "trainer_state.json",
    "steadyrl_state.json",
    "settings.json",
    "scaler.pt",
    "optimizer.pt",
    "scheduler.pt",
    "critic_optimizer.pt",
    "critic_scheduler.pt",
    *(f"{stem}_{rank}.pt" for stem in ("optimizer", "critic_optimizer") for rank in (0, 1, 15)),
    *(
        f"{part}_{rank}.{suffix}"
        for part in ("rng_state", "rollout_buffer", "pending_metrics", "meter", "rollouts_ahead")
        for rank in (0, 7, 128)
        for suffix in ("json", "safetensors")
    ),
]


def hugging_face_names() -> set[str]:
    """Every file name transformers, its tokenizers and processors, and PEFT write for a model: the libraries' own
    constants and every tokenizer class's vocabulary files."""
    import peft.utils.constants
    import transformers
    import transformers.tokenization_utils_base as tokenization
    import transformers.utils
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    names = {"model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors", "README.md"}
    for module in (transformers.utils, tokenization, peft.utils.constants):
        names |= {value for key, value in vars(module).items() if key.endswith(("_NAME", "_FILE")) and "." in value}
    for classes in filter(None, TOKENIZER_MAPPING_NAMES.values()):
        for name in filter(None, (classes,) if isinstance(classes, str) else classes):
            vocabulary = getattr(getattr(transformers, name), "vocab_files_names", {})
            names |= {value for value in vocabulary.values() if isinstance(value, str)}
    return names


def test_no_name_the_actors_save_writes_is_one_of_steadyrls():
    names = hugging_face_names()
    assert {"config.json", "tokenizer.json", "spiece.model", "adapter_model.safetensors"} <= names and len(names) > 40
    assert [name for name in sorted(names) if is_own_file(name)] == []


def test_every_name_steadyrl_writes_at_the_top_level_is_its_own():
    assert [name for name in STEADYRL_FILES if not is_own_file(name)] == []


def test_the_actors_files_in_either_layout():
    actor = ["config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json"]
    templates = ["additional_chat_templates/tool_use.jinja"]
    others = ["critic/config.json", "critic/model.safetensors", "reference/model.safetensors", "reference/config.json"]
    assert actor_files(STEADYRL_FILES + actor + templates + others) == sorted(actor + templates)
    old = STEADYRL_FILES + others + [f"actor/{name}" for name in actor + templates]
    assert actor_files(old) == sorted(actor + templates)
    assert actor_files(["trainer_state.json", "optimizer.pt", "rng_state_0.json"]) == []


def test_the_actors_place_and_weights_in_either_layout(tmp_path):
    weights = {"model.embed.weight": torch.ones(3, 2), "lm_head.weight": torch.zeros(2, 3)}
    save_file(weights, tmp_path / "model.safetensors")
    save_file({"rollout.completion_ids": torch.ones(4)}, tmp_path / "rollout_buffer_0.safetensors")
    assert model_dir(tmp_path, "actor") == tmp_path and model_dir(tmp_path, "critic") == tmp_path / "critic"
    assert weight_files(tmp_path) == [tmp_path / "model.safetensors"]

    index_single_file(tmp_path)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["weight_map"] == dict.fromkeys(weights, "model.safetensors")
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in weights.values())
    assert weight_files(tmp_path) == [tmp_path / "model.safetensors"]

    (tmp_path / "actor").mkdir()  # a checkpoint of an earlier version
    assert model_dir(tmp_path, "actor") == tmp_path / "actor"
