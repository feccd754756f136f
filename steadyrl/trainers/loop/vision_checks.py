"""What a run with a vision-language model's processor needs, checked before any work: conversational prompts, an
algorithm, a rollout source and a generation backend that carry images; and the image tokens kept out of sampling."""

from __future__ import annotations

from ...data.images import image_column, image_token_ids
from ...generation.vllm_images import VLLM_IMAGE_FAMILIES


def check_vision_inputs(trainer, train_dataset) -> bool:
    """Whether the run trains on images (a processor, and an image column); prompts that cannot hold images and an
    algorithm that does not take them are refused first, before any other model is loaded."""
    column = image_column(getattr(train_dataset, "column_names", None) or [])
    if trainer.processor is None or column is None:
        return False
    if not trainer.conversational:
        raise ValueError(
            f"train_dataset has an {column!r} column, so its prompts must be conversations (lists of messages), as "
            "TRL requires for images: a prompt that is a string (a chat template applied already) has nowhere to "
            "place them. Give the raw messages and let the trainer apply the chat template."
        )
    if not trainer.algorithm_class.takes_images:
        raise ValueError(
            f"{type(trainer).__name__} does not train on prompts with images yet (train_dataset has an image "
            "column): GRPOTrainer, RLOOTrainer, ReinforcePPTrainer, OnlineDPOTrainer and DistillationTrainer do "
            "(docs/vision.md)."
        )
    return True


def check_vision_run(trainer) -> None:
    """Refuse, naming the setting, what does not carry images yet (docs/vision.md lists it); tell the backend the
    image tokens it must never sample, and the processor (vLLM processes the images itself)."""
    name = type(trainer).__name__
    refused = [
        (trainer.multi_turn.rollout_func is not None, "rollout_func (it returns token ids, not image inputs)"),
        (not trainer.backend.capabilities.takes_images, f"the generation backend {type(trainer.backend).__name__}"),
    ]
    for is_set, what in refused:
        if is_set:
            raise ValueError(
                f"{name}: {what} cannot carry a vision-language model's images yet, and train_dataset has an image "
                "column. Use tools or environment_factory rather than rollout_func, and HF generate or vLLM "
                "(docs/vision.md)."
            )
    family = getattr(trainer.model.config, "model_type", "")
    if not trainer.backend.capabilities.runs_training_model and family not in VLLM_IMAGE_FAMILIES:
        raise ValueError(
            f"{name}: vLLM with images is supported for {sorted(VLLM_IMAGE_FAMILIES)} models; this model is a "
            f"{family} one, which vLLM 0.32 loads under other weight names than transformers 5 saves (its vision "
            "tower's), so its weight pushes would fail. Generate with HF generate (use_vllm=False) (docs/vllm.md)."
        )
    trainer.backend.suppressed = tuple(image_token_ids(trainer.processor, trainer.model))
    trainer.backend.processor = trainer.processor


def find_unused_vision_parameters(accelerator_args: dict, args, processor) -> dict:
    """``transformers.Trainer``'s Accelerator arguments, with DDP finding unused parameters for a vision-language
    model: a vision tower often holds parameters the language model never reads (CLIP's ``post_layernorm``, SigLIP's
    pooling head), and DDP fails on them otherwise. transformers turns the search off under gradient checkpointing,
    which its reentrant form cannot take; steadyrl's default, non-reentrant, can. The user's
    ``ddp_find_unused_parameters`` wins."""
    if processor is None or args.ddp_find_unused_parameters is not None:
        return accelerator_args
    if args.gradient_checkpointing and (args.gradient_checkpointing_kwargs or {}).get("use_reentrant", False):
        return accelerator_args
    for handler in accelerator_args.get("kwargs_handlers", []):
        if hasattr(handler, "find_unused_parameters"):
            handler.find_unused_parameters = True
    return accelerator_args
