"""Third-party messages that steadyrl's own calls provoke and that say nothing is wrong, stopped at their source.

Each entry says which call provokes the message and why it is harmless; nothing else is filtered, except vLLM's
logs, which ``quiet_vllm_logs`` turns down to errors unless the user set vLLM's logging up. Imported first by
``steadyrl/__init__.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator

import torch


def name_deepspeeds_accelerator() -> None:
    """``Trainer.__init__`` unwraps the model with accelerate, which imports DeepSpeed whenever it is installed, even
    for a run that does not use it; on a machine without CUDA, DeepSpeed's accelerator auto-detection then warns
    "Setting accelerator to CPU. If you have GPU or other accelerator, we were unable to detect it." on every
    command. Naming the CPU accelerator (``DS_ACCELERATOR=cpu``, DeepSpeed's own setting) is the conclusion its
    detection reaches anyway, without the warning; a value the user set, or a machine with CUDA, is left alone."""
    if "DS_ACCELERATOR" not in os.environ and not torch.cuda.is_available():
        os.environ["DS_ACCELERATOR"] = "cpu"


class _RotaryCacheReload(logging.Filter):
    """vLLM's layer-wise weight reload (``reload_weights``, which each weight push calls) counts the rotary
    embedding's ``cos_sin_cache`` as a weight to load; no checkpoint holds it (vLLM computes it from the config), so
    every push logs "RotaryEmbedding: Failed to load weights", and vLLM then puts the cache it computed back in place
    (``_place_kernel_tensors``): nothing is wrong. Only that record, for rotary embedding classes, is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        rotary = bool(args) and isinstance(args[0], str) and "RotaryEmbedding" in args[0]
        return not (record.msg == "%s: Failed to load weights" and rotary)


def quiet_vllm_weight_reload() -> None:
    """Drop vLLM's harmless rotary-cache warning on each weight push (``_RotaryCacheReload``); idempotent."""
    target = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _RotaryCacheReload) for f in target.filters):
        target.addFilter(_RotaryCacheReload())


VLLM_LOG_SETTINGS = ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH", "VLLM_CONFIGURE_LOGGING")


def quiet_vllm_logs() -> dict[str, str]:
    """vLLM logs about 30 INFO and WARNING lines as steadyrl starts an engine in (or talks to one from) a training
    process — its whole configuration, serving tips (LD_PRELOAD, thread binding), notes on what steadyrl chose on
    purpose (the seed, ``enforce_eager`` on CPU) — and three on every weight push: noise that buries the run's output.
    Unless the user set vLLM's logging up (any of ``VLLM_LOG_SETTINGS``), vLLM then logs errors only: the ``vllm``
    logger is set to ERROR now (vLLM logs while it is imported, before it configures itself), and the variables
    returned, set while the engine is created, make vLLM's own configuration use ERROR. ``VLLM_LOGGING_LEVEL=INFO``
    (vLLM's default) shows everything again. Call it before importing vLLM."""
    if any(name in os.environ for name in VLLM_LOG_SETTINGS):
        return {}
    logging.getLogger("vllm").setLevel(logging.ERROR)
    return {"VLLM_LOGGING_LEVEL": "ERROR"}


def quiet_vllm_kernel_scan() -> None:
    """At engine start, vLLM's kernel dispatcher (``vllm/triton_utils/dispatcher.py``) looks through the attributes of
    every imported module for Triton kernels; reading ``torch.distributed.reduce_op``, a deprecated alias it never
    uses, raises torch's FutureWarning twice. Only that message, from that module, is ignored."""
    warnings.filterwarnings(
        "ignore",
        message=r"`torch\.distributed\.reduce_op` is deprecated",
        category=FutureWarning,
        module=r"vllm\.triton_utils\.dispatcher",
    )


@contextlib.contextmanager
def no_progress_bars() -> Iterator[None]:
    """transformers' progress bars off for the block: ``save_pretrained`` draws "Writing model shards" for every model
    a checkpoint holds, noise within the training bar. transformers' switch turns huggingface_hub's bars off and on
    too, globally, so where the user chose for either (``HF_HUB_DISABLE_PROGRESS_BARS``, their ``disable_progress_bar``
    calls) the block changes nothing."""
    from huggingface_hub import constants
    from huggingface_hub.utils import are_progress_bars_disabled
    from transformers.utils import logging as hf_logging

    chosen = constants.HF_HUB_DISABLE_PROGRESS_BARS is not None or are_progress_bars_disabled()
    if chosen or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def quiet_deepspeed_collectives() -> None:
    """DeepSpeed 0.19's ZeRO-3 partitioning calls ``torch.distributed.all_gather_into_tensor`` and
    ``reduce_scatter_tensor``, which torch 2.13 deprecates with a FutureWarning at each call site (18 lines per
    ZeRO-3 run); the calls are DeepSpeed's, work as they are, and nothing in a user's setup changes them. Only those
    two messages are ignored."""
    for name in ("all_gather_into_tensor", "reduce_scatter_tensor"):
        message = rf"`torch\.distributed\.{name}` is deprecated"
        warnings.filterwarnings("ignore", message=message, category=FutureWarning)


name_deepspeeds_accelerator()
quiet_deepspeed_collectives()
quiet_vllm_kernel_scan()
