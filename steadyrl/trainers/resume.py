"""Saving and restoring everything an on-policy run needs to continue exactly (invariants 3-6, 8).

A checkpoint directory holds::

    actor/                    the policy in Hugging Face format (or its PEFT adapter) + tokenizer
    optimizer.pt              optimizer state_dict (tensors and numbers only: loaded with weights_only=True);
                              under DeepSpeed ZeRO 1/2, optimizer_<rank>.pt: each process's partition
    scheduler.pt              LR scheduler state_dict (same)
    critic/, critic_optimizer.pt, critic_scheduler.pt    the same for PPO's critic
    trainer_state.json        transformers TrainerState: global_step, log_history, ...
    steadyrl_state.json       prompt sampler position, rollout count, algorithm state, run fingerprint
    rank_state_<rank>.json    per process: metrics not yet logged, whether a rollout is under way
    rollout_buffer_<rank>.*   per process: its share of the rollout being trained on, if the save fell
                              in the middle of one
    rng_state_<rank>.json     Python / NumPy / torch RNG of every process
    manifest.json             size and sha256 of every file above; written last
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list
from safetensors.torch import load_file
from transformers import TrainerState
from transformers.utils import logging

from ..checkpoint import (
    CheckpointError,
    begin_checkpoint,
    commit_checkpoint,
    find_resumable_checkpoint,
    load_rng_state,
    rotate_checkpoints,
    save_rng_state,
    verify_checkpoint,
)
from ..generation.weights import is_peft
from ..sampling import RolloutBuffer
from ..scalar_head import Critic
from ..zero import consolidated_state_dict, load_zero_state, modifiable, zero_optimizer, zero_state

logger = logging.get_logger(__name__)

STATE_NAME = "steadyrl_state.json"
STATE_FORMAT = 2


def rank_state_file(rank: int) -> str:
    return f"rank_state_{rank}.json"


def per_process(file_name: str, rank: int) -> str:
    """``optimizer.pt`` -> ``optimizer_<rank>.pt``: a file each process writes for itself."""
    stem, suffix = os.path.splitext(file_name)
    return f"{stem}_{rank}{suffix}"


TRUE_VALUES, FALSE_VALUES = {"true", "yes", "1", "latest"}, {"false", "no", "0", "none", ""}


def _tied_parameter_names(model: torch.nn.Module) -> set[str]:
    seen, tied = set(), set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.add(id(param))
    return tied


def state_files(name: str) -> tuple[str, str]:
    """Checkpoint file names of a trained module's optimizer and scheduler (the actor's keep Trainer's names)."""
    prefix = "" if name == "actor" else f"{name}_"
    return f"{prefix}optimizer.pt", f"{prefix}scheduler.pt"


def load_model_weights(model: torch.nn.Module, actor_dir: Path) -> None:
    """Load exactly the weights saved in ``actor_dir``; any missing or unexpected tensor is an error."""
    if is_peft(model):
        from peft import set_peft_model_state_dict

        state = load_file(actor_dir / "adapter_model.safetensors")
        result = set_peft_model_state_dict(model, state)
        if result.unexpected_keys:
            raise CheckpointError(f"{actor_dir}: adapter tensors not in the model: {result.unexpected_keys[:5]}")
        return
    files = sorted(actor_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{actor_dir} holds no .safetensors weights")
    state = {}
    for file in files:
        state.update(load_file(file))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing) - _tied_parameter_names(model)
    if missing or unexpected:
        raise CheckpointError(
            f"{actor_dir} does not match the actor: missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
        )


def save_failure_message(tmp: Path, err: Exception) -> str:
    """Why writing ``tmp`` failed, how much room its filesystem has left, and what still stands."""
    try:
        free = f"{shutil.disk_usage(tmp.parent).free / 2**20:.0f} MiB"
    except OSError:
        free = "unknown"
    newest = find_resumable_checkpoint(tmp.parent)
    kept = f"the newest complete checkpoint, {newest}, is intact" if newest else "no earlier checkpoint exists"
    return (
        f"Could not write the checkpoint {tmp} ({type(err).__name__}: {err}); free space on its filesystem: {free}. "
        f"The partial directory was removed and {kept}. Free some space (or point output_dir elsewhere) and run "
        "again with resume_from_checkpoint=True."
    )


class ResumeMixin:
    """Checkpoint writing and resuming for ``OnPolicyTrainer``."""

    def run_fingerprint(self) -> dict:
        """Settings a resumed run must share with the run that wrote the checkpoint (invariant 6)."""
        args = self.args
        config = self.accelerator.unwrap_model(self.model).config
        return {
            "algorithm": self.algorithm_name,
            "rollout_batch_size": args.rollout_batch_size,
            "n_samples_per_prompt": args.n_samples_per_prompt,
            "micro_rollout_batch_size": args.micro_rollout_batch_size,
            "train_batch_size": args.train_batch_size,
            "micro_train_batch_size": args.micro_train_batch_size,
            "num_ppo_epochs": args.num_ppo_epochs,
            "world_size": self.accelerator.num_processes,
            "model_type": config.model_type,
            "vocab_size": config.vocab_size,
            "hidden_size": getattr(config, "hidden_size", None),
            "num_hidden_layers": getattr(config, "num_hidden_layers", None),
            "peft": is_peft(self.model),
            "num_prompts": len(self.train_dataset),
            "trained_modules": [name for name, *_ in self.trained_modules()],
            "zero_stage": self.zero_stage,
        }

    def _hf_model(self, model: torch.nn.Module) -> torch.nn.Module:
        """The Hugging Face model inside a prepared (DDP / DeepSpeed) module or a ``Critic``."""
        model = self.accelerator.unwrap_model(model)
        return model.model if isinstance(model, Critic) else model

    def algorithm_state(self) -> dict:
        """JSON-serialisable state an algorithm keeps between rollouts (e.g. an adaptive KL coefficient)."""
        return {}

    def load_algorithm_state(self, state: dict) -> None:
        """Restore what ``algorithm_state`` returned."""

    # ---- choosing a checkpoint -------------------------------------------------------------

    def resolve_checkpoint(self, value) -> Path | None:
        """Turn ``resume_from_checkpoint`` (bool, "true"/"false", or a path) into a verified directory or None."""
        if value is None or value is False or (isinstance(value, str) and value.strip().lower() in FALSE_VALUES):
            return None
        if value is True or (isinstance(value, str) and value.strip().lower() in TRUE_VALUES):
            found = [find_resumable_checkpoint(self.args.output_dir) if self.accelerator.is_main_process else None]
            if self.accelerator.num_processes > 1:  # every process resumes from the checkpoint the main one chose
                found = broadcast_object_list(found)
            found = found[0]
            if found is None:
                logger.warning(f"No complete checkpoint in {self.args.output_dir}: starting from step 0.")
            else:
                logger.warning(f"Resuming from {found}.")
            return found
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(
                f"resume_from_checkpoint={value!r} is invalid: use True (the newest complete checkpoint in "
                "output_dir), False, or the path of a checkpoint-N directory."
            )
        path = Path(value)
        if not path.is_dir():
            raise CheckpointError(f"resume_from_checkpoint={value!r} is not a directory.")
        verify_checkpoint(path)
        return path

    # ---- saving ------------------------------------------------------------------------------

    def _save_checkpoint(self, model=None, trial=None) -> Path:
        args, step = self.args, self.state.global_step
        main = self.accelerator.is_main_process
        tmp = Path(args.output_dir) / f"tmp-checkpoint-{step}"
        try:
            if main:
                begin_checkpoint(args.output_dir, step)
            self.accelerator.wait_for_everyone()
            self._write_checkpoint_files(tmp)
            self.accelerator.wait_for_everyone()
            final = Path(args.output_dir) / f"checkpoint-{step}"
            if main:
                final = commit_checkpoint(tmp, step)
        except Exception as err:  # a full disk surfaces as OSError, torch's RuntimeError or safetensors' error
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(save_failure_message(tmp, err)) from err
        if main:
            for deleted in rotate_checkpoints(args.output_dir, args.save_total_limit):
                logger.info(f"Deleted old checkpoint {deleted} (save_total_limit={args.save_total_limit}).")
            self.push_checkpoint(final)
        self.accelerator.wait_for_everyone()
        return final

    def _write_checkpoint_files(self, tmp: Path) -> None:
        main = self.accelerator.is_main_process
        rank = self.accelerator.process_index
        for name, model, optimizer, scheduler in self.trained_modules():
            optimizer_file, scheduler_file = state_files(name)
            if zero_optimizer(optimizer) is not None:  # each process holds its own partition
                torch.save(zero_state(optimizer), tmp / per_process(optimizer_file, rank))
            elif main:
                torch.save(optimizer.state_dict(), tmp / optimizer_file)
            if name == "actor":
                self.save_actor(tmp / "actor")
            else:
                self.save_whole(self._hf_model(model), tmp / name)
            if main:
                torch.save(scheduler.state_dict(), tmp / scheduler_file)
        if main:
            self.state.save_to_json(str(tmp / "trainer_state.json"))
            loop_state = {
                "format": STATE_FORMAT,
                "fingerprint": self.run_fingerprint(),
                "sampler": self.sampler.state_dict(),
                "rollouts": self._rollouts,
                "algorithm": self.algorithm_state(),
            }
            (tmp / STATE_NAME).write_text(json.dumps(loop_state))
        # What differs between processes: each trains on its own share of the rollout and logs its own metrics.
        has_buffer = self.buffer is not None and not self.buffer.exhausted
        (tmp / rank_state_file(rank)).write_text(
            json.dumps({"pending_metrics": self._metrics, "has_buffer": has_buffer})
        )
        if has_buffer:
            self.buffer.save(tmp, rank)
        save_rng_state(tmp, rank)

    def save_actor(self, directory: Path) -> None:
        """The actor alone, in plain Hugging Face format, with its tokenizer. Under ZeRO-3 every process must call
        it (the weights are gathered); only the main process writes."""
        self.save_whole(self.accelerator.unwrap_model(self.model), directory)
        if self.processing_class is not None and self.accelerator.is_main_process:
            self.processing_class.save_pretrained(directory)

    def save_whole(self, model, directory: Path) -> None:
        """``model.save_pretrained`` on the main process; under ZeRO-3 with the weights gathered from every one."""
        main = self.accelerator.is_main_process
        state = consolidated_state_dict(model, main) if self.zero3 else None
        if main:
            model.save_pretrained(directory, state_dict=state, safe_serialization=True)

    # ---- loading -----------------------------------------------------------------------------

    def _load_checkpoint(self, directory: Path) -> None:
        """Restore weights, optimizer, scheduler, TrainerState, sampler and buffer; RNG comes last, in ``train``."""
        loop_state = json.loads((directory / STATE_NAME).read_text())
        if loop_state.get("format") != STATE_FORMAT:
            raise CheckpointError(
                f"{directory} was written in steadyrl state format {loop_state.get('format')}; this version reads "
                f"format {STATE_FORMAT}: resume it with the steadyrl version that wrote it."
            )
        saved, current = loop_state["fingerprint"], self.run_fingerprint()
        changed = {k: (saved.get(k), v) for k, v in current.items() if saved.get(k) != v}
        if changed:
            details = "; ".join(f"{k}: checkpoint {old!r}, now {new!r}" for k, (old, new) in changed.items())
            raise CheckpointError(f"cannot resume from {directory}: the run's configuration changed ({details}).")
        for name, model, optimizer, scheduler in self.trained_modules():
            with modifiable(self._hf_model(model)):
                load_model_weights(self._hf_model(model), directory / name)
            optimizer_file, scheduler_file = state_files(name)
            if zero_optimizer(optimizer) is not None:
                rank_file = directory / per_process(optimizer_file, self.accelerator.process_index)
                load_zero_state(optimizer, torch.load(rank_file, weights_only=True))
            else:
                optimizer.load_state_dict(torch.load(directory / optimizer_file, weights_only=True))
            scheduler.load_state_dict(torch.load(directory / scheduler_file, weights_only=True))
        self.load_algorithm_state(loop_state["algorithm"])
        max_steps = self.state.max_steps
        restored = TrainerState.load_from_json(str(directory / "trainer_state.json"))
        for name in ("global_step", "epoch", "log_history", "total_flos", "num_input_tokens_seen"):
            setattr(self.state, name, getattr(restored, name))
        if restored.max_steps != max_steps:
            logger.warning(f"max_steps changed from {restored.max_steps} to {max_steps} since the checkpoint.")
        self.sampler.load_state_dict(loop_state["sampler"])
        self._rollouts = loop_state["rollouts"]
        rank = self.accelerator.process_index
        if not (directory / rank_state_file(rank)).is_file():
            raise CheckpointError(f"{directory} has no state for process {rank} ({rank_state_file(rank)}).")
        rank_state = json.loads((directory / rank_state_file(rank)).read_text())
        self._metrics = {k: list(v) for k, v in rank_state["pending_metrics"].items()}
        self.buffer = RolloutBuffer.load(directory, rank) if rank_state["has_buffer"] else None

    def _restore_rng(self, directory: Path) -> None:
        rank = self.accelerator.process_index
        if not os.path.isfile(os.path.join(directory, f"rng_state_{rank}.json")):
            raise CheckpointError(f"{directory} has no RNG state for process {rank} (rng_state_{rank}.json).")
        load_rng_state(directory, rank)
