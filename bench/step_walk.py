"""Which of steadyrl's files one global step runs through, in order: a profile hook records every call into a
steadyrl function from a different file, from ``on_step_begin`` to ``on_step_end`` of one GRPO step on the toy task
(the first step: a rollout is made, then one mini-batch is trained; 2 micro-batches).

    python bench/step_walk.py [--algorithm grpo] [--all]

Prints each file entered from another file, in the order first entered, with the number of calls into it from
another file (2 micro-batches repeat the loss's) and of its functions entered that way (``--all``: every file;
default: trainers/ only), and the totals.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.toy_run import make_trainer  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

PACKAGE = Path(__file__).resolve().parents[1] / "steadyrl"


class StepWalk(TrainerCallback):
    """Records, during the first global step, each call into a steadyrl file from another file."""

    def __init__(self) -> None:
        self.entries: dict[str, set[str]] = defaultdict(set)  # file -> its functions entered from elsewhere
        self.times: dict[str, int] = defaultdict(int)  # file -> calls into it from another file
        self.order: list[str] = []
        self.done = False

    def profile(self, frame, event, arg) -> None:
        if event != "call":
            return
        callee, caller = frame.f_code.co_filename, frame.f_back.f_code.co_filename if frame.f_back else ""
        if not callee.startswith(str(PACKAGE)) or callee == caller:
            return
        name = str(Path(callee).relative_to(PACKAGE.parent))
        if name not in self.entries:
            self.order.append(name)
        self.entries[name].add(frame.f_code.co_qualname)
        self.times[name] += 1

    def on_step_begin(self, args, state, control, **kwargs):
        if not self.done:
            sys.setprofile(self.profile)

    def on_step_end(self, args, state, control, **kwargs):
        sys.setprofile(None)
        self.done = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--all", action="store_true", help="every file, not only trainers/")
    options = parser.parse_args()
    walk = StepWalk()
    with tempfile.TemporaryDirectory() as output_dir:
        make_trainer(output_dir, algorithm=options.algorithm, callbacks=[walk], max_steps=1, save_steps=1).train()
    shown = [name for name in walk.order if options.all or name.startswith("steadyrl/trainers/")]
    for name in shown:
        functions = ", ".join(sorted(walk.entries[name]))
        print(f"{name:48s} {walk.times[name]:4d} calls  {len(walk.entries[name]):2d} functions: {functions}")
    trainers = [name for name in walk.order if name.startswith("steadyrl/trainers/")]
    print(f"{len(trainers)} files in trainers/, {len(walk.order)} in all")


if __name__ == "__main__":
    main()
