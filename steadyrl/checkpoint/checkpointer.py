"""Writing and reading the checkpoints of an on-policy run: everything it needs to continue exactly.

A checkpoint directory holds (layout.py: what is whose)::

    config.json, model.safetensors, model.safetensors.index.json, generation_config.json, tokenizer files
                              the actor (the policy) in Hugging Face format, at the top level as in a Trainer
                              checkpoint, so the directory loads as the actor (a PEFT actor: adapter_config.json,
                              adapter_model.safetensors); under actor/ in checkpoints of earlier versions
    optimizer.pt              optimizer state_dict (tensors and numbers only: loaded with weights_only=True);
                              under DeepSpeed ZeRO or FSDP2, optimizer_<rank>.pt: each process's partition or
                              shard, as plain tensors
    scheduler.pt              LR scheduler state_dict (same)
    scaler.pt                 with fp16 mixed precision: the loss scaler's scale and growth tracker (under
                              DeepSpeed, its loss scaler's numbers are in optimizer_<rank>.pt)
    critic/, critic_optimizer.pt, critic_scheduler.pt    the same for PPO's critic
    reference/                with sync_ref_model only: the reference model in Hugging Face format (config,
                              model.safetensors), which then changes during the run; without it the reference is fixed
    trainer_state.json        transformers TrainerState: global_step, log_history, ...
    steadyrl_state.json       the run fingerprint and every part registered as the same on every process (prompt
                              sampler position, rollout count, algorithm state), under its name
    settings.json             the settings a resume may change (logging, saving, max_steps, ...): changes are logged
    <part>_<rank>.json        per process, every part registered as each process's own: rng_state (Python / NumPy /
                              torch RNG), rollout_buffer (its share of the rollout being trained on; its tensors in
                              rollout_buffer_<rank>.safetensors), pending_metrics, meter, rollouts_ahead
    manifest.json             size and sha256 of every file above; written last

Nothing is unpickled on load: safetensors, JSON, and ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel, TrainerState
from transformers.utils import logging

from ..distributed.fsdp import is_sharded
from ..distributed.optimizer_reshard import ReshardError, resharded_state
from ..distributed.optimizer_state import is_partitioned, load_optimizer_state, optimizer_state
from ..distributed.processes import failed_processes, on_every_process, on_main_process
from ..distributed.sharded_loading import load_split_weights, unloaded
from ..distributed.zero import is_partitioned as is_partitioned_model
from ..models.peft import is_distributed_weights, is_peft, load_distributed_adapter
from ..rng import RNGState
from . import CheckpointError, begin_checkpoint, commit_checkpoint, newest_intact_checkpoint, rotate_checkpoints
from .fingerprint import check_resumable
from .health import CHECKED_KEY, refuse_nonfinite_state, refuse_nonfinite_weights
from .layout import ACTOR, index_single_file, model_dir, save_dir, weight_files
from .save_failure import save_failure_message
from .state_registry import Stateful, StateRegistry, saved_processes
from .weight_names import saved_names, to_live_names

logger = logging.get_logger(__name__)

STATE_NAME = "steadyrl_state.json"
SCALER_NAME = "scaler.pt"  # fp16 loss scaler state, as transformers' Trainer names it
SETTINGS_NAME = "settings.json"  # the settings a resume may change, to log what it changed
STATE_FORMAT = 5  # 4: the loop state as registered parts; 5: the rollout buffer holds the whole rollout
READABLE_FORMATS = (4, 5)
RESTORED_TRAINER_STATE = ("global_step", "epoch", "log_history", "total_flos", "num_input_tokens_seen")


@dataclass
class TrainedModule:
    """A model the run trains: ``name`` ("actor", "critic") places it in a checkpoint (layout.py: the actor at the
    top level, any other under ``name/``)."""

    name: str
    engine: torch.nn.Module  # as prepared by accelerate (DDP module / DeepSpeed engine): what the loss calls
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    model: PreTrainedModel  # the Hugging Face model inside, whose weights the checkpoint holds
    save: Callable[[Path], None]  # writes the weights in Hugging Face format (every process calls it)

    @property
    def optimizer_file(self) -> str:
        """``optimizer.pt`` for the actor (Trainer's name), ``<name>_optimizer.pt`` for the others."""
        return "optimizer.pt" if self.name == ACTOR else f"{self.name}_optimizer.pt"

    @property
    def scheduler_file(self) -> str:
        return "scheduler.pt" if self.name == ACTOR else f"{self.name}_scheduler.pt"


@dataclass
class ModelWeights:
    """A model whose weights change during the run without an optimizer of its own (the reference under
    ``sync_ref_model``): ``name`` is its directory in a checkpoint."""

    name: str
    model: torch.nn.Module  # the Hugging Face model (inside its DeepSpeed engine under ZeRO-3)
    save: Callable[[Path], None]  # writes the weights in Hugging Face format (every process calls it)


@dataclass
class CheckpointContents:
    """What a checkpoint saves, and what loading one restores in place."""

    modules: list[TrainedModule]
    trainer_state: TrainerState
    fingerprint: dict  # what a resumed run must share with the run that wrote the checkpoint (fingerprint.py)
    free_settings: dict  # settings a resumed run may change; changes are logged
    weights: list[ModelWeights] = field(default_factory=list)
    scaler: torch.amp.GradScaler | None = None  # accelerate's fp16 loss scaler (not DeepSpeed's: zero.py holds it)


def rank_file(name: str, rank: int) -> str:
    """``optimizer.pt`` -> ``optimizer_<rank>.pt``: a file each process writes for itself."""
    stem, suffix = os.path.splitext(name)
    return f"{stem}_{rank}{suffix}"


class Checkpointer:
    """Writes and reads checkpoints for one process of a run. Every process calls ``save`` and ``load``
    together: the main process writes the shared files, each process its own.

    Besides the models and optimizers (``CheckpointContents``), a checkpoint holds every part registered with
    ``register``; the RNG is one, registered here and restored last (``restore_rng``)."""

    def __init__(self, accelerator) -> None:
        self.accelerator = accelerator
        self.rank = accelerator.process_index
        self.main = accelerator.is_main_process
        self.parts = StateRegistry()
        self.register("rng_state", RNGState(), per_process=True, restore_last=True)

    def register(
        self, name: str, part: Stateful, *, per_process: bool = False, restore_last: bool = False, optional=False
    ) -> None:
        """Keep ``part`` in every checkpoint under ``name``: the same on every process, or (``per_process``) each
        process's own. A resume restores it in place, in registration order (``optional``: a part that checkpoints of
        older versions lack, left as it is there)."""
        self.parts.register(name, part, per_process=per_process, restore_last=restore_last, optional=optional)

    def save(self, output_dir: str, step: int, contents: CheckpointContents, save_total_limit: int | None) -> Path:
        """Write ``checkpoint-<step>`` under a temporary name, commit it with its manifest, then rotate. Each stage
        (begin, write, commit) ends with every process learning whether it failed on any, so that all raise
        together and none waits for a process that gave up."""
        tmp = Path(output_dir) / f"tmp-checkpoint-{step}"
        self._save_stage(tmp, lambda: begin_checkpoint(output_dir, step) if self.main else None)
        self._save_stage(tmp, lambda: self._write(tmp, contents))
        processes = self.accelerator.num_processes  # the manifest must list every one's files
        self._save_stage(tmp, lambda: commit_checkpoint(tmp, step, processes) if self.main else None)
        on_main_process(self.accelerator, lambda: self._rotate(output_dir, step, save_total_limit))
        return Path(output_dir) / f"checkpoint-{step}"

    @staticmethod
    def _rotate(output_dir: str, step: int, save_total_limit: int | None) -> None:
        """Delete the checkpoints beyond ``save_total_limit`` (main process; its error reaches every process)."""
        try:
            deleted = rotate_checkpoints(output_dir, save_total_limit)
        except Exception as err:  # noqa: BLE001 - raised again with what still stands
            raise CheckpointError(
                f"checkpoint-{step} is complete, but deleting the checkpoints beyond save_total_limit="
                f"{save_total_limit} in {output_dir} failed ({type(err).__name__}: {err}). Fix the cause and run "
                "again with resume_from_checkpoint=True."
            ) from err
        for path in deleted:
            logger.info(f"Deleted old checkpoint {path} (save_total_limit={save_total_limit}).")

    def _save_stage(self, tmp: Path, stage: Callable[[], object]) -> None:
        """Run this process's part of one stage of a save; if it failed on any process, remove ``tmp`` and raise a
        CheckpointError on every process: the failing one with its own error, the others naming it."""
        error = None
        try:
            stage()
        except Exception as err:  # a full disk surfaces as OSError, torch's RuntimeError or safetensors' error
            error = err
        failed = failed_processes(self.accelerator, error is not None)
        if not failed:
            return

        def clean_up() -> tuple[Path | None, bool]:  # once, on the main process: the same directory for all
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                return newest_intact_checkpoint(tmp.parent), tmp.exists()
            except OSError:  # output_dir itself cannot be read: the save's own error says more
                return None, tmp.exists()

        newest, left = on_main_process(self.accelerator, clean_up)
        if self.accelerator.num_processes == 1:
            raise CheckpointError(save_failure_message(tmp, error, newest, left)) from error
        if error is not None:
            message = save_failure_message(tmp, error, newest, left)
            raise CheckpointError(f"Process {self.rank} of {self.accelerator.num_processes}: {message}") from error
        names = ", ".join(map(str, failed))
        cause = CheckpointError(f"process {names} could not write its part of it; that process's error says why")
        raise CheckpointError(save_failure_message(tmp, cause, newest, left))

    def _on_every_process(self, what: str, work: Callable[[], object]):
        """Run this process's ``work``; if it failed on any process, raise on every one (the failing ones their own
        error, the others a CheckpointError naming them)."""
        return on_every_process(self.accelerator, what, work, CheckpointError)

    def _write(self, tmp: Path, contents: CheckpointContents) -> None:
        """Every process writes its files, each checked finite first (health.py): a NaN or an infinity in any weight,
        optimizer moment or shared loop state fails the save, which then leaves no checkpoint."""
        for module in contents.modules:
            if is_partitioned(module.optimizer) or self.main:
                state = optimizer_state(module.optimizer)
                refuse_nonfinite_state(state, f"the {module.name}'s optimizer state")
                torch.save(state, tmp / self._optimizer_file(module))
            self._save_weights(tmp, module)
            if self.main:
                torch.save(module.scheduler.state_dict(), tmp / module.scheduler_file)
        for weights in contents.weights:
            self._save_weights(tmp, weights)
        if self.main:
            if contents.scaler is not None:  # the same on every process: they step on the same reduced gradients
                torch.save(contents.scaler.state_dict(), tmp / SCALER_NAME)
            contents.trainer_state.save_to_json(str(tmp / "trainer_state.json"))
            (tmp / SETTINGS_NAME).write_text(json.dumps(contents.free_settings, sort_keys=True))
            parts = self.parts.shared_states()
            refuse_nonfinite_state(parts, "the run's loop state")
            shared = {"format": STATE_FORMAT, "fingerprint": contents.fingerprint, **parts, CHECKED_KEY: True}
            (tmp / STATE_NAME).write_text(json.dumps(shared))
        self.parts.write_process_states(tmp, self.rank)

    def _save_weights(self, tmp: Path, module: TrainedModule | ModelWeights) -> None:
        """Every process: ``module.save`` into the module's place (layout.save_dir), its own share of the weights
        checked finite first; the main process then indexes the actor's weights if they are one file, for vLLM
        (layout.index_single_file)."""
        refuse_nonfinite_weights(module.model, module.name)
        module.save(save_dir(tmp, module.name))
        if self.main and module.name == ACTOR:
            index_single_file(tmp)

    def load(self, directory: Path, contents: CheckpointContents) -> None:
        """Restore the modules' weights, optimizers and schedulers, the TrainerState and every registered part in
        place, after checking the run's fingerprint. The RNG state comes separately (``restore_rng``), as the very
        last thing before training. A failure on any process raises on every one."""
        return self._on_every_process(f"Loading {directory}", lambda: self._load(directory, contents))

    def _shared_state(self, directory: Path) -> dict:
        shared = json.loads((directory / STATE_NAME).read_text())
        if shared.get("format") not in READABLE_FORMATS:
            raise CheckpointError(
                f"{directory} was written in steadyrl state format {shared.get('format')}; this version reads "
                f"format {', '.join(map(str, READABLE_FORMATS))} only: resume it with the steadyrl version that "
                "wrote it."
            )
        return shared

    def _load(self, directory: Path, contents: CheckpointContents) -> None:
        shared = self._shared_state(directory)
        settings_path = directory / SETTINGS_NAME  # absent from checkpoints of older versions
        saved_settings = json.loads(settings_path.read_text()) if settings_path.is_file() else {}
        check_resumable(shared["fingerprint"], contents.fingerprint, saved_settings, contents.free_settings, directory)
        for module in contents.modules:
            self._load_module(directory, module)
        for weights in contents.weights:
            self._load_weights(directory, weights)
        if contents.scaler is not None:
            load_scaler(contents.scaler, directory)
        state = contents.trainer_state
        restored = TrainerState.load_from_json(str(directory / "trainer_state.json"))
        for name in RESTORED_TRAINER_STATE:
            setattr(state, name, getattr(restored, name))
        self.parts.load(directory, shared, self.rank, self.accelerator.num_processes)

    def _load_module(self, directory: Path, module: TrainedModule) -> None:
        load_model_weights(module.model, model_dir(directory, module.name))
        processes = self.accelerator.num_processes
        state = read_optimizer_state(directory, module.optimizer_file, module.optimizer, self.rank, processes)
        load_optimizer_state(module.optimizer, state)
        module.scheduler.load_state_dict(torch.load(directory / module.scheduler_file, weights_only=True))

    def _optimizer_file(self, module: TrainedModule) -> str:
        """``optimizer.pt``, or this process's ``optimizer_<rank>.pt`` where each process holds its own part."""
        name = module.optimizer_file
        return rank_file(name, self.rank) if is_partitioned(module.optimizer) else name

    def _load_weights(self, directory: Path, weights: ModelWeights) -> None:
        if not model_dir(directory, weights.name).is_dir():
            raise CheckpointError(
                f"{directory} has no {weights.name}/ directory, which every checkpoint of this run holds"
            )
        load_model_weights(weights.model, model_dir(directory, weights.name))

    def restore_rng(self, directory: Path) -> None:
        self._on_every_process(f"Restoring the random state of {directory}", lambda: self._restore_rng(directory))

    def _restore_rng(self, directory: Path) -> None:
        shared = self._shared_state(directory)
        self.parts.load(directory, shared, self.rank, self.accelerator.num_processes, last=True)


def read_optimizer_state(directory: Path, name: str, optimizer, rank: int, processes: int) -> dict:
    """This process's state of ``optimizer`` from the checkpoint's file ``name`` (or each process's
    ``<name>_<rank>``): its own file where the checkpoint has the live layout (same number of processes, same engine),
    else put together from every saved process's file (``optimizer_reshard``)."""
    split, whole = is_partitioned(optimizer), directory / name
    if whole.is_file() and not split:
        return torch.load(whole, weights_only=True)
    saved = saved_processes(directory)
    if split and saved == processes and not whole.is_file():
        return torch.load(directory / rank_file(name, rank), weights_only=True)
    files = [whole] if whole.is_file() else [directory / rank_file(name, k) for k in range(saved)]
    missing = [file.name for file in files if not file.is_file()]
    if missing or not files:
        raise CheckpointError(f"{directory} lacks the optimizer state {', '.join(missing) or name}")
    states = [torch.load(file, weights_only=True, mmap=True) for file in files]  # read where needed
    try:
        return resharded_state(optimizer, states, rank)
    except ReshardError as err:
        raise CheckpointError(
            f"{directory} cannot give its optimizer state ({', '.join(f.name for f in files)}) to this run of "
            f"{processes} process{'es' if processes > 1 else ''}: {err}"
        ) from None


def load_scaler(scaler: torch.amp.GradScaler, directory: Path) -> None:
    """Continue with the fp16 loss scale the checkpoint's run had reached: restarting at the initial scale would
    skip, for overflow, steps the original run took."""
    path = directory / SCALER_NAME
    if path.is_file():
        scaler.load_state_dict(torch.load(path, weights_only=True))
    else:
        logger.warning(
            f"{directory} holds no fp16 loss scale ({SCALER_NAME}: an older steadyrl wrote it): the scale restarts "
            f"at {scaler.get_scale():g}, and steps it overflows are skipped until it settles."
        )


def load_model_weights(model: torch.nn.Module, weights_dir: Path) -> None:
    """Load exactly the weights of the model saved in ``weights_dir`` (its own safetensors files: layout.weight_files);
    any missing or unexpected tensor is an error."""
    if is_peft(model):
        from peft import set_peft_model_state_dict

        state = load_file(weights_dir / "adapter_model.safetensors")
        if is_distributed_weights(model):  # ZeRO-3 partitions or FSDP2 shards
            try:
                missing = load_distributed_adapter(model, state)
            except KeyError as err:
                raise CheckpointError(f"{weights_dir}: {err.args[0]}") from None
            if missing:
                raise CheckpointError(f"{weights_dir}: adapter tensors missing: {missing[:5]}")
            return
        result = set_peft_model_state_dict(model, state)
        if result.unexpected_keys:
            raise CheckpointError(f"{weights_dir}: adapter tensors not in the model: {result.unexpected_keys[:5]}")
        return
    files = weight_files(weights_dir)
    if not files:
        raise CheckpointError(f"{weights_dir} holds no model weights (model.safetensors or its index)")
    if is_partitioned_model(model) or is_sharded(model):  # ZeRO-3 / FSDP2: no whole copy on any process
        renamed = saved_names(model)
        missing, unexpected = load_split_weights(model, files, lambda name: renamed.get(name, name))
    else:
        state = {}
        for file in files:
            state.update(load_file(file))
        missing, unexpected = model.load_state_dict(to_live_names(state, model), strict=False)
    missing = unloaded(model, missing)
    if missing or unexpected:
        raise CheckpointError(
            f"{weights_dir} does not match the model: missing {sorted(missing)[:5]}, unexpected "
            f"{sorted(unexpected)[:5]}"
        )
