"""Reads EXCLUDED.md: the TRL tests that are not expected to pass on steadyrl, each with its kind and reason.

A listed test is a line ``- `<nodeid>` (<kind>): <reason>``, the node id as pytest prints it relative to the copied
``tests/`` tree's parent (``tests/test_grpo_trainer.py::TestGRPOTrainer::test_x``); kind is ``internals`` (it
reads TRL-private attributes or helpers), ``refusal`` (a deliberate steadyrl refusal, the message quoted) or
``capability`` (the test expects TRL's refusal of a setup steadyrl trains correctly).
"""

from __future__ import annotations

import re
from pathlib import Path

EXCLUDED = Path(__file__).with_name("EXCLUDED.md")
LINE = re.compile(r"^- `(?P<nodeid>[^`]+)` \((?P<kind>internals|refusal|capability)\): (?P<reason>.+)$")


def excluded_tests(path: Path = EXCLUDED) -> dict[str, tuple[str, str]]:
    """node id -> (kind, reason)"""
    found = {}
    for line in path.read_text().splitlines():
        match = LINE.match(line)
        if match:
            found[match["nodeid"]] = (match["kind"], match["reason"])
    return found
