"""Streaming prompts: a ``datasets.IterableDataset`` read in its own order, epoch after epoch, from a position a
checkpoint restores.

Every process reads the whole stream and the same rows in the same order; ``next_rows`` (sampling.py) then gives
each its slice of the rollout, as for a map-style dataset. ``datasets.distributed.split_dataset_by_node`` would
spare the reading but hand each process other rows (whole shards, or every world-size-th row), so a run's prompts,
and with them its results, would depend on the number of processes.

The position is ``IterableDataset.state_dict()`` (a JSON-able dict of shard and row indices) taken after the last
row drawn, with the epoch and the rows drawn. ``datasets`` restores it exactly, except that the rows a
``.shuffle(seed, buffer_size)`` buffer held are lost on resume and the buffer refills from the rows after them: a
shuffled stream is therefore resumed by reading its current epoch again up to the position (same rows, same order;
the cost is reading those rows once more).
"""

from __future__ import annotations

import datasets
from transformers.utils import logging

from .prompts import check_prompt, is_conversation

logger = logging.get_logger(__name__)


def is_stream(dataset) -> bool:
    return isinstance(dataset, datasets.IterableDataset)


def has_shuffle_buffer(dataset: datasets.IterableDataset) -> bool:
    """Whether ``dataset`` went through ``.shuffle(seed, buffer_size)`` (or wraps streams that did)."""
    pending = [dataset._ex_iterable]
    while pending:
        iterable = pending.pop()
        if type(iterable).__name__ == "BufferShuffledExamplesIterable":
            return True
        pending += [getattr(iterable, "ex_iterable", None), *getattr(iterable, "ex_iterables", [])]
        pending = [item for item in pending if item is not None]
    return False


def first_rows(dataset: datasets.IterableDataset, count: int) -> list[dict]:
    """The stream's first ``count`` rows, read through a copy (``take``): the stream's own position is untouched."""
    return list(dataset.take(count))


class StreamSampler:
    """Draws rows from ``dataset`` in its order; when it ends, starts the next epoch (``set_epoch``: a shuffled
    stream reshuffles) and counts it. Each drawn prompt is checked as ``check_prompts`` checks a map-style
    dataset's, and must be of the first rows' kind (``conversational``)."""

    num_prompts = None  # a stream's length is not known in advance

    def __init__(self, dataset: datasets.IterableDataset, conversational: bool | None = None) -> None:
        self.dataset = dataset
        self.conversational = conversational
        self.consumed = 0  # rows drawn in all epochs
        self.epoch_index = 0
        self.rows_in_epoch = 0
        self.epoch_rows: int | None = None  # the length of an epoch, once one has ended
        self._position = dataset.state_dict()  # the stream's state after the last row drawn
        self._iterator = None
        self._replay = 0  # rows of the current epoch to read again before drawing (a resumed shuffled stream)

    def _next_row(self) -> dict:
        if self._iterator is None:
            self.dataset.set_epoch(self.epoch_index)
            self._iterator = iter(self.dataset)
            self._read_again()
        try:
            row = next(self._iterator)
        except StopIteration:
            if self.rows_in_epoch == 0:
                raise ValueError(
                    f"train_dataset (a datasets.IterableDataset) yielded no rows in epoch {self.epoch_index}: a "
                    "stream must yield at least one prompt per pass."
                ) from None
            self.epoch_rows = self.rows_in_epoch
            self.epoch_index, self.rows_in_epoch, self._iterator = self.epoch_index + 1, 0, None
            return self._next_row()
        self._check(row)
        self.rows_in_epoch += 1
        self.consumed += 1
        return row

    def _read_again(self) -> None:
        """Read the current epoch's rows drawn before the checkpoint again, without drawing them."""
        for read in range(self._replay):
            if next(self._iterator, None) is None:
                raise ValueError(
                    f"train_dataset yields {read} rows in epoch {self.epoch_index}, but the checkpoint had drawn "
                    f"{self._replay}: resume with the data the run started with."
                )
        self._replay = 0

    def _check(self, row: dict) -> None:
        where = f"train_dataset's row {self.rows_in_epoch} of epoch {self.epoch_index}"
        check_prompt(row.get("prompt"), f"{where}: its prompt")
        if self.conversational is not None and is_conversation(row["prompt"]) != self.conversational:
            kind, others = ("a string", "conversations") if self.conversational else ("a conversation", "strings")
            raise ValueError(
                f"{where} holds {kind} among {others}: a stream holds one kind of prompt. Remove or fix that row."
            )

    def next(self, count: int) -> list[dict]:
        """The next ``count`` rows, across epochs."""
        return self.next_indexed(count)[0]

    def next_indexed(self, count: int) -> tuple[list[dict], list[int]]:
        """The next ``count`` rows, across epochs, and each one's place in its epoch (its row in the stream)."""
        rows, places = [], []
        for _ in range(count):
            rows.append(self._next_row())
            places.append(self.rows_in_epoch - 1)
        self._position = self.dataset.state_dict()
        return rows, places

    @property
    def epoch(self) -> float:
        """Epochs done, with the share of the current one once an epoch's length is known."""
        return self.epoch_index + (self.rows_in_epoch / self.epoch_rows if self.epoch_rows else 0.0)

    def state_dict(self) -> dict:
        """Plain JSON: the stream's own state dict, the epoch, and the rows drawn."""
        return {
            "stream": self._position,
            "epoch": self.epoch_index,
            "rows_in_epoch": self.rows_in_epoch,
            "consumed": self.consumed,
            "epoch_rows": self.epoch_rows,
        }

    def load_state_dict(self, state: dict) -> None:
        if "stream" not in state:
            raise ValueError(
                "the checkpoint's prompt sampler walked a map-style datasets.Dataset, but train_dataset is now a "
                "datasets.IterableDataset: resume with the dataset the run started with."
            )
        self.epoch_index, self.rows_in_epoch = state["epoch"], state["rows_in_epoch"]
        self.consumed, self.epoch_rows = state["consumed"], state["epoch_rows"]
        self._position, self._iterator = state["stream"], None
        if has_shuffle_buffer(self.dataset):
            # datasets restores a shuffle buffer empty and refills it from the rows after it, so the stream would go
            # on with other rows; reading the epoch again up to the position gives the very rows a run would draw.
            logger.info(
                f"Resuming a shuffled stream: re-reading the {self.rows_in_epoch} rows of epoch "
                f"{self.epoch_index} drawn before the checkpoint to restore its shuffle buffer."
            )
            self._replay = self.rows_in_epoch
            return
        self.dataset.load_state_dict(state["stream"])  # applies when this epoch's next iteration starts (_next_row)
