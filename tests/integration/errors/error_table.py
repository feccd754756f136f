"""The table of bad input (docs/errors.md, "When input is wrong"), checked row by row, so the two cannot drift apart:
the machinery the test_*_errors.py files of this folder share.

Every row's id has a trigger that provokes its error in-process, in the file GROUPS gives the row's area (the table's
second column): each row is tested by exactly one file. A file's test fails when one of its rows has no trigger there, a
trigger has no row of the file's areas, or the error differs from the table's text ``Type: message``: the exception's
type must be ``Type`` and its message must match ``message``, where ``…`` stands for any text (a path, a long tail). A
command line row reads ``exit N: <the last line the command wrote to stderr>``. A row whose area no file takes is
tested, and fails, in DEFAULT_GROUP's file.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest
from conftest import ROOT
from datasets import Dataset
from support.toy_run import make_config
from transformers import AutoTokenizer

from steadyrl import RLOOTrainer
from steadyrl.cli.main import main as steadyrl_main
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path

TABLE_PAGE = "docs/errors.md"
SECTION = "# When input is wrong"
HERE = Path(__file__).resolve().parent

# which file of this folder tests the rows of which areas: each area in one file
GROUPS: dict[str, tuple[str, ...]] = {
    "test_config_errors": ("config", "trainer", "TRL names"),
    "test_data_errors": ("data", "datasets", "reward functions"),
    "test_model_errors": ("models", "real model"),
    "test_vllm_server_errors": ("vLLM server",),
    "test_environment_errors": ("environment", "FSDP2"),
    "test_checkpoint_and_cli_errors": ("checkpoints", "command line"),
    "test_multi_turn_errors": ("multi-turn",),
    "test_vision_errors": ("vision",),
}
DEFAULT_GROUP = "test_config_errors"
GROUP_OF_AREA = {area: group for group, areas in GROUPS.items() for area in areas}
assert len(GROUP_OF_AREA) == sum(map(len, GROUPS.values())), "an area is in two GROUPS: each row must be tested once"
assert not [group for group in GROUPS if not (HERE / f"{group}.py").exists()], "a file of GROUPS is missing"


def code_span(cell: str) -> str | None:
    """The text of the first markdown code span in ``cell`` (``` `` a `b` `` ``` spans may hold backticks)."""
    match = re.search(r"(`+)(.+?)(?<!`)\1(?!`)", cell)
    if match is None:
        return None
    text = match.group(2)
    return text[1:-1] if text.startswith(" ") and text.endswith(" ") and text.strip() else text


class Row(NamedTuple):
    area: str
    error: str


def table() -> dict[str, Row]:
    """``{row id: (area, error text)}`` from the table of TABLE_PAGE's "When input is wrong" section."""
    page = (ROOT / TABLE_PAGE).read_text()
    assert SECTION in page, f"{TABLE_PAGE} has no '{SECTION}' section"
    section = page.split(SECTION, 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 4 or cells[0] in ("id", "") or set(cells[0]) <= set("-: "):
            continue
        row_id = cells[0].strip("`")
        assert row_id not in rows, f"{TABLE_PAGE} row {row_id!r} appears twice"
        rows[row_id] = Row(cells[1], code_span(cells[3]))
        assert rows[row_id].error, f"{TABLE_PAGE} row {row_id!r}: its error cell has no `Type: message` code span"
    return rows


def table_rows() -> dict[str, str]:
    """``{row id: error text}`` from the table of TABLE_PAGE's "When input is wrong" section."""
    return {row_id: row.error for row_id, row in table().items()}


ROWS = table()


def group_of(row_id: str) -> str:
    """The file (its stem) that tests ``row_id``."""
    return GROUP_OF_AREA.get(ROWS[row_id].area, DEFAULT_GROUP)


def matches(expected: str, actual: str) -> bool:
    """``actual`` is ``expected`` with each ``…`` standing for any text."""
    pattern = ".*?".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, actual, flags=re.DOTALL) is not None


# ---- triggers -------------------------------------------------------------------------------------------------------


@dataclass
class Context:
    tmp_path: Path
    request: pytest.FixtureRequest
    monkeypatch: pytest.MonkeyPatch
    capsys: pytest.CaptureFixture

    @property
    def run(self) -> Path:
        """output_dir of a finished 2-step run, with checkpoint-2 (the module's ``finished_run``: do not modify it)."""
        return self.request.getfixturevalue("finished_run")

    def cli(self, *args) -> str:
        """``steadyrl ARGS`` in-process, as ``exit N: <last line on stderr>``."""
        self.capsys.readouterr()
        try:
            code = steadyrl_main([str(arg) for arg in args])
        except SystemExit as exit:
            code = exit.code
            if isinstance(code, str):  # SystemExit("message"): Python prints it and exits with 1
                print(code, file=sys.stderr)
                code = 1
        lines = self.capsys.readouterr().err.strip().splitlines()
        return f"exit {code}: {lines[-1] if lines else ''}"


class Triggers(dict[str, Callable[[Context], str | None]]):
    """The triggers of one file of GROUPS, ``{row id: trigger}``; ``@triggers(row_id)`` registers one."""

    def __init__(self, test_file: str):
        super().__init__()
        self.file = Path(test_file).name
        self.group = Path(test_file).stem
        assert self.group in GROUPS, f"{self.file} is not in GROUPS of {Path(__file__).name}"

    def __call__(self, row_id: str):
        def register(func):
            assert row_id not in self, f"two triggers for {row_id!r}"
            self[row_id] = func
            return func

        return register

    def config_error(self, row_id: str, algorithm: str = "rloo", **settings) -> None:
        """A row whose error is raised by building the toy run's config for ``algorithm`` with ``settings``."""
        self(row_id)(lambda ctx: make_config(ctx.tmp_path, algorithm, **settings))

    def row_ids(self) -> list[str]:
        """The ids this file tests: its areas' rows, and its triggers (each of which must be one of them)."""
        return sorted({row_id for row_id in ROWS if group_of(row_id) == self.group} | set(self))

    def check(self, row_id: str, ctx: Context) -> None:
        """Provoke ``row_id``'s error with its trigger and compare it with the table's."""
        assert row_id in ROWS, f"trigger {row_id!r} has no row in {TABLE_PAGE}'s '{SECTION}' table"
        area = ROWS[row_id].area
        assert area in GROUP_OF_AREA, f"{TABLE_PAGE}'s row {row_id!r}: its area {area!r} is in no file of GROUPS"
        assert group_of(row_id) == self.group, (
            f"{self.file} has a trigger for {row_id!r}, whose area {area!r} {group_of(row_id)}.py tests"
        )
        assert row_id in self, f"{TABLE_PAGE}'s row {row_id!r} has no trigger in {self.file}"
        expected = ROWS[row_id].error
        assert re.match(r"(\w+|exit \d+): \S", expected), f"{row_id}: the error must read `Type: message`: {expected!r}"
        try:
            actual = self[row_id](ctx)
        except Exception as err:
            actual = f"{type(err).__name__}: {err}"
        assert actual is not None, f"{row_id}: no error was raised; {TABLE_PAGE} says {expected!r}"
        assert matches(expected, actual), f"{row_id}: {TABLE_PAGE} says\n  {expected}\nbut the error is\n  {actual}"


# ---- helpers of several files ---------------------------------------------------------------------------------------


def rloo(ctx: Context, **kwargs) -> RLOOTrainer:
    kwargs.setdefault("model", toy_model_path())
    kwargs.setdefault("args", make_config(ctx.tmp_path))
    kwargs.setdefault("train_dataset", toy_dataset())
    return RLOOTrainer(reward_funcs=[letters_reward], **kwargs)


AHEAD = dict(use_vllm=True, vllm_mode="server", vllm_importance_sampling_correction=True)


def chat_tokenizer():
    """The toy tokenizer with a chat template (its characters spell any ChatML role line)."""
    tokenizer = AutoTokenizer.from_pretrained(toy_model_path())
    tokenizer.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    return tokenizer


def conversations(*contents):
    prompts = [[{"role": "user", "content": content}] for content in contents]
    return Dataset.from_dict({"prompt": prompts, "letters": ["ab"] * len(contents)})
