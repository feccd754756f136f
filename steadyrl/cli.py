"""The ``steadyrl`` command line (also ``python -m steadyrl``)."""

from __future__ import annotations

import argparse
import sys

from .checkpoint import CheckpointError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="steadyrl", description="steadyrl: on-policy RL trainers for LLMs.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    export = commands.add_parser(
        "export",
        help="write the actor of a checkpoint as a plain Hugging Face model",
        description="Write the actor (policy) of a steadyrl checkpoint to OUT_DIR as a plain Hugging Face model: "
        "safetensors weights, config, generation config, tokenizer. The checkpoint is verified against its "
        "manifest first; a LoRA actor is merged into its base model. Needs no GPU and no distributed launch.",
    )
    export.add_argument("checkpoint", metavar="CKPT_DIR", help="a checkpoint directory, e.g. out/checkpoint-500")
    export.add_argument("output_dir", metavar="OUT_DIR", help="a new (or empty) directory for the model")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "export":
        from .export import export_actor

        try:
            out = export_actor(args.checkpoint, args.output_dir)
        except (CheckpointError, FileExistsError) as err:
            print(f"steadyrl export: error: {err}", file=sys.stderr)
            return 2
        print(f"Wrote the actor of {args.checkpoint} to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
