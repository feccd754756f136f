"""The real-model fixture's conversion (steadyrl.cache.build_cached) killed midway leaves nothing a later call uses.
The converted model, the arithmetic task's data and rewards: tests/unit/real/."""

import signal
import subprocess
import sys

from conftest import ROOT

from steadyrl.cache import build_cached

KILLED_BUILD = """
import os, signal, sys
sys.path.insert(0, {root!r})
from steadyrl.cache import build_cached

def build(directory):
    (directory / "config.json").write_text("{{}}")  # what marks a finished build, then killed before the rest
    os.kill(os.getpid(), signal.SIGKILL)

build_cached("model", build)
"""


def test_a_killed_conversion_leaves_nothing_a_later_call_uses(tmp_path, monkeypatch):
    """The conversion is written aside and renamed into place (steadyrl.cache.build_cached)."""
    monkeypatch.setenv("STEADYRL_CACHE", str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", KILLED_BUILD.format(root=str(ROOT))])
    assert proc.returncode == -signal.SIGKILL
    assert not (tmp_path / "model").exists(), "a killed build must not appear under its final name"
    built = build_cached("model", lambda d: (d / "config.json").write_text('{"complete": true}'))
    assert built == str(tmp_path / "model") and (tmp_path / "model" / "config.json").read_text() == '{"complete": true}'
