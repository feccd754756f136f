"""toy_run.py's RLOO run on a streaming train_dataset: the toy prompts written to JSON-lines files and read back with
``load_dataset("json", streaming=True)``, as a subprocess that can be killed after a checkpoint.

As a script::

    python tests/support/stream_run.py OUTPUT_DIR DATA_DIR [--resume] [--kill-after-save N] [--set key=value ...]

writes ``OUTPUT_DIR/final-actor``, ``OUTPUT_DIR/log_history.json``, and appends the prompts each rollout gave this
process to ``OUTPUT_DIR/prompts-<rank>.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # toy_run
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout

from toy_run import KillAfterSave, make_trainer, parse_overrides  # noqa: E402

from steadyrl.toy import toy_dataset  # noqa: E402

NUM_PROMPTS = 6  # rollouts of 4 prompts: the second one wraps into the second epoch
NUM_FILES = 2


def write_prompt_files(data_dir: Path) -> list[str]:
    """The toy task's first ``NUM_PROMPTS`` prompts, split over ``NUM_FILES`` JSON-lines files (the stream's shards)."""
    rows = toy_dataset(num_prompts=NUM_PROMPTS).to_list()
    data_dir.mkdir(parents=True, exist_ok=True)
    files = []
    for index in range(NUM_FILES):
        path = data_dir / f"prompts-{index}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows[index::NUM_FILES]))
        files.append(str(path))
    return files


def prompt_stream(data_dir: Path):
    from datasets import load_dataset

    files = sorted(str(path) for path in data_dir.glob("prompts-*.jsonl"))
    return load_dataset("json", data_files=files, split="train", streaming=True)


def record_prompts(trainer, path: Path) -> None:
    """Append each rollout's prompts, as this process got them, to ``path``."""
    draw = trainer.prompt_draw
    next_prompts = draw.next_prompts

    def recording_next_prompts(*args):
        prompts, columns, first, indices = next_prompts(*args)
        with path.open("a") as f:
            f.write(json.dumps({"first": first, "prompts": prompts}) + "\n")
        return prompts, columns, first, indices

    draw.next_prompts = recording_next_prompts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("data_dir")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--kill-after-save", type=int)
    parser.add_argument("--set", nargs="*", default=[], help="config overrides key=value (JSON values)")
    opts = parser.parse_args()
    callbacks = [KillAfterSave(opts.kill_after_save)] if opts.kill_after_save else []
    stream = prompt_stream(Path(opts.data_dir))
    trainer = make_trainer(opts.output_dir, callbacks=callbacks, train_dataset=stream, **parse_overrides(opts.set))
    record_prompts(trainer, Path(opts.output_dir) / f"prompts-{trainer.accelerator.process_index}.jsonl")
    trainer.train(resume_from_checkpoint=True if opts.resume else None)
    trainer.save_model(os.path.join(opts.output_dir, "final-actor"))
    if trainer.is_world_process_zero():
        with open(os.path.join(opts.output_dir, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f)
    trainer.accelerator.end_training()
    logging.shutdown()  # and no interpreter teardown, as toy_run.py (gloo may abort a finished process there)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
