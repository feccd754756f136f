"""Completion logs: what the policy wrote at each logging step, with its rewards and advantage, to catch reward
hacking. Appended to ``completions.jsonl`` in the output directory, printed as a table, and sent to TensorBoard
(a markdown table) and Weights & Biases (a ``wandb.Table``) when the run reports to them; with ``unique_prompts``
(TRL's ``log_unique_prompts``) those two tables hold each prompt's first row only, as TRL's."""

from __future__ import annotations

import html
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path

from tqdm import tqdm
from transformers.integrations import TensorBoardCallback, WandbCallback

from ..data.prompts import UserTurns
from .jsonl import append_records, truncate_after

COMPLETIONS_FILE = "completions.jsonl"
TABLE_KEY = "completions"  # the TensorBoard tag and the wandb key
PRINTED_CHARS = 120  # a longer prompt is printed as its end after "…", a completion as its start and end around it


class CompletionLog:
    """The completion log of one run: ``output_dir/completions.jsonl``, one JSON object per completion.

    A row is ``{"prompt": str, "completion": str, "rewards": {name: float}, "reward": float, "advantage": float
    | None}``: each reward function's score, the weighted total, and the advantage the loss used. Only the main
    process writes, with the rows of every process. With ``user_turns`` (conversational prompts) the printed table
    shows each prompt's last user turn, not the whole rendered conversation. With ``unique_prompts`` (TRL's
    ``log_unique_prompts``) the TensorBoard and wandb tables hold only the first row of each distinct prompt, as TRL
    filters its report_to table; the file and the printed table keep every row, as TRL's parquet files and print do.

    Example::

        CompletionLog("out", num_to_print=4, unique_prompts=True).write(step, rows, trainer.callback_handler.callbacks)
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        num_to_print: int | None = None,
        user_turns: UserTurns | None = None,
        unique_prompts: bool = False,
    ) -> None:
        if num_to_print is not None and num_to_print < 0:
            raise ValueError(f"num_to_print={num_to_print} is invalid: it must be >= 0, or None to print every row.")
        self.path = Path(output_dir) / COMPLETIONS_FILE
        self.num_to_print, self.user_turns, self.unique_prompts = num_to_print, user_turns, unique_prompts

    def write(self, step: int, rows: Sequence[dict], callbacks: Sequence = ()) -> None:
        """Append ``rows`` for global step ``step`` (durably), print up to ``num_to_print`` of them, and report them
        to the TensorBoard and wandb callbacks among ``callbacks`` that are set up; other callbacks are ignored."""
        if not rows:
            return
        self.append(step, rows)
        print_completions(step, rows_to_print(rows, self.num_to_print), self.user_turns)
        reported = first_of_each_prompt(rows) if self.unique_prompts else rows
        for callback in callbacks:
            if isinstance(callback, TensorBoardCallback) and callback.tb_writer is not None:
                callback.tb_writer.add_text(TABLE_KEY, markdown_table(reported), step)
                callback.tb_writer.flush()
            elif isinstance(callback, WandbCallback):
                log_to_wandb(step, reported)

    def append(self, step: int, rows: Sequence[dict]) -> None:
        """Append one line per row, durably (``jsonl.append_records``)."""
        append_records(self.path, [json_record(step, row) for row in rows])

    def truncate_after(self, step: int) -> None:
        """Drop the lines of steps after ``step`` (``jsonl.truncate_after``). Call it when a run starts at global
        step ``step`` (0 for a fresh start), so a resumed run's file equals an uninterrupted run's."""
        truncate_after(self.path, step)


def _number(value) -> float | None:
    """A plain float for JSON (from a Python, NumPy or 0-d torch number); None for a missing or non-finite one,
    which JSON cannot hold."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def json_record(step: int, row: dict) -> dict:
    """The line ``completions.jsonl`` holds for ``row``."""
    return {
        "step": step,
        "prompt": row["prompt"],
        "completion": row["completion"],
        "reward": _number(row["reward"]),
        "rewards": {name: _number(value) for name, value in row["rewards"].items()},
        "advantage": _number(row.get("advantage")),
    }


def rows_to_print(rows: Sequence[dict], num_to_print: int | None) -> list[dict]:
    """The first ``num_to_print`` rows (all of them for None): the samples of one prompt are consecutive, so they
    are seen side by side, and no random number is drawn, which would shift the run's random stream."""
    return list(rows if num_to_print is None else rows[:num_to_print])


def first_of_each_prompt(rows: Sequence[dict]) -> list[dict]:
    """The first row of each distinct prompt, in order (TRL's ``log_unique_prompts``: ``df[~df["prompt"].astype(str)
    .duplicated()]``)."""
    seen: set[str] = set()
    kept = []
    for row in rows:
        key = str(row["prompt"])
        if key not in seen:
            seen.add(key)
            kept.append(row)
    return kept


def table(rows: Sequence[dict]) -> tuple[list[str], list[list]]:
    """Column names and raw values: prompt, completion, ``rewards/<name>`` for each reward function, the total
    ``reward`` and, if any row has one, ``advantage``."""
    names = list(dict.fromkeys(name for row in rows for name in row["rewards"]))
    with_advantage = any(row.get("advantage") is not None for row in rows)
    columns = ["prompt", "completion", *(f"rewards/{name}" for name in names), "reward"]
    columns += ["advantage"] if with_advantage else []
    values = []
    for row in rows:
        line = [row["prompt"], row["completion"], *(_number(row["rewards"].get(n)) for n in names)]
        line += [_number(row["reward"])] + ([_number(row.get("advantage"))] if with_advantage else [])
        values.append(line)
    return columns, values


def _format_number(value: float | None) -> str:
    return "" if value is None else f"{value:.4g}"


def visible(text: str, max_chars: int | None = PRINTED_CHARS, keep_start: bool = True) -> str:
    """``text`` on one line, newlines and tabs shown as ``\\n`` and ``\\t``; beyond ``max_chars``, its start and
    end around "…" (a completion: its start, and its end, which often holds the hack), or with ``keep_start=False``
    "…" and its end."""
    text = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    if max_chars is None or len(text) <= max_chars:
        return text
    head = (max_chars - 1) // 2 if keep_start else 0
    return text[:head] + "…" + text[len(text) - (max_chars - 1 - head) :]


def shown_prompt(prompt: str, user_turns: UserTurns | None = None) -> str:
    """What the printed table shows of a prompt: the last user turn of a conversation (found with ``user_turns``),
    else the end of the text, where the question is; a long one as "…" and its end."""
    turn = None if user_turns is None else user_turns.last(prompt)
    return visible(prompt if turn is None else turn, keep_start=False)


def print_completions(step: int, rows: Sequence[dict], user_turns: UserTurns | None = None) -> None:
    """Print ``rows`` as a table, each prompt as ``shown_prompt`` shows it: with rich if installed, else as plain
    text."""
    if not rows:
        return
    columns, values = table(rows)
    cells = [[shown_prompt(line[0], user_turns), visible(line[1]), *map(_format_number, line[2:])] for line in values]
    with tqdm.external_write_mode():  # the progress bar cleared first, drawn again below
        _print_table(f"Completions at step {step}", columns, cells)


def _print_table(title: str, columns: list[str], cells: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
        from rich.text import Text
    except ImportError:
        widths = [max(len(c) for c in column) for column in zip(columns, *cells)]
        print(title)
        for line in [columns, *cells]:
            print(" | ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip())
        return
    rich_table = Table(title=title, show_lines=True)
    for name in columns:
        if name in ("prompt", "completion"):
            rich_table.add_column(name, overflow="fold", ratio=1)
        else:  # numbers keep their width, so the texts get the rest of the line
            rich_table.add_column(name.removeprefix("rewards/"), justify="right", no_wrap=True)
    for line in cells:
        rich_table.add_row(*(Text(cell) for cell in line))  # Text: a completion's "[...]" is not rich markup
    Console().print(rich_table)


_MARKDOWN_SPECIAL = re.compile(r"([\\`*_\[\]|])")


def _markdown_cell(value) -> str:
    """A table cell that TensorBoard's markdown renders as the exact text: HTML and markdown escaped, newlines
    as line breaks."""
    if not isinstance(value, str):
        return _format_number(value)
    text = _MARKDOWN_SPECIAL.sub(r"\\\1", html.escape(value, quote=False))
    return text.replace("\r\n", "<br>").replace("\n", "<br>").replace("\r", "<br>")


def markdown_table(rows: Sequence[dict]) -> str:
    """Every row, whole, as a markdown table (TensorBoard's text plugin renders it)."""
    columns, values = table(rows)
    lines = [columns, ["---"] * len(columns)] + [[_markdown_cell(v) for v in line] for line in values]
    return "\n".join("| " + " | ".join(line) + " |" for line in lines)


def wandb_images(wandb, images: list):
    """A table cell of a row's images: one ``wandb.Image`` (stored as an image file), a list of them for several (as
    TRL's), None for none."""
    if not images:
        return None
    return wandb.Image(images[0]) if len(images) == 1 else [wandb.Image(image) for image in images]


def log_to_wandb(step: int, rows: Sequence[dict]) -> None:
    """Every row, with its step, as a ``wandb.Table`` on the active run, keyed by ``train/global_step`` like the
    metrics ``WandbCallback`` logs. Nothing without an active run."""
    import wandb

    if wandb.run is None:
        return
    columns, values = table(rows)
    data = [[step, *line] for line in values]
    if any("images" in row for row in rows):  # log_multimodal: each row's images, as TRL's "image" column
        columns = [*columns, "image"]
        data = [[*line, wandb_images(wandb, row.get("images") or [])] for line, row in zip(data, rows)]
    wandb.run.log({TABLE_KEY: wandb.Table(columns=["step", *columns], data=data), "train/global_step": step})
