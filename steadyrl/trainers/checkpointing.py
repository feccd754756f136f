"""Writing and reading the checkpoints of an on-policy run: everything it needs to continue exactly.

A checkpoint directory holds::

    actor/                    the policy in Hugging Face format (or its PEFT adapter) + tokenizer
    optimizer.pt              optimizer state_dict (tensors and numbers only: loaded with weights_only=True);
                              under DeepSpeed ZeRO, optimizer_<rank>.pt: each process's partition
    scheduler.pt              LR scheduler state_dict (same)
    critic/, critic_optimizer.pt, critic_scheduler.pt    the same for PPO's critic
    trainer_state.json        transformers TrainerState: global_step, log_history, ...
    steadyrl_state.json       prompt sampler position, rollout count, algorithm state, run fingerprint
    rank_state_<rank>.json    per process: metrics not yet logged, whether a rollout is under way
    rollout_buffer_<rank>.*   per process: its share of the rollout being trained on, if the save fell
                              in the middle of one
    rng_state_<rank>.json     Python / NumPy / torch RNG of every process
    manifest.json             size and sha256 of every file above; written last

Nothing is unpickled on load: safetensors, JSON, and ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate.utils import broadcast_object_list
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel, TrainerState
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
from ..zero import load_zero_state, modifiable, zero_optimizer, zero_state

logger = logging.get_logger(__name__)

STATE_NAME = "steadyrl_state.json"
STATE_FORMAT = 3  # 3: the rollout buffer holds each reward function's scores and whether it was logged
READABLE_FORMATS = (2, 3)  # a format-2 buffer lacks those two: its completions log without per-function rewards
TRUE_VALUES, FALSE_VALUES = {"true", "yes", "1", "latest"}, {"false", "no", "0", "none", ""}
RESTORED_TRAINER_STATE = ("global_step", "epoch", "log_history", "total_flos", "num_input_tokens_seen")


@dataclass
class TrainedModule:
    """A model the run trains: ``name`` is its directory in a checkpoint ("actor", "critic")."""

    name: str
    engine: torch.nn.Module  # as prepared by accelerate (DDP module / DeepSpeed engine): what the loss calls
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    model: PreTrainedModel  # the Hugging Face model inside, whose weights the checkpoint holds
    save: Callable[[Path], None]  # writes the weights in Hugging Face format (every process calls it)

    @property
    def state_files(self) -> tuple[str, str]:
        """Optimizer and scheduler file names (the actor's keep Trainer's names)."""
        prefix = "" if self.name == "actor" else f"{self.name}_"
        return f"{prefix}optimizer.pt", f"{prefix}scheduler.pt"


@dataclass
class CheckpointContents:
    """What a checkpoint saves, and what loading one restores in place."""

    modules: list[TrainedModule]
    trainer_state: TrainerState
    loop_state: dict  # LoopState.state_dict()
    fingerprint: dict  # settings a resumed run must share with the run that wrote the checkpoint


def run_fingerprint(algorithm: str, args, model: torch.nn.Module, num_prompts: int, modules: list[str],
                    processes: int, zero_stage: int | None) -> dict:  # fmt: skip
    """Settings a resumed run must share with the run that wrote the checkpoint: the batch hierarchy, the number
    of processes, the model's shape, the dataset's size and what is trained."""
    config = model.config
    return {
        "algorithm": algorithm,
        "rollout_batch_size": args.rollout_batch_size,
        "n_samples_per_prompt": args.n_samples_per_prompt,
        "micro_rollout_batch_size": args.micro_rollout_batch_size,
        "train_batch_size": args.train_batch_size,
        "micro_train_batch_size": args.micro_train_batch_size,
        "num_ppo_epochs": args.num_ppo_epochs,
        "world_size": processes,
        "model_type": config.model_type,
        "vocab_size": config.vocab_size,
        "hidden_size": getattr(config, "hidden_size", None),
        "num_hidden_layers": getattr(config, "num_hidden_layers", None),
        "peft": is_peft(model),
        "num_prompts": num_prompts,
        "trained_modules": modules,
        "zero_stage": zero_stage,
    }


def rank_file(name: str, rank: int) -> str:
    """``optimizer.pt`` -> ``optimizer_<rank>.pt``: a file each process writes for itself."""
    stem, suffix = os.path.splitext(name)
    return f"{stem}_{rank}{suffix}"


def resolve_checkpoint(value, output_dir: str, accelerator) -> Path | None:
    """Turn ``resume_from_checkpoint`` (bool, "true"/"false", or a path) into a verified directory or None."""
    if value is None or value is False or (isinstance(value, str) and value.strip().lower() in FALSE_VALUES):
        return None
    if value is True or (isinstance(value, str) and value.strip().lower() in TRUE_VALUES):
        found = [find_resumable_checkpoint(output_dir) if accelerator.is_main_process else None]
        if accelerator.num_processes > 1:  # every process resumes from the checkpoint the main one chose
            found = broadcast_object_list(found)
        found = found[0]
        if found is None:
            logger.warning(f"No complete checkpoint in {output_dir}: starting from step 0.")
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


class Checkpointer:
    """Writes and reads checkpoints for one process of a run. Every process calls ``save`` and ``load``
    together: the main process writes the shared files, each process its own."""

    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator
        self.rank = accelerator.process_index
        self.main = accelerator.is_main_process

    def save(self, output_dir: str, step: int, contents: CheckpointContents, save_total_limit: int | None) -> Path:
        """Write ``checkpoint-<step>`` under a temporary name, commit it with its manifest, then rotate. Each stage
        (begin, write, commit) ends with every process learning whether it failed on any, so that all raise
        together and none waits for a process that gave up."""
        tmp = Path(output_dir) / f"tmp-checkpoint-{step}"
        self._save_stage(tmp, lambda: begin_checkpoint(output_dir, step) if self.main else None)
        self._save_stage(tmp, lambda: self._write(tmp, contents))
        self._save_stage(tmp, lambda: commit_checkpoint(tmp, step) if self.main else None)
        if self.main:
            for deleted in rotate_checkpoints(output_dir, save_total_limit):
                logger.info(f"Deleted old checkpoint {deleted} (save_total_limit={save_total_limit}).")
        return Path(output_dir) / f"checkpoint-{step}"

    def _save_stage(self, tmp: Path, stage: Callable[[], object]) -> None:
        """Run this process's part of one stage of a save; if it failed on any process, remove ``tmp`` and raise a
        CheckpointError on every process: the failing one with its own error, the others naming it."""
        error = None
        try:
            stage()
        except Exception as err:  # a full disk surfaces as OSError, torch's RuntimeError or safetensors' error
            error = err
        failed = self._failed_processes(error is not None)
        if not failed:
            return
        shutil.rmtree(tmp, ignore_errors=True)
        if self.accelerator.num_processes == 1:
            raise CheckpointError(save_failure_message(tmp, error)) from error
        if error is not None:
            message = save_failure_message(tmp, error)
            raise CheckpointError(f"Process {self.rank} of {self.accelerator.num_processes}: {message}") from error
        names = ", ".join(map(str, failed))
        cause = CheckpointError(f"process {names} could not write its part of it; that process's error says why")
        raise CheckpointError(save_failure_message(tmp, cause))

    def _failed_processes(self, failed: bool) -> list[int]:
        """The ranks of the processes for which ``failed`` is true, the same list on every process: an all-reduce of
        one flag per process, which also waits for all of them as a barrier would."""
        if self.accelerator.num_processes == 1:
            return [self.rank] if failed else []
        flags = torch.zeros(self.accelerator.num_processes, device=self.accelerator.device)
        flags[self.rank] = float(failed)
        return torch.nonzero(self.accelerator.reduce(flags, "sum")).flatten().tolist()

    def _write(self, tmp: Path, contents: CheckpointContents) -> None:
        for module in contents.modules:
            optimizer_file, scheduler_file = module.state_files
            if zero_optimizer(module.optimizer) is not None:  # each process holds its own partition
                torch.save(zero_state(module.optimizer), tmp / rank_file(optimizer_file, self.rank))
            elif self.main:
                torch.save(module.optimizer.state_dict(), tmp / optimizer_file)
            module.save(tmp / module.name)
            if self.main:
                torch.save(module.scheduler.state_dict(), tmp / scheduler_file)
        loop = contents.loop_state
        if self.main:
            contents.trainer_state.save_to_json(str(tmp / "trainer_state.json"))
            shared = {"format": STATE_FORMAT, "fingerprint": contents.fingerprint}
            shared.update({key: loop[key] for key in ("sampler", "rollouts", "algorithm")})
            (tmp / STATE_NAME).write_text(json.dumps(shared))
        # What differs between processes: each trains on its own share of the rollout and logs its own metrics.
        buffer = loop["buffer"]
        rank_state = {"pending_metrics": loop["pending_metrics"], "has_buffer": buffer is not None}
        (tmp / rank_file("rank_state.json", self.rank)).write_text(json.dumps(rank_state))
        if buffer is not None:
            tensors = {name: value.contiguous() for name, value in buffer["rollout"].items()}
            save_file(tensors, tmp / self._buffer_file(".safetensors"))
            meta = {key: buffer[key] for key in ("schedule", "cursor", "metrics", "completions_logged")}
            (tmp / self._buffer_file(".json")).write_text(json.dumps(meta))
        save_rng_state(tmp, self.rank)

    def _buffer_file(self, suffix: str) -> str:
        return f"rollout_buffer_{self.rank}{suffix}"

    def load(self, directory: Path, contents: CheckpointContents) -> dict:
        """Restore the modules' weights, optimizers and schedulers and the TrainerState in place, after checking
        the run's fingerprint; return the loop state to hand to ``LoopState.load_state_dict``. The RNG state
        comes separately (``restore_rng``), as the very last thing before training."""
        shared = json.loads((directory / STATE_NAME).read_text())
        if shared.get("format") not in READABLE_FORMATS:
            raise CheckpointError(
                f"{directory} was written in steadyrl state format {shared.get('format')}; this version reads "
                f"formats {', '.join(map(str, READABLE_FORMATS))}: resume it with the steadyrl version that wrote it."
            )
        saved, current = shared["fingerprint"], contents.fingerprint
        changed = {k: (saved.get(k), v) for k, v in current.items() if saved.get(k) != v}
        if changed:
            details = "; ".join(f"{k}: checkpoint {old!r}, now {new!r}" for k, (old, new) in changed.items())
            raise CheckpointError(f"cannot resume from {directory}: the run's configuration changed ({details}).")
        for module in contents.modules:
            self._load_module(directory, module)
        state = contents.trainer_state
        restored = TrainerState.load_from_json(str(directory / "trainer_state.json"))
        for name in RESTORED_TRAINER_STATE:
            setattr(state, name, getattr(restored, name))
        if restored.max_steps != state.max_steps:
            logger.warning(f"max_steps changed from {restored.max_steps} to {state.max_steps} since the checkpoint.")
        rank_state_path = directory / rank_file("rank_state.json", self.rank)
        if not rank_state_path.is_file():
            raise CheckpointError(f"{directory} has no state for process {self.rank} ({rank_state_path.name}).")
        rank_state = json.loads(rank_state_path.read_text())
        buffer = None
        if rank_state["has_buffer"]:
            buffer = json.loads((directory / self._buffer_file(".json")).read_text())
            buffer["rollout"] = load_file(directory / self._buffer_file(".safetensors"))
        loop = {key: shared[key] for key in ("sampler", "rollouts", "algorithm")}
        return {**loop, "pending_metrics": rank_state["pending_metrics"], "buffer": buffer}

    def _load_module(self, directory: Path, module: TrainedModule) -> None:
        with modifiable(module.model):
            load_model_weights(module.model, directory / module.name)
        optimizer_file, scheduler_file = module.state_files
        if zero_optimizer(module.optimizer) is not None:
            state = torch.load(directory / rank_file(optimizer_file, self.rank), weights_only=True)
            load_zero_state(module.optimizer, state)
        else:
            module.optimizer.load_state_dict(torch.load(directory / optimizer_file, weights_only=True))
        module.scheduler.load_state_dict(torch.load(directory / scheduler_file, weights_only=True))

    def restore_rng(self, directory: Path) -> None:
        if not (directory / f"rng_state_{self.rank}.json").is_file():
            raise CheckpointError(f"{directory} has no RNG state for process {self.rank} (rng_state_{self.rank}.json).")
        load_rng_state(directory, self.rank)


def _tied_parameter_names(model: torch.nn.Module) -> set[str]:
    seen, tied = set(), set()
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.add(name)
        seen.add(id(param))
    return tied


def load_model_weights(model: torch.nn.Module, weights_dir: Path) -> None:
    """Load exactly the weights saved in ``weights_dir``; any missing or unexpected tensor is an error."""
    if is_peft(model):
        from peft import set_peft_model_state_dict

        state = load_file(weights_dir / "adapter_model.safetensors")
        result = set_peft_model_state_dict(model, state)
        if result.unexpected_keys:
            raise CheckpointError(f"{weights_dir}: adapter tensors not in the model: {result.unexpected_keys[:5]}")
        return
    files = sorted(weights_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{weights_dir} holds no .safetensors weights")
    state = {}
    for file in files:
        state.update(load_file(file))
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing) - _tied_parameter_names(model)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights_dir} does not match the model: missing {sorted(missing)[:5]}, unexpected "
            f"{sorted(unexpected)[:5]}"
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
