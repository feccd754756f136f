"""Build a trainer from the toy model's path under ``accelerate launch`` and report, as JSON from the main process,
how each of its models is held (``partitioned`` under ZeRO-3, ``sharded`` under FSDP2, else ``whole``), the largest
number of weight elements any one process holds of each, and the run's fingerprint.

    accelerate launch --config_file <zero3|fsdp2>.yaml tests/support/build_check.py OUT ALGO [reward_model] [reload]

With ``reload`` the toy model's weights are loaded again into the built actor as a resume loads a checkpoint's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from steadyrl import PPOConfig, PPOTrainer, RLOOConfig, RLOOTrainer
from steadyrl.distributed.sharded_loading import on_main_only
from steadyrl.toy import letters_reward, toy_dataset, toy_model_path, toy_reward_model_path


def local_elements(model: torch.nn.Module) -> int:
    """The weight elements this process holds of ``model``: its partitions or shards, else every tensor."""
    total = 0
    for param in model.parameters():
        if hasattr(param, "ds_tensor"):
            total += param.ds_tensor.numel()
        elif hasattr(param, "to_local"):
            total += param.to_local().numel()
        else:
            total += param.numel()
    return total


def held(model: torch.nn.Module) -> str:
    if on_main_only(model):
        return "on main only"
    if any(hasattr(p, "ds_id") for p in model.parameters()):
        return "partitioned"
    if any(hasattr(p, "to_local") for p in model.parameters()):
        return "sharded"
    return "whole"


def addresses(model: torch.nn.Module) -> dict[str, int]:
    return {name: p.data_ptr() for name, p in model.named_parameters()}


def record_loaded_actor() -> dict:
    """Record the addresses of the actor's weights as ``load_policy`` returns it (filled in as the trainer loads)."""
    from steadyrl.trainers.loop import on_policy

    loaded, load_policy = {}, on_policy.load_policy

    def recorded(*args, **kwargs):
        model, tokenizer = load_policy(*args, **kwargs)
        loaded["addresses"] = addresses(model)
        return model, tokenizer

    on_policy.load_policy = recorded
    return loaded


def reload_actor(model: torch.nn.Module) -> dict:
    """Load the toy model's weights again into the built actor as a resume does, and report the most parameter
    elements gathered whole at once under ZeRO-3 and the weight digest afterwards."""
    import deepspeed

    from steadyrl.checkpoint.checkpointer import load_model_weights
    from steadyrl.checkpoint.fingerprint import weights_digest

    largest, original = [0], deepspeed.zero.GatheredParameters

    class Recorded(original):
        def __init__(self, params, *args, **kwargs):
            params = [params] if isinstance(params, torch.nn.Parameter) else list(params)
            largest[0] = max(largest[0], sum(getattr(p, "ds_numel", 0) for p in params))
            super().__init__(params, *args, **kwargs)

    deepspeed.zero.GatheredParameters = Recorded
    try:
        load_model_weights(model, Path(toy_model_path()))
    finally:
        deepspeed.zero.GatheredParameters = original
    return {"largest_gathered": largest[0], "weights": weights_digest(model)}


def main(out: str, algorithm: str, with_reward_model: bool, reload_weights: bool = False) -> None:
    config, trainer_class = (PPOConfig, PPOTrainer) if algorithm == "ppo" else (RLOOConfig, RLOOTrainer)
    args = config(
        output_dir=str(Path(out).parent / "run"),
        rollout_batch_size=4,
        n_samples_per_prompt=2,
        micro_rollout_batch_size=4,
        train_batch_size=4,
        micro_train_batch_size=1,
        max_completion_length=8,
        beta=0.05,
        seed=0,
        report_to="none",
        disable_tqdm=True,
        save_strategy="no",
        max_steps=1,
    )
    reward = {"reward_model": toy_reward_model_path()} if with_reward_model else {}
    loaded = record_loaded_actor()
    trainer = trainer_class(toy_model_path(), [letters_reward], args, toy_dataset(), **reward)
    models = {"actor": trainer.model, "reference": trainer.ref_model}
    if trainer.reward_model is not None:
        models["reward_model"] = trainer.reward_model
    if algorithm == "ppo":
        models["critic"] = trainer.critic.model
    models = {name: getattr(model, "module", model) for name, model in models.items()}
    moved = torch.tensor([float(loaded["addresses"] != addresses(trainer.model))])
    moved = trainer.accelerator.reduce(moved, "max").item()
    sizes = torch.tensor([local_elements(model) for model in models.values()], dtype=torch.float64)
    largest = trainer.accelerator.reduce(sizes, "max").tolist()
    reload = reload_actor(trainer.model) if reload_weights else None
    if trainer.accelerator.is_main_process:
        report = {
            name: {
                "held": held(model),
                "local_elements": int(size),
                "whole_elements": int(
                    sum(p.ds_numel if hasattr(p, "ds_numel") else p.numel() for p in model.parameters())
                ),
            }
            for (name, model), size in zip(models.items(), largest)
        }
        report["identity"] = trainer.identity
        report["actor_copied_after_load"] = bool(moved)
        report["reload"] = reload
        Path(out).write_text(json.dumps(report, default=str))
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "reward_model" in sys.argv[3:], "reload" in sys.argv[3:])
    # The report is written and the process group destroyed; interpreter teardown is skipped, as in toy_run.py: on
    # gloo it rarely aborts a finished process ("terminate called without an active exception"), failing the launch.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
