"""Training from the command line: ``steadyrl rloo|ppo|online-dpo`` and the example scripts.

Arguments are the fields of the algorithm's config class plus ``ScriptArguments``, as flags
(``transformers.HfArgumentParser``), from a YAML file (``--config cfg.yaml``, or the YAML file as the only
argument), or both: flags override the file. A run trains ``--model_name_or_path`` on ``--dataset_name`` (a Hub
dataset, or a local file or folder), or with ``--toy`` the embedded toy task; anything else, a local dataset path
that does not exist included, is refused before a model is loaded.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from transformers import HfArgumentParser

from ..checkpoint import CheckpointError
from ..checkpoint.shared_dir import OutputDirNotShared
from ..trainers import OnPolicyConfig, OnPolicyTrainer

# file extension -> the datasets builder that reads it
LOCAL_DATA_FORMATS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
ACCEPTED_DATASETS = "a .json, .jsonl, .parquet or .csv file, a folder of data files, or a Hub dataset id (org/name)"


@dataclass
class ScriptArguments:
    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Model path or Hub id (required unless --toy)."}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "A Hub dataset id, or a local .json/.jsonl/.parquet/.csv file or folder of data files, "
            "with a 'prompt' column of strings or of chat messages (required with --model_name_or_path)."
        },
    )
    dataset_split: str = field(default="train", metadata={"help": "The split to train on (a single file's is train)."})
    reward_model_name_or_path: str | None = field(
        default=None, metadata={"help": "A sequence classifier (num_labels=1) scoring completions, if any."}
    )
    reward_funcs: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Reward functions as module:function or path/to/file.py:function (TRL's calling "
            "convention); with --toy the default is steadyrl.toy:letters_reward."
        },
    )
    toy: bool = field(
        default=False,
        metadata={
            "help": "Train the embedded toy task (a tiny model, its prompts and the letters_reward rule; "
            "minutes on a CPU) instead of --model_name_or_path on --dataset_name."
        },
    )


def parse(config_class, argv: list[str], prog: str | None = None) -> tuple[ScriptArguments, object]:
    """``ScriptArguments`` and the config from ``argv``: flags, ``--config FILE.yaml`` plus flags, or ``FILE.yaml``."""
    parser = HfArgumentParser((ScriptArguments, config_class), prog=prog)
    parser.add_argument("--config", metavar="FILE.yaml", help="a YAML file of any fields below; flags override it")
    if len(argv) == 1 and argv[0].endswith((".yaml", ".yml")):
        argv = ["--config", argv[0]]
    config_file = _option(argv, "--config")
    if config_file is not None:
        values = _read_yaml(config_file)
        fields = {f.name for cls in (ScriptArguments, config_class) for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(values) - fields)
        if unknown:
            parser.error(f"{config_file}: unknown field(s) {unknown}; the fields are the flags listed by --help")
        parser.set_defaults(**values)
        for action in parser._actions:  # a field the file sets is no longer required on the command line
            if action.dest in values:
                action.required = False
    try:
        script, config, _, unknown = parser.parse_args_into_dataclasses(args=argv, return_remaining_strings=True)
    except ValueError as err:  # a config check refused a value: its message names the field and what is valid
        parser.exit(2, f"{parser.prog}: error: {err}\n")  # without the usage, which lists every field
    if unknown:  # the third output holds the --config option
        parser.error(f"unrecognized arguments: {' '.join(unknown)} (--help lists every field)")
    problem = missing_or_conflicting_inputs(script)
    if problem:
        parser.exit(2, f"{parser.prog}: error: {problem}\n")
    return script, config


def missing_or_conflicting_inputs(script: ScriptArguments) -> str | None:
    """What is wrong with the choice of model and dataset, if anything: it is ``--toy``, or a model and a dataset
    (a local dataset path must exist and be of a readable type)."""
    if script.toy:
        own = {"--model_name_or_path": script.model_name_or_path, "--dataset_name": script.dataset_name}
        given = " and ".join(flag for flag, value in own.items() if value)
        if given:
            return (
                f"--toy cannot be combined with {given}: --toy trains the embedded toy model on its own prompts. "
                f"Drop --toy to train your own model, or drop {given}."
            )
    elif not script.model_name_or_path:
        return (
            "--model_name_or_path is required: give a model path or Hub id (with --dataset_name), "
            "or --toy to train the embedded toy task."
        )
    elif not script.dataset_name:
        return (
            "--dataset_name is required with --model_name_or_path: give a dataset path or Hub id "
            "with a 'prompt' column."
        )
    else:
        return local_dataset_problem(script.dataset_name)
    return None


def local_dataset_problem(name: str) -> str | None:
    """What is wrong with ``--dataset_name`` as a local path, if it is meant as one: a file of a type that cannot be
    read, or a path that does not exist (a Hub id is ``name`` or ``org/name``, without a data file extension)."""
    path = Path(name).expanduser()
    if path.is_file() and path.suffix.lower() not in LOCAL_DATA_FORMATS:
        return f"--dataset_name {name}: cannot read {path.suffix or 'extensionless'} files. Give {ACCEPTED_DATASETS}."
    looks_local = name.startswith((".", "/", "~")) or name.count("/") > 1 or path.suffix.lower() in LOCAL_DATA_FORMATS
    if looks_local and not path.exists():
        return f"--dataset_name {name}: no such file or folder. Give {ACCEPTED_DATASETS}."
    return None


def load_prompt_dataset(name: str, split: str = "train"):
    """``--dataset_name`` as a ``datasets.Dataset``: a .json/.jsonl/.parquet/.csv file (whose only split is
    "train"), a folder of data files, or a Hub dataset id. Plain or conversational prompts alike."""
    from datasets import load_dataset

    path = Path(name).expanduser()
    if path.is_file():
        return load_dataset(LOCAL_DATA_FORMATS[path.suffix.lower()], data_files=str(path), split=split)
    return load_dataset(str(path) if path.is_dir() else name, split=split)


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _read_yaml(path: str) -> dict:
    try:
        with open(path) as f:
            values = yaml.safe_load(f) or {}
    except OSError as err:
        raise SystemExit(f"--config {path}: cannot read it ({err.strerror})") from err
    except yaml.YAMLError as err:
        raise SystemExit(f"--config {path}: not valid YAML ({err})") from err
    if not isinstance(values, dict):
        raise SystemExit(f"--config {path}: expected a mapping of field: value, got {type(values).__name__}")
    return values


def load_reward_func(spec: str):
    """``module:function``, ``path/to/file.py:function`` (or ``module.function``) -> the function."""
    source, _, name = spec.rpartition(":") if ":" in spec else spec.rpartition(".")
    try:
        module = _module_from_file(source) if source.endswith(".py") else importlib.import_module(source)
        return getattr(module, name)
    except (ImportError, AttributeError, ValueError, OSError) as err:
        raise SystemExit(
            f"--reward_funcs {spec!r}: cannot import it ({err}); use module:function or path/to/file.py:function"
        ) from err


def _module_from_file(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)  # dataclasses look a class's module up there
    spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def refusals_as_errors(prog: str, refusals: tuple[type[Exception], ...]) -> Iterator[None]:
    """A refusal (its message names the setting, the value and what to do) as one ``PROG: error:`` line and exit
    status 2, as argparse reports bad arguments, instead of a traceback."""
    try:
        yield
    except refusals as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from err


def train(
    config_class: type[OnPolicyConfig],
    trainer_class: type[OnPolicyTrainer],
    argv: list[str] | None = None,
    prog: str | None = None,
    **trainer_kwargs,
) -> OnPolicyTrainer:
    """Parse the arguments, build the trainer, train (resuming if asked), save the actor to OUTPUT_DIR/actor.

    ``trainer_kwargs`` go to the trainer (e.g. ``judge=``); ``--reward_funcs`` replaces their ``reward_funcs``.
    """
    script, config = parse(config_class, sys.argv[1:] if argv is None else argv, prog)
    if script.reward_funcs:
        trainer_kwargs["reward_funcs"] = [load_reward_func(spec) for spec in script.reward_funcs]
    if script.toy:
        from ..toy import letters_reward, toy_dataset, toy_model_path

        model, dataset = toy_model_path(), toy_dataset()
        if trainer_class.algorithm_class.uses_rewards:
            trainer_kwargs.setdefault("reward_funcs", [letters_reward])
    else:
        model = script.model_name_or_path
        dataset = load_prompt_dataset(script.dataset_name, script.dataset_split)
    prog = prog or Path(sys.argv[0]).name
    with refusals_as_errors(prog, (ValueError, TypeError, CheckpointError)):  # the trainer's checks of its input
        trainer = trainer_class(
            model=model,
            args=config,
            train_dataset=dataset,
            **({"reward_model": script.reward_model_name_or_path} if script.reward_model_name_or_path else {}),
            **trainer_kwargs,
        )
    with refusals_as_errors(prog, (CheckpointError, OutputDirNotShared)):  # output_dir and resume checks, saves
        trainer.train()
    trainer.save_model(f"{config.output_dir}/actor")
    end_processes(trainer)
    return trainer


def end_processes(trainer: OnPolicyTrainer) -> None:
    """Destroy the process group of a launched run; processes on the CPU then exit here.

    On gloo a finished process rarely aborts during interpreter teardown ("terminate called without an active
    exception": one of torch's C++ threads meets the finalizing interpreter; docs/ddp.md), and the launcher reports a
    failed run. Everything is written by now: the exit handlers (report_to integrations, logging) run, then the
    process exits without the teardown. A colocated vLLM engine needs its process group at exit, so is left alone
    (a vLLM server is another process).
    """
    args = trainer.args
    if trainer.accelerator.num_processes == 1 or (args.use_vllm and args.vllm_mode == "colocate"):
        return
    trainer.accelerator.wait_for_everyone()  # none destroys the group while another is still in a collective
    trainer.accelerator.end_training()
    if trainer.accelerator.device.type == "cpu":
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
