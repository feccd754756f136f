"""Checks of the trainer's inputs that run before any work: the model path, the tokenizer and the dataset."""

from __future__ import annotations

import os

from transformers import PreTrainedModel


def check_model_path(value, argument: str) -> None:
    """A string that can only be a local path must be a directory; transformers would call it a bad Hub id."""
    local = isinstance(value, str) and (value.startswith(("/", ".", "~")) or value.count("/") > 1)
    if local and not os.path.isdir(os.path.expanduser(value)):
        raise ValueError(f"{argument}={value!r} is not a directory: give a local model directory or a Hub id "
                         "(org/name).")  # fmt: skip


def check_vocabulary(model: PreTrainedModel, tokenizer) -> None:
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"processing_class has {len(tokenizer)} tokens but the model's embedding has {rows} rows, so some token "
            "ids have no embedding: use the model's own tokenizer, or model.resize_token_embeddings(len(tokenizer))."
        )


def check_dataset(dataset) -> None:
    if dataset is None:
        raise ValueError("train_dataset is required: a datasets.Dataset with a 'prompt' column.")
    if not hasattr(dataset, "select"):
        kind = type(dataset).__name__
        raise TypeError(f"train_dataset must be a datasets.Dataset with a 'prompt' column; got {kind}.")
    columns = getattr(dataset, "column_names", None)
    if columns is None or "prompt" not in columns:
        raise ValueError(f"train_dataset needs a 'prompt' column of strings; its columns are {columns}.")
    if len(dataset) == 0:
        raise ValueError("train_dataset is empty: it needs at least one prompt.")
    first = dataset[0]["prompt"]
    if not isinstance(first, str):
        raise ValueError(
            f"train_dataset['prompt'] must hold strings; row 0 is {type(first).__name__}. "
            "Conversational prompts are not supported yet: apply the chat template first."
        )
