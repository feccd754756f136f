"""A vision-language model's prompt rows as vLLM takes them, and vLLM's Qwen2-VL family run without torchvision.

Prompt rows: the processor has expanded each image's placeholder into its feature tokens (Qwen: N x
``<|image_pad|>``); vLLM 0.32 applies its own expansion to the token ids it is given (its prompt updates replace
each placeholder token, vllm/multimodal/processing/processor.py ``_apply_prompt_updates``), so each run of an image
token is sent as one, with the row's images (the dataset's, as PIL images) as ``multi_modal_data``. vLLM takes
images, or an image's embeddings, but not the processor's pixel tensors (``Qwen2VLMultiModalDataParser``): it
processes the images again, with the trainer's processor saved beside the engine's config, and the ids it expanded
are checked equal to the trainer's (``check_expanded``). Image tokens are never sampled (``suppression``), as HF
generate suppresses them: a sampled one would stand for no image features.

Without torchvision, which this project does not install, vLLM cannot load the Qwen2-VL family: its model module
imports ``smart_resize`` from transformers' torchvision image processor (vllm/model_executor/models/qwen2_vl.py,
line 43), and it builds the HF processor class with its video processor, which transformers builds only with
torchvision. ``without_torchvision`` points that import at transformers' PIL image processor module (the same
``smart_resize``) and registers the architectures, by their classes (vLLM inspects a model registered by name in a
subprocess, without the stand-in), with an image-only processor (no video inputs); it does nothing where torchvision
is installed.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import sys
import types

from .. import compat

# transformers' torchvision image processor that vLLM's Qwen2-VL module imports (smart_resize), and its PIL twin,
# which defines the same functions
QWEN2_VL = "transformers.models.qwen2_vl."
PIL_TWINS = {QWEN2_VL + "image_processing_qwen2_vl": QWEN2_VL + "image_processing_pil_qwen2_vl"}
VLLM_IMAGE_FAMILIES = frozenset({"qwen2_vl", "qwen2_5_vl"})  # checked with vLLM 0.32: log-probs within 5e-7
NEVER = -100.0  # the lowest logit bias vLLM takes: the token's probability is ~e^-100 of the others'


def merge_image_runs(ids: list[int], image_ids: tuple[int, ...]) -> list[int]:
    """``ids`` with each run of one image token given once (the placeholder vLLM expands)."""
    merged: list[int] = []
    for token in ids:
        if not (token in image_ids and merged and merged[-1] == token):
            merged.append(token)
    return merged


def engine_prompt(ids: list[int], images: list, image_ids: tuple[int, ...]) -> dict:
    """vLLM's ``TokensPrompt`` (a dict) for one prompt row with its ``images``."""
    prompt = {"prompt_token_ids": merge_image_runs(ids, image_ids)}
    if images:
        prompt["multi_modal_data"] = {"image": images if len(images) > 1 else images[0]}
    return prompt


def check_expanded(expected: list[int], expanded: list[int], where: str) -> None:
    """Refuse a row whose image tokens vLLM expanded otherwise than the trainer's processor: its image features
    would not be the ones the trainer scores."""
    if list(expanded) != list(expected):
        raise RuntimeError(
            f"{where} expanded a prompt's image tokens into {len(expanded)} token ids, and the trainer's processor "
            f"into {len(expected)}: vLLM processed the images with other settings than the trainer's processor "
            "(its image processor's size, min_pixels or max_pixels). Serve the model with the trainer's processor "
            "saved in its directory (processor.save_pretrained)."
        )


def suppression(token_ids: tuple[int, ...]) -> dict[int, float]:
    """vLLM's ``logit_bias`` that keeps ``token_ids`` from being sampled."""
    return {int(token): NEVER for token in token_ids}


def data_url(image) -> str:
    """A PIL image as a PNG data URL (lossless: the server decodes the same pixels)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def has_torchvision() -> bool:
    return importlib.util.find_spec("torchvision") is not None


def without_torchvision() -> None:
    """Make vLLM's Qwen2-VL and Qwen2.5-VL loadable here (the module docstring says how); idempotent, and nothing
    where torchvision is installed. Call it before vLLM loads the model, in every process of the engine."""
    if has_torchvision() or all(name in sys.modules for name in PIL_TWINS):
        return
    compat.require_tested("vllm")
    for name, twin in PIL_TWINS.items():
        sys.modules[name] = pil_stand_in(name, importlib.import_module(twin))
    register_image_only()


def pil_stand_in(name: str, pil: types.ModuleType) -> types.ModuleType:
    """A module ``name`` with the contents of its PIL twin ``pil``, each ``XPil`` class also as ``X``."""
    stand_in = types.ModuleType(name, f"{pil.__name__} under the name {name}, which needs torchvision (steadyrl).")
    public = {key: value for key, value in vars(pil).items() if not key.startswith("__")}
    public.update({key.removesuffix("Pil"): value for key, value in public.items() if key.endswith("Pil")})
    vars(stand_in).update(public)
    return stand_in


def image_only_processor(processor_class):
    """``processor_class`` (a Qwen-VL processor) built without its video processor."""

    class ImageOnly(processor_class):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super(processor_class, self).__init__(image_processor, tokenizer, chat_template=chat_template)
            self.image_token, self.video_token = "<|image_pad|>", "<|video_pad|>"
            self.image_token_id = tokenizer.convert_tokens_to_ids(self.image_token)
            self.video_token_id = tokenizer.convert_tokens_to_ids(self.video_token)

    ImageOnly.__name__ = ImageOnly.__qualname__ = f"ImageOnly{processor_class.__name__}"
    return ImageOnly


def register_image_only() -> None:
    """Register vLLM's Qwen2-VL and Qwen2.5-VL under their architecture names with an image-only processor."""
    from transformers import Qwen2_5_VLProcessor, Qwen2VLProcessor
    from vllm import ModelRegistry
    from vllm.model_executor.models import qwen2_5_vl, qwen2_vl
    from vllm.multimodal import MULTIMODAL_REGISTRY

    families = (
        (qwen2_vl, "Qwen2VL", Qwen2VLProcessor, "Qwen2VLForConditionalGeneration"),
        (qwen2_5_vl, "Qwen2_5_VL", Qwen2_5_VLProcessor, "Qwen2_5_VLForConditionalGeneration"),
    )
    for module, prefix, processor_class, architecture in families:
        processor = image_only_processor(processor_class)
        info_base = getattr(module, f"{prefix}ProcessingInfo")

        def get_hf_processor(self, _processor=processor, **kwargs):
            return self.ctx.get_hf_processor(_processor, **kwargs)

        info = type(
            f"ImageOnly{prefix}ProcessingInfo",
            (info_base,),
            {
                "get_hf_processor": get_hf_processor,
                "get_supported_mm_limits": lambda self: {"image": None},
            },
        )
        model = type(f"ImageOnly{architecture}", (getattr(module, architecture),), {})
        register = MULTIMODAL_REGISTRY.register_processor(
            getattr(module, f"{prefix}MultiModalProcessor"),
            info=info,
            dummy_inputs=getattr(module, f"{prefix}DummyInputsBuilder"),
        )
        ModelRegistry.register_model(architecture, register(model))
