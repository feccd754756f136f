"""TRL's own trainer tests as the judge of steadyrl's drop-in claim: one command.

    .venv/bin/python tests/integration/trl_suite/run.py            # both runs, then the comparison
    .venv/bin/python tests/integration/trl_suite/run.py --variant steadyrl -k test_train_with_eval
    .venv/bin/python tests/integration/trl_suite/run.py --compare  # the comparison of the logs already written

It copies TRL's test files (vendor/, taken verbatim from the TRL repository at the commit in vendor/COMMIT) into a
temporary directory twice: as they are (the baseline, run against the installed TRL) and with only the trainer and
config imports changed to steadyrl (``from trl import GRPOConfig, GRPOTrainer`` -> ``from steadyrl import ...``).
Each copy runs offline in its own pytest process (``HF_HUB_OFFLINE=1``) against local stand-ins of the Hub models
and datasets the tests load (standins.py; built once into the steadyrl cache), with a per-test time limit. Tests
listed in EXCLUDED.md are skipped in the steadyrl run and counted as excluded. The per-file counts are printed and
written to ``--out`` (default ``trl-suite-results.json``); each test's outcome is logged as it finishes to
``--logs``/<variant>.jsonl (appended: a later run of a subset updates those tests), so an interrupted run counts.

Not part of ``make test``: this directory has no test_*.py (the vendored files end in .py.txt), so the normal
run collects nothing here.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
VENDOR = HERE / "vendor"
FILES = ["tests/test_grpo_trainer.py", "tests/test_rloo_trainer.py", "tests/experimental/test_online_dpo_trainer.py"]
# the only change made to the steadyrl copy: where the trainer and its config come from
IMPORTS = {
    "from trl import GRPOConfig, GRPOTrainer": "from steadyrl import GRPOConfig, GRPOTrainer",
    "from trl import RLOOConfig, RLOOTrainer": "from steadyrl import RLOOConfig, RLOOTrainer",
    "from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer": (
        "from steadyrl import OnlineDPOConfig, OnlineDPOTrainer"
    ),
}
PYTEST_INI = """[pytest]
markers =
    slow: marks tests as slow
    low_priority: marks tests as low priority
    invariant: training-invariant checks
"""


def copy_tests(target: Path, variant: str) -> None:
    for source in VENDOR.rglob("*.py.txt"):
        text = source.read_text()
        if variant == "steadyrl":
            for old, new in IMPORTS.items():
                text = text.replace(old, new)
        path = target / source.relative_to(VENDOR).with_suffix("")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (target / "pytest.ini").write_text(PYTEST_INI)


def run_variant(variant: str, standins: Path, work: Path, args: argparse.Namespace) -> None:
    target = work / variant
    copy_tests(target, variant)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]),
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HUB_CACHE=str(standins / "hub"),
        HF_DATASETS_CACHE=str(work / f"datasets-cache-{variant}"),
        TRL_SUITE_DATASETS=str(standins / "datasets"),
        TRL_SUITE_TIMEOUT=str(args.timeout),
        TRL_SUITE_VARIANT=variant,
        TRL_SUITE_LOG=str(Path(args.logs).resolve() / f"{variant}.jsonl"),
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
        WANDB_MODE="disabled",
    )
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "plugin", "-q", "-rN"]
    command += ["-m", "not slow", *(["-k", args.k] if args.k else []), *FILES]
    print(f"== {variant}: {' '.join(command[1:])}", flush=True)
    subprocess.run(command, cwd=target, env=env)


def outcomes(log: Path) -> dict[str, tuple[str, str]]:
    """node id -> (outcome, message), the last line of each test in a variant's log"""
    if not log.is_file():
        return {}
    lines = (json.loads(line) for line in log.read_text().splitlines() if line.strip())
    return {line["nodeid"]: (line["outcome"], line["message"]) for line in lines}


def compare(trl: dict, steady: dict) -> dict:
    from excluded import excluded_tests

    excluded = excluded_tests()
    table = {}
    for file in FILES:
        ids = [i for i in trl if i.startswith(file)]
        passed_trl = [i for i in ids if trl[i][0] == "passed"]
        row = {
            "collected": len(ids),
            "passed_on_trl": len(passed_trl),
            "passed_on_steadyrl": sum(1 for i in ids if steady.get(i, ("missing",))[0] == "passed"),
            "excluded": sorted(i for i in passed_trl if i in excluded),
            "failing": {
                i: steady.get(i, ("missing", ""))[1] or steady.get(i, ("missing",))[0]
                for i in passed_trl
                if i not in excluded and steady.get(i, ("missing",))[0] != "passed"
            },
        }
        table[file] = row
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variant", choices=["trl", "steadyrl", "both"], default="both")
    parser.add_argument("-k", help="pytest -k expression, to run a subset")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test (default 300)")
    parser.add_argument("--out", default="trl-suite-results.json")
    parser.add_argument("--logs", default="trl-suite-logs", help="where each run's per-test log is appended")
    parser.add_argument("--compare", action="store_true", help="only compare the logs already written")
    args = parser.parse_args()

    import standins

    Path(args.logs).mkdir(parents=True, exist_ok=True)
    if not args.compare:
        cache = Path(os.environ.get("STEADYRL_CACHE", Path.home() / ".cache" / "steadyrl")) / "trl-suite-standins"
        built = standins.build(cache)
        with tempfile.TemporaryDirectory(prefix="trl-suite-") as work:
            for variant in ("trl", "steadyrl") if args.variant == "both" else (args.variant,):
                run_variant(variant, built, Path(work), args)
    results = {variant: outcomes(Path(args.logs) / f"{variant}.jsonl") for variant in ("trl", "steadyrl")}
    results["commit"] = (VENDOR / "COMMIT").read_text().split()[0]
    if results["trl"] and results["steadyrl"]:
        results["table"] = compare(results["trl"], results["steadyrl"])
        for file, row in results["table"].items():
            print(
                f"{file}: collected {row['collected']}, passed on TRL {row['passed_on_trl']}, "
                f"passed on steadyrl {row['passed_on_steadyrl']}, excluded {len(row['excluded'])}, "
                f"failing on steadyrl {len(row['failing'])}"
            )
            for nodeid, why in row["failing"].items():
                print(f"    FAILING {nodeid}: {why}")
    Path(args.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
