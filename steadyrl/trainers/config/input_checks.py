"""Checks of the trainer's inputs that run before any work: the output directory, the model path, the tokenizer and
the dataset."""

from __future__ import annotations

import os
import tempfile

from transformers.utils import logging

from ...data.images import image_column
from ...data.json_columns import check_ahead_columns
from ...data.stream import first_rows, is_stream

logger = logging.get_logger(__name__)


def check_model_path(value, argument: str) -> None:
    """A string that can only be a local path must be a directory; transformers would call it a bad Hub id."""
    local = isinstance(value, str) and (value.startswith(("/", ".", "~")) or value.count("/") > 1)
    if local and not os.path.isdir(os.path.expanduser(value)):
        raise ValueError(
            f"{argument}={value!r} is not a directory: give a local model directory or a Hub id (org/name)."
        )


def check_dataset(dataset, argument: str = "train_dataset", max_steps: int | None = None) -> None:
    """A ``datasets.Dataset`` or ``datasets.IterableDataset`` (a stream; unsplit: every process reads all of it)
    with at least one row and a ``prompt`` column (its rows are checked by ``prompts.check_prompts``); a stream to
    train on (``max_steps`` given) needs ``max_steps`` > 0."""
    if dataset is None:
        raise ValueError(
            f"`{argument}` is required unless an `environment_factory` is provided (whose reset() returns each "
            "prompt): give a datasets.Dataset with a 'prompt' column."
        )
    if is_stream(dataset):
        check_stream(dataset, argument, max_steps)
        return
    if not hasattr(dataset, "select"):
        kind = type(dataset).__name__
        raise TypeError(
            f"{argument} must be a datasets.Dataset or datasets.IterableDataset with a 'prompt' column; got {kind}."
        )
    columns = getattr(dataset, "column_names", None)
    if columns is None or "prompt" not in columns:
        raise ValueError(f"{argument} needs a 'prompt' column of strings or conversations; its columns are {columns}.")
    if len(dataset) == 0:
        raise ValueError(f"{argument} is empty: it needs at least one prompt.")


def check_image_columns(dataset, argument: str, vision: bool) -> None:
    """A dataset with TRL's ``image`` or ``images`` column needs a vision-language model and its processor
    (``vision``); with a tokenizer alone it would be trained on without its images, so it is refused."""
    if isinstance(dataset, dict):  # evaluation datasets by name
        for key, each in dataset.items():
            check_image_columns(each, f"{argument}[{key!r}]", vision)
        return
    if dataset is None:
        return
    columns = list(first_rows(dataset, 1)[0]) if is_stream(dataset) else list(dataset.column_names)
    found = image_column(columns)
    if found and not vision:
        raise ValueError(
            f"{argument} has the column {found!r}, which TRL reads as a vision-language model's images, but "
            "processing_class is a tokenizer, not a processor: the prompts would be trained on without their "
            "images. Pass the model's processor (transformers.AutoProcessor) as processing_class with a "
            "vision-language model (docs/vision.md), or rename the column if it is not images (it then reaches the "
            "reward functions as a keyword argument)."
        )


def check_train_dataset(dataset, eval_dataset, args) -> None:
    """``check_dataset`` for ``train_dataset``, and ``eval_dataset`` needed by an ``eval_strategy``. A stream is read
    by every process, each keeping its own slice of a rollout (accelerate's ``dispatch_batches=False``), in the
    process itself: ``dispatch_batches=True`` is refused and ``dataloader_num_workers`` set to 0, as TRL does."""
    evals = eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset]
    streams = is_stream(dataset) or any(is_stream(d) for d in evals)
    if streams and args.accelerator_config.dispatch_batches:
        raise ValueError(
            "Iterable datasets require `dispatch_batches=False`, but it is set to `True` in `accelerator_config`: "
            "every process reads the stream itself and keeps its own slice of each rollout, where dispatch_batches "
            "would have the main process read and send the batches. Set it to False or leave it unset."
        )
    check_dataset(dataset, max_steps=args.max_steps)
    check_ahead_columns(dataset, args)
    if eval_dataset is None and args.eval_strategy != "no":
        raise ValueError(
            f"eval_strategy={args.eval_strategy.value!r} needs an eval_dataset: pass eval_dataset= (held-out "
            "prompts, like train_dataset), or set eval_strategy='no'."
        )
    if not streams:
        return
    args.accelerator_config.dispatch_batches = False
    if is_stream(dataset) and args.dataloader_num_workers != 0:
        logger.warning(
            f"Iterable datasets require `dataloader_num_workers=0`: the stream is read in each training process "
            f"itself, with no loader workers; overriding the provided value ({args.dataloader_num_workers})."
        )
        args.dataloader_num_workers = 0


def check_stream(dataset, argument: str, max_steps: int | None) -> None:
    if max_steps is not None and max_steps <= 0:
        raise ValueError(
            f"{argument} is a datasets.IterableDataset (a stream), whose length is unknown, and max_steps={max_steps}: "
            "set max_steps to the number of optimizer steps to train (num_train_epochs cannot size a run on a stream)."
        )
    if getattr(dataset, "_distributed", None) is not None:  # split_dataset_by_node's mark
        raise ValueError(
            f"{argument} was split by datasets.distributed.split_dataset_by_node: every process reads the whole stream "
            "and trains on its own slice of each rollout, so that the prompts do not depend on the number of "
            "processes. Pass the stream before the split."
        )
    rows = first_rows(dataset, 1)
    if not rows:
        raise ValueError(f"{argument} is empty: it needs at least one prompt.")
    if "prompt" not in rows[0]:
        raise ValueError(
            f"{argument} needs a 'prompt' column of strings or conversations; its columns are {list(rows[0])}."
        )


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
