"""How the actor leaves a run: ``save_model`` and ``push_to_hub`` write the policy alone, in plain Hugging Face
format (never the critic, reference, reward model or optimizer).

``hub_strategy`` keeps its ``TrainingArguments`` meaning: ``end`` publishes when ``push_to_hub()`` (or
``save_model`` with ``push_to_hub=True``) runs; ``every_save`` also publishes the actor of every checkpoint;
``checkpoint`` adds it under ``last-checkpoint/``; ``all_checkpoints`` under ``checkpoint-<step>/``.

Publishing never stops training: a push at a checkpoint that fails for the Hub or the network (repository creation
included) is logged and the next save pushes its newer actor; a token the Hub refuses is reported once, as an error.
A failed final push raises ``HubPushError``, which says where the actor is kept and the ``steadyrl push`` command
that publishes it.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from transformers import PreTrainedModel
from transformers.trainer_utils import HubStrategy
from transformers.utils import logging

from ..checkpoint import verify_checkpoint
from ..distributed.fsdp import full_state_dict, is_sharded
from ..distributed.zero import consolidated_state_dict
from ..models.peft import gathered_adapter, is_distributed_weights, is_peft
from .export import checkpoint_actor, merges_live, save_merged_live
from .hub import (
    HubPushError,
    describe,
    final_metrics,
    hub_failure,
    hub_offline,
    model_card,
    network_errors,
    push_command,
    stage_actor,
    token_refused,
    transient,
    upload,
)

logger = logging.get_logger(__name__)


def steps_text(steps: tuple[int, ...]) -> str:
    return f"step{'s' * (len(steps) > 1)} {', '.join(map(str, steps))}"


class PublishMixin:
    """``save_model``, ``push_to_hub`` and per-checkpoint publishing for ``OnPolicyTrainer``."""

    failed_push_steps: tuple[int, ...] = ()  # checkpoint pushes that failed since the last one that succeeded
    refused_token_reported = False  # a refused token is reported once per run, not at every save
    saved_actor: tuple[Path, int] | None = None  # where save_model last wrote the actor, and at which global step

    def save_actor(self, directory: Path) -> None:
        """The actor alone, in plain Hugging Face format, with its tokenizer. Under ZeRO-3 every process must call
        it (the weights are gathered); only the main process writes."""
        self.save_pretrained_model(self.model, directory)
        saved = self.processor or self.processing_class  # a vision-language model's processor, else the tokenizer
        if saved is not None and self.accelerator.is_main_process:
            saved.save_pretrained(directory)

    def save_pretrained_model(self, model: PreTrainedModel, directory: Path) -> None:
        """``model.save_pretrained`` on the main process; under ZeRO-3 or FSDP2 with the weights gathered from every
        one (of a PEFT model, its adapter only)."""
        main = self.accelerator.is_main_process
        state = None
        if is_peft(model) and is_distributed_weights(model):  # the adapter alone is gathered, not the frozen base
            state = gathered_adapter(model, main)
        elif self.zero3:
            state = consolidated_state_dict(model, main)
        elif is_sharded(model):
            state = full_state_dict(model, everywhere=False)
        if main:
            model.save_pretrained(directory, state_dict=state, safe_serialization=True)

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        if not (self.is_deepspeed_enabled or self.fsdp_version):
            return super().save_model(output_dir, _internal_call)
        directory = Path(output_dir or self.args.output_dir)
        self.save_actor(directory)  # every process: ZeRO-3 and FSDP2 gather the weights
        self.saved_actor = (directory, self.state.global_step)
        self.accelerator.wait_for_everyone()
        if self.args.push_to_hub and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=self.args.hub_revision)

    def _save(self, output_dir: str | None = None, state_dict=None) -> None:
        """``save_model``: the actor and tokenizer only, in plain Hugging Face format (no pickled arguments)."""
        directory = Path(output_dir or self.args.output_dir)
        self.save_actor(directory)
        self.saved_actor = (directory, self.state.global_step)

    # ---- the Hub ---------------------------------------------------------------------------------

    def repo_name(self) -> str:
        """The repository to push to: ``hub_model_id``, else the output directory's name (as ``Trainer`` names it)."""
        return self.args.hub_model_id or Path(self.args.output_dir).absolute().name

    def init_hf_repo(self, token: str | None = None) -> None:
        """Create the repository (main process) as ``Trainer`` does when ``push_to_hub=True``, which checks the Hub
        and the token before any work: a Hub that cannot be reached, or that refuses the token, raises
        ``HubPushError`` at once; one that is busy (5xx, 429) is created by the first push. With
        ``HF_HUB_OFFLINE`` set nothing is sent, and pushes are skipped."""
        args = self.args
        self.hub_model_id = self.repo_name()
        if not self.is_world_process_zero():
            return
        if hub_offline():
            logger.warning(
                "push_to_hub=True, but HF_HUB_OFFLINE is set: training goes on without publishing; publish the actor "
                f"later with: steadyrl push {args.output_dir}/checkpoint-<step> {self.hub_model_id}"
            )
            return
        from huggingface_hub import HfApi

        api = HfApi(token=token or args.hub_token)
        try:
            self.hub_model_id = api.create_repo(self.hub_model_id, private=args.hub_private_repo, exist_ok=True).repo_id
        except network_errors() as err:
            if not transient(err):
                raise HubPushError(
                    f"push_to_hub=True, but {hub_failure(err)} (creating the repository {self.hub_model_id!r}). "
                    "Fix the network, HF_ENDPOINT or the token (hub_token, HF_TOKEN or `hf auth login`); or set "
                    "HF_HUB_OFFLINE=1 (or push_to_hub=False) to train now and publish later with steadyrl push."
                ) from err
            logger.warning(
                f"Could not create the Hub repository {self.hub_model_id!r} now ({hub_failure(err)}); training goes "
                "on and the first push tries again."
            )

    def push_to_hub(
        self,
        commit_message: str | None = "End of training",
        blocking: bool = True,
        token: str | None = None,
        revision: str | None = None,
        **kwargs,
    ) -> str | None:
        """Publish the live actor (with ``hub_push_merged``, a LoRA actor merged into its base) and a model card;
        return the commit URL on the main process. Every process must call it: under ZeRO-3 the weights are
        gathered. A Hub or network failure raises ``HubPushError`` on the main process."""
        revision = revision or self.args.hub_revision
        if self.hub_model_id is None:  # push_to_hub=False: nothing was created as the trainer was built; upload creates
            self.hub_model_id = self.repo_name()
        with tempfile.TemporaryDirectory() as tmp:
            actor = Path(tmp) / "actor"
            self.save_actor(actor)
            if not self.is_world_process_zero():
                return None
            if hub_offline():
                kept = self.keep_actor(actor)
                command = push_command(
                    kept, self.hub_model_id, self.args.hub_push_merged, self.args.hub_private_repo, revision
                )
                logger.warning(
                    f"HF_HUB_OFFLINE is set: the actor is not pushed. It is in {kept}; publish it with: {command}"
                )
                return None
            try:
                return self.publish_actor(actor, commit_message or "End of training", token=token, revision=revision)
            except network_errors() as err:
                raise HubPushError(self.final_push_failure(err, actor, revision)) from err

    def final_push_failure(self, err: Exception, actor: Path, revision: str | None) -> str:
        """What failed, where the actor is kept (save_model's directory, or ``output_dir/actor-step-<N>``) and the
        command that publishes it from there."""
        args, repo = self.args, self.hub_model_id
        failure = f"Could not push the actor to the Hub repository {repo!r} ({describe(err)})."
        try:
            kept = self.keep_actor(actor)
        except OSError as keep_err:
            return (
                f"{failure} Keeping it locally failed too ({describe(keep_err)}): save it with "
                f"trainer.save_model(<directory>), then publish it with: steadyrl push <directory> {repo}"
            )
        command = push_command(kept, repo, args.hub_push_merged, args.hub_private_repo, revision)
        return f"{failure} The actor is saved locally in {kept}; once the Hub is reachable, publish it with: {command}"

    def keep_actor(self, actor: Path) -> Path:
        """A lasting directory with the actor of ``actor`` (a temporary directory): where ``save_model`` wrote it
        at this step, or else ``output_dir/actor-step-<N>``, replacing one an earlier failed push left there."""
        step = self.state.global_step
        if self.saved_actor is not None and self.saved_actor[1] == step and self.saved_actor[0].is_dir():
            return self.saved_actor[0].absolute()
        kept = Path(self.args.output_dir) / f"actor-step-{step}"
        shutil.rmtree(kept, ignore_errors=True)
        shutil.move(actor, kept)
        return kept.absolute()

    def publish_actor(
        self,
        actor_dir: Path,
        message: str,
        path_in_repo: str | None = None,
        token=None,
        revision=None,
        files: list[str] | None = None,
    ):
        """Commit the actor saved in ``actor_dir`` (of the live model at this step) with its card: ``files`` there (a
        checkpoint's actor files), by default every regular file. ``upload`` creates the repository first if the
        trainer could not. Raises what the Hub or the network raised."""
        args = self.args
        with tempfile.TemporaryDirectory() as tmp:
            staged = Path(tmp) / "staged"
            live = merges_live(self.model) and not is_distributed_weights(self.model)  # main process only: no gather
            if args.hub_push_merged and live and (actor_dir / "adapter_config.json").is_file():
                save_merged_live(self.model, actor_dir, staged, files)  # no second base model loaded, no RNG drawn
            else:  # under ZeRO-3 / FSDP2 a merged push loads the base again on the main process and merges there
                stage_actor(actor_dir, staged, args.hub_push_merged, files)
            (staged / "README.md").write_text(self.model_card())
            return upload(staged, self.hub_model_id, token or args.hub_token, message, path_in_repo, revision)

    def push_checkpoint(self, checkpoint: Path, step: int) -> None:
        """After ``checkpoint`` (of global step ``step``) is complete: publish its actor as ``hub_strategy`` asks
        (main process). A Hub or network failure (creating the repository included) is reported and the next save
        pushes again: training goes on, and the main process reaches the barrier the others wait at. Any other error
        propagates."""
        args = self.args
        if not args.push_to_hub or args.hub_strategy == HubStrategy.END or not self.is_world_process_zero():
            return
        if hub_offline():
            return
        try:
            self.publish_checkpoint(checkpoint, step)
        except network_errors() as err:
            self.report_failed_push(err, checkpoint, step)
            return
        repo = self.hub_model_id
        if self.failed_push_steps:
            logger.warning(
                f"Hub push recovered: {steps_text(self.failed_push_steps)} failed, step {step} pushed to "
                f"{repo!r}, superseding the failed one(s)."
            )
            self.failed_push_steps = ()

    def report_failed_push(self, err: Exception, checkpoint: Path, step: int) -> None:
        """A refused token: one error, the first time (every later push fails the same way until it is fixed). Any
        other failure: a warning per save, naming the step and the cause."""
        args, repo = self.args, self.hub_model_id
        command = push_command(checkpoint.absolute(), repo, args.hub_push_merged, revision=args.hub_revision)
        earlier = f" Earlier failed pushes: {steps_text(self.failed_push_steps)}." if self.failed_push_steps else ""
        self.failed_push_steps += (step,)
        if not token_refused(err):
            logger.warning(
                f"Could not push the actor of step {step} to the Hub repository {repo!r} ({describe(err)}). Training "
                f"goes on; the next save pushes its newer actor.{earlier} To publish this one by hand: {command}"
            )
        elif not self.refused_token_reported:
            self.refused_token_reported = True
            logger.error(
                f"Could not push the actor of step {step} to the Hub repository {repo!r}: {hub_failure(err)}. "
                "Training goes on, and each save tries again, but no checkpoint reaches the Hub until the token can "
                f"write to {repo!r} (hub_token, HF_TOKEN or `hf auth login`); this is reported once. Publish a "
                f"checkpoint afterwards with: {command}"
            )

    def publish_checkpoint(self, checkpoint: Path, step: int) -> None:
        """The actor's files of ``checkpoint`` (as its manifest lists them: never its optimizer or state files) at the
        repository's root, and with ``hub_strategy`` checkpoint / all_checkpoints under its folder too."""
        args = self.args
        message = f"Training in progress, step {step}"
        actor, files = checkpoint_actor(checkpoint, verify_checkpoint(checkpoint, hashes=False))
        self.publish_actor(actor, message, revision=args.hub_revision, files=files)
        folder = {HubStrategy.CHECKPOINT: "last-checkpoint", HubStrategy.ALL_CHECKPOINTS: checkpoint.name}
        if args.hub_strategy in folder:
            self.publish_actor(actor, message, folder[args.hub_strategy], revision=args.hub_revision, files=files)

    def model_card(self) -> str:
        dataset = getattr(getattr(self.train_dataset, "info", None), "dataset_name", None)
        metrics = final_metrics(self.state.log_history)
        return model_card(
            self.hub_model_id, self.base_model_name, self.algorithm_name, dataset, self.state.global_step, metrics
        )
