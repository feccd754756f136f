"""The ``steadyrl`` command line (also ``python -m steadyrl`` and ``accelerate launch -m steadyrl``)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from ..checkpoint import CheckpointError


def train_commands() -> tuple[str, ...]:
    """``steadyrl <name>`` trains with the algorithm of that name in the registry."""
    from ..trainers import ALGORITHMS

    return tuple(ALGORITHMS)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="steadyrl",
        description="steadyrl: on-policy RL trainers for LLMs. 'steadyrl COMMAND --help' describes each command.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in train_commands():
        commands.add_parser(
            name,
            add_help=False,
            help=f"train with {name.upper()}: --config cfg.yaml and/or --any_config_field value (see --help)",
        )
    commands.add_parser(
        "demo",
        add_help=False,
        help="train RLOO (or --algorithm NAME) on the embedded toy task, or with --model smollm2 GRPO on a real "
        "chat model's arithmetic, on CPU, in minutes (see --help)",
    )
    export = commands.add_parser(
        "export",
        help="write the actor of a checkpoint as a plain Hugging Face model",
        description="Write the actor (policy) of a steadyrl checkpoint to OUT_DIR as a plain Hugging Face model: "
        "safetensors weights, config, generation config, tokenizer. The checkpoint is verified against its "
        "manifest first; a LoRA actor is merged into its base model. Needs no GPU and no distributed launch.",
    )
    export.add_argument("checkpoint", metavar="CKPT_DIR", help="a checkpoint directory, e.g. out/checkpoint-500")
    export.add_argument("output_dir", metavar="OUT_DIR", help="a new (or empty) directory for the model")
    push = commands.add_parser(
        "push",
        help="publish the actor of a checkpoint (or a saved actor) to the Hugging Face Hub",
        description="Publish the actor alone to REPO_ID on the Hugging Face Hub, with a model card: from a checkpoint "
        "(verified against its manifest first) or a saved actor directory. Never the critic, reward model, "
        "optimizer or RNG state. The token comes from --token, HF_TOKEN or the cached login (huggingface-cli login).",
    )
    push.add_argument("source", metavar="CKPT_OR_ACTOR_DIR", help="e.g. out/checkpoint-500 or out/actor")
    push.add_argument("repo_id", metavar="REPO_ID", help="e.g. my-name/qwen-rloo")
    push.add_argument("--merged", action="store_true", help="a LoRA actor: push it merged into its base model")
    push.add_argument("--private", action="store_true", help="create the repository private")
    push.add_argument("--revision", default=None, help="branch to commit to (default: main)")
    push.add_argument("--token", default=None, help="Hub token; default: HF_TOKEN or the cached login")
    checkpoints = commands.add_parser(
        "checkpoints",
        help="list the checkpoints of a run and which one a resume would pick",
        description="Print a table of OUTPUT_DIR's checkpoints: step, size, time written, whether it is complete "
        "and matches its manifest (every file's size and sha256), and which one resume_from_checkpoint=True "
        "would pick. Exits with 1 if a checkpoint is damaged or incomplete.",
    )
    checkpoints.add_argument("output_dir", metavar="OUTPUT_DIR", help="a run's output_dir")
    commands.add_parser(
        "vllm-serve",
        add_help=False,
        help="start a vLLM server for vllm_mode='server' runs: --model M --port P ... (see --help)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    make_cwd_importable()
    if argv and argv[0] in train_commands():
        from ..publish.hub import HubPushError
        from ..trainers import ALGORITHMS
        from .train import train

        try:
            train(*ALGORITHMS[argv[0]], argv[1:], prog=f"steadyrl {argv[0]}")
        except HubPushError as err:  # the Hub, not the run: one line, not a traceback
            print(f"steadyrl {argv[0]}: error: {err}", file=sys.stderr)
            return 2
        return 0
    if argv and argv[0] == "demo":
        return demo(argv[1:], prog="steadyrl demo")
    if argv and argv[0] == "vllm-serve":
        from .serve import main as vllm_serve

        return vllm_serve(argv[1:])
    args = build_parser().parse_args(argv)
    if args.command == "export":
        from ..publish.export import export_actor

        if not Path(args.checkpoint).exists():
            print(f"steadyrl export: error: {args.checkpoint} does not exist", file=sys.stderr)
            return 2
        try:
            out = export_actor(args.checkpoint, args.output_dir)
        except (CheckpointError, FileExistsError) as err:
            print(f"steadyrl export: error: {err}", file=sys.stderr)
            return 2
        print(f"Wrote the actor of {args.checkpoint} to {out}")
    elif args.command == "push":
        from ..publish.hub import hub_failure, network_errors, push_from_directory

        if not Path(args.source).exists():
            print(f"steadyrl push: error: {args.source} does not exist", file=sys.stderr)
            return 2
        try:
            url = push_from_directory(
                Path(args.source), args.repo_id, args.token, args.merged, args.private, args.revision
            )
        except (CheckpointError, FileNotFoundError) as err:
            print(f"steadyrl push: error: {err}", file=sys.stderr)
            return 2
        except network_errors() as err:
            print(
                f"steadyrl push: error: could not push to {args.repo_id!r}: {hub_failure(err)}. Run the same command "
                "again once the Hub is reachable (and HF_HUB_OFFLINE is unset).",
                file=sys.stderr,
            )
            return 2
        print(f"Pushed the actor of {args.source} to {args.repo_id}: {url}")
    elif args.command == "checkpoints":
        return list_checkpoints(Path(args.output_dir))
    return 0


def demo(argv: list[str] | None = None, prog: str | None = None) -> int:
    """``steadyrl demo`` (and ``steadyrl-demo``): the toy task's demo, or with ``--model smollm2`` the real model's
    (each with its own flags and ``--help``)."""
    argv = sys.argv[1:] if argv is None else argv
    model = argparse.ArgumentParser(add_help=False)
    model.add_argument("--model", default="toy")
    if model.parse_known_args(argv)[0].model == "smollm2":
        from ..real.demo import main as run
    else:
        from ..toy.demo import main as run
    run(argv, prog)
    return 0


def make_cwd_importable() -> None:
    """Let ``--reward_funcs my_module:func`` find ``my_module.py`` in the current directory: ``python -m steadyrl``
    puts the directory on ``sys.path``, but the ``steadyrl`` console script does not."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)


def disk_size(directory: Path) -> int:
    """Bytes of the files below ``directory``, counting a symlink as itself (never following it)."""
    total = 0
    for root, _, files in os.walk(directory):  # does not descend into symlinked directories
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:  # removed meanwhile: the table is a snapshot
                pass
    return total


def list_checkpoints(output_dir: Path) -> int:
    from ..checkpoint import scan_checkpoints

    if not output_dir.exists():
        print(f"steadyrl checkpoints: error: {output_dir} does not exist", file=sys.stderr)
        return 2
    if not output_dir.is_dir():
        print(f"steadyrl checkpoints: error: {output_dir} is not a directory", file=sys.stderr)
        return 2
    scan = scan_checkpoints(output_dir)
    rows = [(path, "complete", "ok") for _, path in scan.complete]
    rows += [
        (path, "damaged" if path.name.startswith("checkpoint-") else "incomplete", why) for path, why in scan.rejected
    ]
    if not rows:
        print(f"{output_dir}: no checkpoints")
        return 0
    rows.sort(key=lambda row: int(row[0].name.rsplit("-", 1)[1]))
    print(f"{'step':>8}  {'size':>9}  {'written':19}  {'state':10}  manifest")
    for path, state, check in rows:
        size = disk_size(path)
        written = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(path.stat().st_mtime))
        mark = "  <- resume_from_checkpoint=True" if path == scan.newest else ""
        print(f"{path.name.rsplit('-', 1)[1]:>8}  {size / 2**20:>7.1f}MB  {written}  {state:10}  {check}{mark}")
    if scan.newest is None:
        print("No complete checkpoint: resume_from_checkpoint=True would start from step 0.")
    return 1 if scan.rejected else 0


if __name__ == "__main__":
    sys.exit(main())
