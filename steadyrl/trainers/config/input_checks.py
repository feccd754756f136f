"""Checks of the trainer's inputs that run before any work: the output directory, the model path, the tokenizer and
the dataset."""

from __future__ import annotations

import os
import tempfile

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


def check_dataset(dataset, argument: str = "train_dataset") -> None:
    """A ``datasets.Dataset`` with at least one row and a ``prompt`` column (its rows are checked by
    ``prompts.check_prompts``)."""
    if dataset is None:
        raise ValueError(f"{argument} is required: a datasets.Dataset with a 'prompt' column.")
    if not hasattr(dataset, "select"):
        kind = type(dataset).__name__
        raise TypeError(f"{argument} must be a datasets.Dataset with a 'prompt' column; got {kind}.")
    columns = getattr(dataset, "column_names", None)
    if columns is None or "prompt" not in columns:
        raise ValueError(f"{argument} needs a 'prompt' column of strings or conversations; its columns are {columns}.")
    if len(dataset) == 0:
        raise ValueError(f"{argument} is empty: it needs at least one prompt.")


def check_output_dir(path: str, argument: str = "output_dir") -> None:
    """Create ``path`` if missing and write and remove a small file in it, so that a directory the checkpoints
    cannot be written to is refused now rather than at the first save."""
    try:
        os.makedirs(path, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(prefix=".steadyrl-write-test-", dir=path)
        os.close(descriptor)
        os.remove(probe)
    except OSError as err:
        raise ValueError(
            f"{argument}={path!r} is not writable ({err}): checkpoints are saved there. Point {argument} at a "
            "directory this process can create and write files in (on a writable filesystem, with write permission)."
        ) from err
