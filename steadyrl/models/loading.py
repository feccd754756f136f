"""The models of a run, before and around training: loading the policy and reward model, the frozen reference,
gradient checkpointing and DeepSpeed's backward pass."""

from __future__ import annotations

import logging

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, set_seed
from transformers.utils.hub import cached_files

from ..data.images import check_family, is_processor
from ..distributed.sharded_loading import load_split, on_main_only
from ..distributed.zero import check_whole, copy_model
from ..redaction import redact_secrets
from .scalar_head import RewardModelFunction, check_same_vocabulary, load_scalar_model, same_tokenizer

logger = logging.getLogger(__name__)

# a saved tokenizer has one of these; a directory with none still "loads" (an empty tokenizer built from config.json)
TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "vocab.json", "tokenizer.model")


def policy_init_kwargs(args) -> dict:
    """``from_pretrained_kwargs`` of the policy and its copies: trained weights are float32 unless asked."""
    return {"dtype": torch.float32, **from_pretrained_kwargs(args)}


def from_pretrained_kwargs(args) -> dict:
    """``model_init_kwargs`` (TRL's names: a ``dtype`` may be a string such as "bfloat16") and
    ``trust_remote_code``, for every model loaded from a path or Hub id."""
    kwargs = dict(args.model_init_kwargs or {})
    dtype = kwargs.get("dtype")
    if isinstance(dtype, str) and dtype != "auto":
        if not isinstance(getattr(torch, dtype, None), torch.dtype):
            raise ValueError(
                f"model_init_kwargs={redact_secrets(args.model_init_kwargs)!r}: dtype={dtype!r} is not a torch "
                "dtype; use e.g. 'bfloat16', 'float16', 'float32' or 'auto'."
            )
        kwargs["dtype"] = getattr(torch, dtype)
    return {**kwargs, "trust_remote_code": args.trust_remote_code}


def policy_class(path: str, args):
    """``AutoModelForImageTextToText`` for a vision-language model's path (TRL's choice), else
    ``AutoModelForCausalLM``."""
    from transformers import AutoConfig, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES as VISION

    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=args.trust_remote_code)
    except (OSError, ValueError):  # transformers' own loading says what is wrong
        return AutoModelForCausalLM
    return AutoModelForImageTextToText if config.model_type in VISION else AutoModelForCausalLM


def load_policy(model: str | PreTrainedModel, tokenizer, args):
    """The policy and its tokenizer (or a vision-language model's processor), with a pad token. From a path it is
    loaded split over the processes where the run splits it (``load_split``: partitioned under ZeRO-3, read by the
    main process only under FSDP2)."""
    if isinstance(model, str):
        model = load_split(policy_class(model, args), model, policy_init_kwargs(args), args, frozen=False)
    else:
        check_whole(model, "model")
    if tokenizer is None and policy_class(model.config._name_or_path or "", args) is not AutoModelForCausalLM:
        from transformers import AutoProcessor

        tokenizer = AutoProcessor.from_pretrained(model.config._name_or_path, trust_remote_code=args.trust_remote_code)
    if is_processor(tokenizer):
        check_family(model)
        text = tokenizer.tokenizer
        if text.pad_token_id is None:
            text.pad_token = text.eos_token
        apply_liger_layer_kernels(model, args)
        return model, tokenizer
    if tokenizer is None:
        if not model.config._name_or_path:
            raise ValueError(
                "processing_class is required: model is a model object that was not loaded from a path or Hub id, "
                "so its tokenizer cannot be found. Pass processing_class=<its tokenizer>."
            )
        tokenizer = AutoTokenizer.from_pretrained(model.config._name_or_path, trust_remote_code=args.trust_remote_code)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    check_vocabulary(model, tokenizer)
    apply_liger_layer_kernels(model, args)
    return model, tokenizer


def apply_liger_layer_kernels(model: PreTrainedModel, args) -> None:
    """``use_liger_kernel``: Liger's layer kernels (RMSNorm, RoPE, SwiGLU, ...) patched into the policy, as TRL
    does; its fused linear cross-entropy is refused, since it replaces the forward whose hidden states the chunked
    log-prob head reads. transformers raises ImportError where liger-kernel is not installed."""
    if not args.use_liger_kernel:
        return
    config = dict(args.liger_kernel_config or {})
    if config.get("fused_linear_cross_entropy"):
        raise ValueError(
            'liger_kernel_config={"fused_linear_cross_entropy": True} is not supported: it replaces the model\'s '
            "forward, whose hidden states steadyrl's chunked log-prob head reads (it never holds the [B, T, V] logits "
            "either). Leave it out: the layer kernels still apply."
        )
    from transformers.integrations.liger import apply_liger_kernel

    apply_liger_kernel(model, {**config, "fused_linear_cross_entropy": False})


LOW_PRECISION = (torch.bfloat16, torch.float16)


def mixed_precision_engine(deepspeed_config: dict | None, args) -> bool:
    """Whether DeepSpeed trains in bf16/fp16 with float32 master weights (its optimizer keeps them)."""
    if deepspeed_config is None:
        return False
    enabled = {name: deepspeed_config.get(name, {}).get("enabled", False) for name in ("bf16", "fp16")}
    return any(value is True or (value == "auto" and getattr(args, name)) for name, value in enabled.items())


def check_vocabulary(model: PreTrainedModel, tokenizer) -> None:
    rows = model.get_input_embeddings().num_embeddings
    if len(tokenizer) > rows:
        raise ValueError(
            f"processing_class has {len(tokenizer)} tokens but the model's embedding has {rows} rows, so some token "
            "ids have no embedding: use the model's own tokenizer, or model.resize_token_embeddings(len(tokenizer))."
        )


def check_master_weights(model: torch.nn.Module, name: str, args, deepspeed_config: dict | None) -> None:
    """Refuse trainable bf16/fp16 parameters without float32 master weights: an update smaller than the weight's
    resolution (1/256 of it in bf16) rounds away, so most of the run's updates would be silently lost."""
    low = sorted({str(p.dtype) for p in model.parameters() if p.requires_grad and p.dtype in LOW_PRECISION})
    if not low or args.allow_low_precision_weights or mixed_precision_engine(deepspeed_config, args):
        return
    raise ValueError(
        f"{name}'s trainable parameters are {', '.join(low)}, and nothing keeps float32 master weights: updates "
        f"smaller than a weight's {low[0]} resolution would be rounded away. Load the model in float32 "
        "(model_init_kwargs={'dtype': 'float32'}, or from_pretrained(..., dtype=torch.float32)) and set bf16=True to "
        "compute in bfloat16 under autocast; or use DeepSpeed with bf16 enabled (it keeps float32 master weights); or "
        "set allow_low_precision_weights=True to train the low-precision weights as they are."
    )


def disable_dropout(model: torch.nn.Module) -> None:
    """Set every dropout layer's probability to 0 (``disable_dropout``): the reference and the trained policy then
    give the same log-probs for the same weights."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0


def saved_tokenizer(name_or_path: str, trust_remote_code: bool, revision: str | None = None):
    """The tokenizer saved with a model, as TRL loads a reward model's: ``name_or_path`` (a path, or its config's
    ``_name_or_path``) is a directory, or a Hub id read through the HF cache or the Hub as ``from_pretrained`` reads
    it. None where it names no tokenizer: empty (a model built from a config), a directory or repository without
    tokenizer files, or a Hub that cannot be reached and a cache without them."""
    if not name_or_path:
        return None
    try:
        found = cached_files(
            name_or_path,
            list(TOKENIZER_FILES),
            revision=revision,
            _raise_exceptions_for_gated_repo=False,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
    except OSError:  # not a directory, and not a valid Hub id (a directory since removed, say)
        return None
    if not found:
        return None
    return AutoTokenizer.from_pretrained(name_or_path, revision=revision, trust_remote_code=trust_remote_code)


def reward_model_scorer(
    reward_model, reward_tokenizer, policy: PreTrainedModel, tokenizer, args, conversational: bool
) -> RewardModelFunction:
    """A reward model (path or model) as a reward function: on the policy's own token ids when it shares the
    policy's tokenizer, else on the text re-rendered with its own tokenizer and chat template. Its tokenizer is
    ``reward_tokenizer``, else the one saved with it (``saved_tokenizer`` of its path or ``config._name_or_path``,
    as TRL loads it); with neither it must have the policy's vocab_size, and is read on the policy's ids."""
    name = reward_model if isinstance(reward_model, str) else getattr(reward_model.config, "_name_or_path", "")
    if reward_tokenizer is None:
        reward_tokenizer = saved_tokenizer(name, args.trust_remote_code)
    model = load_scalar_model(reward_model, "reward_model", from_pretrained_kwargs(args), args)
    if reward_tokenizer is None or same_tokenizer(tokenizer, reward_tokenizer, conversational):
        check_same_vocabulary(model, "reward_model", policy, tokenizer, tokenizer_checked=reward_tokenizer is not None)
        if reward_tokenizer is None:
            logger.warning(
                "reward_model has no tokenizer of its own (reward_processing_class is unset, and %s): it is read on "
                "the policy's token ids, as its vocab_size is the policy's. If it was trained with another tokenizer, "
                "pass that one as reward_processing_class.",
                f"none is saved at {name!r}" if name else "it was not loaded from a path or Hub id",
            )
        reward_tokenizer = None  # the fast path: the policy's token ids as they are
    else:
        if conversational and not getattr(reward_tokenizer, "chat_template", None):
            raise ValueError(
                "reward_processing_class (the reward model's tokenizer) has no chat template, so the conversations "
                "of train_dataset cannot be rendered for it: use the reward model's own chat tokenizer."
            )
        if reward_tokenizer.pad_token_id is None:
            reward_tokenizer.pad_token = reward_tokenizer.eos_token
    return RewardModelFunction(
        model,
        tokenizer.pad_token_id,
        args.micro_rollout_batch_size,
        offload=args.ref_reward_offload,
        tokenizer=reward_tokenizer,
        chat_template_kwargs=args.chat_template_kwargs,
    )


def policy_and_reference(
    model: PreTrainedModel, peft_config, seed: int, reference: bool = True, args=None
) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The policy to train and its frozen reference: a copy of the model (split over the processes like it, see
    ``reference_copy``); no copy under PEFT (the base model with its adapters disabled is the reference) or when
    the run needs no ``reference``."""
    if peft_config is None:
        return model, reference_copy(model, args).eval().requires_grad_(False) if reference else None
    from peft import get_peft_model

    set_seed(seed)  # adapter initialisation must be reproducible; Trainer seeds only later
    return get_peft_model(model, peft_config), None


def reference_copy(model: PreTrainedModel, args) -> PreTrainedModel:
    """A copy of the policy as it starts. Under ZeRO-3 a partitioned one, made a module at a time; under FSDP2, where
    only the main process holds the policy's weights until training starts, read again from its path, sharded
    (``load_split``); else ``copy.deepcopy``."""
    if on_main_only(model):
        return load_split(AutoModelForCausalLM, model.config._name_or_path, policy_init_kwargs(args), args, frozen=True)
    return copy_model(model)


def check_deepspeed_support(deepspeed_config: dict, model: torch.nn.Module) -> int:
    """Refuse DeepSpeed settings the loop does not support; return the ZeRO stage."""
    config = deepspeed_config.get("zero_optimization", {})
    stage = int(config.get("stage", 0))
    offload = any(config.get(k, {}).get("device", "none") != "none" for k in ("offload_optimizer", "offload_param"))
    if stage == 0 or (offload and stage != 3):
        raise ValueError(
            f"DeepSpeed ZeRO stage {stage}{' with offload' if offload else ''} is not supported: use zero_stage "
            "1 or 2 without offload, zero_stage 3 with or without offload (examples/accelerate_configs/), or "
            "multi-process DDP (multi_gpu.yaml)."
        )
    bf16 = deepspeed_config.get("bf16") or {}
    if bf16.get("enabled", False) not in (False, "false") and bf16.get("check_grad_overflow", True) in (False, "false"):
        raise ValueError(
            "DeepSpeed's bf16.check_grad_overflow=false is not supported: steadyrl relies on DeepSpeed's check to "
            "skip a ZeRO step whose gradients are not finite (max_consecutive_nonfinite_steps counts it), and without "
            "it a NaN reaches the weights. Remove the setting (DeepSpeed's default is true)."
        )
    return stage


def enable_gradient_checkpointing(model: PreTrainedModel, gradient_checkpointing_kwargs: dict | None) -> None:
    """Recompute activations in the backward pass instead of keeping them (less memory, ~30% more compute)."""
    kwargs = gradient_checkpointing_kwargs or {"use_reentrant": False}
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    if hasattr(model, "enable_input_require_grads"):  # PEFT: frozen embeddings must still pass gradients on
        model.enable_input_require_grads()


def deepspeed_backward(engine, loss: torch.Tensor, boundary: bool) -> None:
    """One module's backward under DeepSpeed: the engine divides ``loss`` by its gradient_accumulation_steps
    and, at the accumulation boundary, reduces the gradients; its ``step()`` (clipping, the overflow check, the
    update) is the learner's to call, after ``on_pre_optimizer_step``. Each engine gets its own loss, since
    accelerate's ``backward`` drives only the last prepared engine."""
    engine.set_gradient_accumulation_boundary(boundary)
    engine.backward(loss)
