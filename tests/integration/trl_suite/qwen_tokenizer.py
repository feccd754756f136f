"""Qwen2.5's and Qwen3's tokenizer, built offline for the stand-ins: TRL's tests feed completions as Qwen token ids
(``17453`` is "Done", ``151645`` ``<|im_end|>``), so the Qwen stand-ins need Qwen's own ids.

The byte-level BPE is Qwen's 151,643-token vocabulary (``qwen.tiktoken``, taken from the ``dashscope`` wheel on PyPI,
Apache-2.0), read into a ``tokenizers`` BPE with transformers' tiktoken converter; Qwen2's pre-tokenizer pattern,
NFC normalisation and added tokens (ids 151643 on) are those of Qwen2.5's and Qwen3's ``tokenizer.json``.
"""

from __future__ import annotations

import base64
import subprocess
import sys
import zipfile
from pathlib import Path

PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# (content, special): Qwen2.5's added tokens from id 151643 on; Qwen3 adds the last four
QWEN25_ADDED = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
]
QWEN3_ADDED = [("<tool_response>", False), ("</tool_response>", False), ("<think>", False), ("</think>", False)]
BASE_TOKENS = 151643


def tiktoken_file(cache: Path) -> Path:
    """``qwen.tiktoken`` from the dashscope wheel, downloaded once (pip, from the package registry) into ``cache``."""
    target = cache / "qwen.tiktoken"
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "dashscope", "--no-deps", "--quiet", "--dest", str(cache)]
    subprocess.run(command, check=True)
    wheel = next(cache.glob("dashscope-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        target.write_bytes(archive.read("dashscope/resources/qwen.tiktoken"))
    return target


def qwen_tokenizer(family: str, cache: Path, chat_template: str | None):
    """``family`` "qwen2_5" or "qwen3": the tokenizer with its added tokens, eos ``<|im_end|>``, pad
    ``<|endoftext|>``, and ``chat_template``."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = {}
    for line in tiktoken_file(cache).read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    assert len(ranks) == BASE_TOKENS, len(ranks)

    class Converter(TikTokenConverter):
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    backend = Converter(vocab_file="qwen.tiktoken", pattern=PATTERN).tokenizer()
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    added = QWEN25_ADDED + (QWEN3_ADDED if family == "qwen3" else [])
    backend.add_tokens([AddedToken(content, special=special, normalized=False) for content, special in added])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645, tokenizer.convert_tokens_to_ids("<|im_end|>")
    tokenizer.padding_side = "left"
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    return tokenizer
