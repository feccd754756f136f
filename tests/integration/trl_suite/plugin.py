"""pytest plugin that run.py loads (``-p plugin``) into the copied TRL test files' session.

- ``load_dataset("trl-internal-testing/zen", ...)`` reads the local stand-in directory instead (same configs,
  splits and columns; ``streaming=True`` too). Models need nothing here: they are found by their Hub ids in the
  stand-in hub cache (``HF_HUB_CACHE``, ``HF_HUB_OFFLINE=1``, set by run.py).
- the stand-ins' image-only processor classes are registered with ``AutoProcessor`` (vision_standins.register):
  the Qwen-VL families' processors are saved without their video processor, which needs torchvision.
- testing_utils.py's ``trl.import_utils.is_joblib_available`` (newer than the installed trl) is supplied.
- each test gets a wall-clock limit (``TRL_SUITE_TIMEOUT`` seconds, SIGALRM): a hung test fails, the run goes on.
- every test's outcome is appended to ``TRL_SUITE_LOG`` (JSON lines) as soon as it is known, so an interrupted run
  still counts what it ran.
- in the steadyrl run, the tests listed in EXCLUDED.md are skipped with their reason, so they are reported as
  excluded, not failed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
from pathlib import Path

import datasets
import pytest
from excluded import excluded_tests
from trl import import_utils as trl_import_utils
from vision_standins import register as register_processors

# testing_utils.py at the vendored commit imports a helper that the installed trl 1.16 does not have
if not hasattr(trl_import_utils, "is_joblib_available"):
    trl_import_utils.is_joblib_available = lambda: importlib.util.find_spec("joblib") is not None

register_processors()
DATASETS = Path(os.environ["TRL_SUITE_DATASETS"])
_load_dataset = datasets.load_dataset


def load_dataset(path, *args, **kwargs):
    local = DATASETS / str(path)
    if isinstance(path, str) and "/" in path and local.is_dir():
        path = str(local)
    return _load_dataset(path, *args, **kwargs)


# the test modules import it by name (`from datasets import load_dataset`) after this plugin is loaded
datasets.load_dataset = load_dataset


class TestTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise TestTimeout(f"the test ran past TRL_SUITE_TIMEOUT={os.environ.get('TRL_SUITE_TIMEOUT')} s")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    seconds = int(os.environ.get("TRL_SUITE_TIMEOUT", "0"))
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TRL_SUITE_VARIANT") != "steadyrl":
        return
    excluded = excluded_tests()
    for item in items:
        entry = excluded.get(item.nodeid)
        if entry is not None:
            item.add_marker(pytest.mark.skip(reason=f"excluded ({entry[0]}): {entry[1]}"))


def pytest_runtest_logreport(report):
    """One line per test: its call outcome, or its setup's when the setup failed or skipped it."""
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome if report.when == "call" or report.outcome == "skipped" else "error"
        if hasattr(report, "wasxfail"):
            outcome = "xfailed" if report.outcome == "skipped" else "xpassed"
        message = ""
        if report.outcome != "passed":
            crash = getattr(report.longrepr, "reprcrash", None)
            message = crash.message if crash is not None else str(report.longrepr)
        with open(os.environ["TRL_SUITE_LOG"], "a") as log:
            line = {
                "nodeid": report.nodeid,
                "outcome": outcome,
                "message": message.splitlines()[0][:300] if message else "",
            }
            log.write(json.dumps(line) + "\n")
