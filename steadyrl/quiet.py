"""Third-party messages that steadyrl's own calls provoke and that say nothing is wrong, stopped at their source.

Each entry says which call provokes the message and why it is harmless; nothing else is filtered. Imported first by
``steadyrl/__init__.py``.
"""

from __future__ import annotations

import os

import torch


def name_deepspeeds_accelerator() -> None:
    """``Trainer.__init__`` unwraps the model with accelerate, which imports DeepSpeed whenever it is installed, even
    for a run that does not use it; on a machine without CUDA, DeepSpeed's accelerator auto-detection then warns
    "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it." on every
    command. Naming the CPU accelerator (``DS_ACCELERATOR=cpu``, DeepSpeed's own setting) is the conclusion its
    detection reaches anyway, without the warning; a value the user set, or a machine with CUDA, is left alone."""
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


name_deepspeeds_accelerator()
